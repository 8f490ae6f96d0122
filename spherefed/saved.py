"""Saved models: ``model_spec.json`` + one state dict per calibration, and loading them.

A finished federation leaves, at the coordinator (``[federation] out_dir``) and at
every participant (``[participant] out_dir``), a directory::

    model_spec.json     how to rebuild the network (extractor, head, classifier, sizes)
    model_none.pt       the federated model with its own (fixed) classifier
    model_ffc.pt        ... with the FFC-calibrated classifier (if the run made it)
    model_ccvr.pt       ... with the CCVR-calibrated classifier (if the run made it)

Each ``.pt`` holds a plain state dict of tensors (``torch.save``), read back with
``torch.load(weights_only=True)`` — no code is unpickled. :func:`load_model` rebuilds
the network from the spec and loads one of them (``strict``: a file that does not fit
the spec is refused).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from spherefed.models import _FLEXIBLE_DIM
from spherefed.network import ModelSpec, Net, build_model

__all__ = [
    "CALIBRATIONS",
    "SavedModelError",
    "available_calibrations",
    "load_model",
    "model_spec_document",
    "save_state_dict",
    "spec_from_document",
]

#: Which saved model :func:`load_model` picks when none is named: FFC (SphereFed
#: Eq. 10, the paper's method), then CCVR, then the uncalibrated one.
CALIBRATIONS: tuple[str, ...] = ("ffc", "ccvr", "none")

_SPEC_KEYS = (
    "extractor",
    "head",
    "norm",
    "classifier",
    "classifier_seed",
    "init_seed",
    "num_classes",
    "in_channels",
    "image_size",
    "feature_dim",
)


class SavedModelError(ValueError):
    """A model directory that cannot be loaded as written (missing or unfit files)."""


def model_spec_document(spec: ModelSpec, feature_dim: int) -> dict[str, Any]:
    """The ``model_spec.json`` document of ``spec`` (``feature_dim``: the built net's)."""
    size = spec.image_size
    hw = [size, size] if isinstance(size, int) else [int(size[0]), int(size[1])]
    return {
        "extractor": spec.extractor,
        "head": spec.head,
        "norm": spec.norm,
        "classifier": spec.classifier,
        "classifier_seed": spec.classifier_seed,
        "init_seed": spec.init_seed,
        "num_classes": spec.num_classes,
        "in_channels": spec.in_channels,
        "image_size": hw,
        "feature_dim": int(feature_dim),
    }


def spec_from_document(document: Mapping[str, Any], source: str = "model_spec.json") -> ModelSpec:
    missing = [k for k in _SPEC_KEYS if k not in document]
    if missing:
        raise SavedModelError(f"{source}: missing keys {missing}")
    size = document["image_size"]
    if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) for v in size)):
        raise SavedModelError(f"{source}: image_size must be [height, width]")
    extractor = str(document["extractor"])
    # The built-in paper models have a fixed l and refuse an explicit feature_dim;
    # flexible ones (and user factories) are asked for the recorded one.
    flexible = extractor in _FLEXIBLE_DIM or ":" in extractor
    return ModelSpec(
        extractor=extractor,
        head=str(document["head"]),
        norm=str(document["norm"]),
        classifier=str(document["classifier"]),
        classifier_seed=int(document["classifier_seed"]),
        init_seed=int(document["init_seed"]),
        num_classes=int(document["num_classes"]),
        in_channels=int(document["in_channels"]),
        image_size=(int(size[0]), int(size[1])),
        feature_dim=int(document["feature_dim"]) if flexible else None,
    )


def available_calibrations(directory: str | Path) -> list[str]:
    """The calibrations saved in ``directory`` (in :data:`CALIBRATIONS` order)."""
    root = Path(directory)
    return [c for c in CALIBRATIONS if (root / f"model_{c}.pt").is_file()]


def load_model(directory: str | Path, calibration: str | None = None) -> Net:
    """Rebuild the network saved in ``directory`` and load its weights (eval mode).

    ``calibration`` is ``"none"``, ``"ffc"`` or ``"ccvr"``; ``None`` takes the first
    saved one of :data:`CALIBRATIONS`. Raises :class:`SavedModelError` (a
    ``ValueError``) when the directory, the spec or the state dict does not fit.
    """
    root = Path(directory)
    spec_path = root / "model_spec.json"
    if not spec_path.is_file():
        raise SavedModelError(f"{root}: no model_spec.json (not a saved model directory)")
    try:
        document = json.loads(spec_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SavedModelError(f"{spec_path}: unreadable ({exc})") from None
    if not isinstance(document, dict):
        raise SavedModelError(f"{spec_path}: expected a JSON object")
    spec = spec_from_document(document, str(spec_path))
    saved = available_calibrations(root)
    if calibration is None:
        if not saved:
            raise SavedModelError(f"{root}: no model_*.pt files")
        calibration = saved[0]
    if calibration not in CALIBRATIONS:
        raise SavedModelError(
            f"calibration must be one of {list(CALIBRATIONS)}, not {calibration!r}"
        )
    weights = root / f"model_{calibration}.pt"
    if not weights.is_file():
        raise SavedModelError(f"{root}: no {weights.name} (saved: {saved or 'none'})")
    net = build_model(spec)
    if net.feature_dim != int(document["feature_dim"]):
        raise SavedModelError(
            f"{spec_path}: the rebuilt network has {net.feature_dim}-d features, the spec "
            f"says {document['feature_dim']}"
        )
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise SavedModelError(f"{weights}: not a loadable state dict ({exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SavedModelError(f"{weights}: expected a dict of tensors")
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise SavedModelError(f"{weights} does not fit {spec_path}: {first}") from None
    net.eval()
    return net


def save_state_dict(state: Mapping[str, torch.Tensor], path: Path) -> None:
    """``torch.save`` of a dict of tensors, atomically (write, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(dict(state), fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
