"""Saved models: ``model_spec.json`` + one state dict per calibration, and loading them.

A finished federation leaves, at the coordinator (``[federation] out_dir``) and at
every participant (``[participant] out_dir``), a directory::

    model_spec.json     how to rebuild the network (extractor, head, classifier, sizes)
    model_none.pt       the federated model with its own (fixed) classifier
    model_ffc.pt        ... with the FFC-calibrated classifier (if the run made it)
    model_ccvr.pt       ... with the CCVR-calibrated classifier (if the run made it)
    head_ffc_bias.pt    a closed-form head (FFC+bias, LDA, QDA;
    ``spherecal.spherefed.discriminant``)
    head_lda.pt         on the features of model_none.pt: ``weight``, ``bias`` and, for
    head_qda.pt         QDA, ``quadratic`` — described under ``heads`` in model_spec.json

Each ``.pt`` holds a plain state dict of tensors (``torch.save``), read back with
``torch.load(weights_only=True)`` — no code is unpickled. :func:`load_model` rebuilds
the network from the spec and loads one of them (``strict``: a file that does not fit
the spec is refused). A closed-form head is not a linear layer (QDA's logits are
quadratic in the features), so ``load_model(d, "qda")`` returns a
:class:`CalibratedNet`: the uncalibrated network whose ``forward`` scores its features
with that head.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spherecal.spherefed.discriminant import WIRE_NEVER, CalibratedHead
from spherecal.spherefed.durable import replace_durably
from spherecal.spherefed.heads import Head
from spherecal.spherefed.models import _FLEXIBLE_DIM, FeatureExtractor
from spherecal.spherefed.network import ModelSpec, Net, build_model

__all__ = [
    "CALIBRATIONS",
    "CLOSED_FORM_HEADS",
    "HEAD_FORMULA",
    "CalibratedNet",
    "SavedModelError",
    "available_calibrations",
    "head_document",
    "head_tensors",
    "load_head",
    "load_model",
    "model_spec_document",
    "save_head",
    "save_state_dict",
    "spec_from_document",
]

#: Which saved model :func:`load_model` picks when none is named: FFC (SphereFed
#: Eq. 10, the paper's method), then CCVR, then the uncalibrated one.
CALIBRATIONS: tuple[str, ...] = ("ffc", "ccvr", "none")

#: The closed-form heads (``head_<name>.pt``), loadable by name only.
CLOSED_FORM_HEADS: tuple[str, ...] = ("ffc_bias", "lda", "qda")

HEAD_FORMULA = {
    "affine": "z @ weight.T + bias",
    "quadratic": "z @ weight.T + bias - 0.5 * einsum('ni,cij,nj->nc', z, quadratic, z)",
}
"""How a saved closed-form head maps features ``z`` (N×l) to logits (N×C)."""

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
    """The calibrations saved in ``directory``: :data:`CALIBRATIONS` order, then the
    closed-form heads (:data:`CLOSED_FORM_HEADS`) that sit next to ``model_none.pt``."""
    root = Path(directory)
    linear = [c for c in CALIBRATIONS if (root / f"model_{c}.pt").is_file()]
    closed = [
        c
        for c in CLOSED_FORM_HEADS
        if (root / f"head_{c}.pt").is_file() and (root / "model_none.pt").is_file()
    ]
    return linear + closed


def head_tensors(head: CalibratedHead) -> dict[str, np.ndarray]:
    """What ``head_<name>.pt`` holds: ``weight`` C×l, ``bias`` C (a never-predicted
    class as :data:`~spherecal.spherefed.discriminant.WIRE_NEVER`), QDA's ``quadratic`` C×l×l."""
    tensors = {"weight": head.weight, "bias": head.finite_bias()}
    if head.quadratic is not None:
        tensors["quadratic"] = head.quadratic
    return tensors


def save_head(head: CalibratedHead, path: Path) -> None:
    """``head_<name>.pt`` (float64 tensors, atomic) — read by :func:`load_head`."""
    save_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in head_tensors(head).items()},
        path,
    )


def head_document(head: CalibratedHead, file_name: str) -> dict[str, Any]:
    """The ``heads.<name>`` entry of ``model_spec.json`` for a saved closed-form head."""
    return {
        "file": file_name,
        "kind": head.kind,
        "logits": HEAD_FORMULA[head.kind],
        "features": "the network's features of model_none.pt",
        "tensors": {k: list(v.shape) for k, v in head_tensors(head).items()},
        "never_predicted_bias": WIRE_NEVER,
    }


def load_head(path: Path, *, num_classes: int, feature_dim: int) -> CalibratedHead:
    """A saved closed-form head (``weights_only=True``), its shapes checked against
    the model's; raises :class:`SavedModelError` for a file that does not fit."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise SavedModelError(f"{path}: not a loadable head ({exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SavedModelError(f"{path}: expected a dict of tensors")
    keys = set(state)
    if keys not in ({"weight", "bias"}, {"weight", "bias", "quadratic"}):
        raise SavedModelError(f"{path}: expected weight, bias [, quadratic], got {sorted(keys)}")
    c, dim = num_classes, feature_dim
    wanted = {"weight": (c, dim), "bias": (c,), "quadratic": (c, dim, dim)}
    for key, tensor in state.items():
        if tuple(tensor.shape) != wanted[key]:
            raise SavedModelError(
                f"{path}: {key} has shape {list(tensor.shape)}, the model needs {list(wanted[key])}"
            )
    arrays = {k: v.detach().double().numpy().copy() for k, v in state.items()}
    if not all(np.isfinite(a).all() for a in arrays.values()):
        raise SavedModelError(f"{path}: contains NaN or Inf")
    return CalibratedHead(
        weight=arrays["weight"], bias=arrays["bias"], quadratic=arrays.get("quadratic")
    )


class CalibratedNet(Net):
    """The federated network with a closed-form head (FFC+bias, LDA, QDA) on its
    features: ``forward(x)`` returns ``head.logits(features(x))`` (float64), the very
    computation the participants' evaluation runs
    (:meth:`~spherecal.spherefed.discriminant.CalibratedHead.logits`), so predictions match the
    federation's reported accuracy. Inference only: the head is a fixed solve, not a
    trained parameter (no gradient flows through it)."""

    def __init__(self, extractor: FeatureExtractor, head: Head, closed: CalibratedHead) -> None:
        super().__init__(extractor, head)
        self.calibrated_head = closed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            z = self.features(x)
        return torch.from_numpy(self.calibrated_head.logits(z))


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
    if calibration not in (*CALIBRATIONS, *CLOSED_FORM_HEADS):
        raise SavedModelError(
            f"calibration must be one of {[*CALIBRATIONS, *CLOSED_FORM_HEADS]}, not {calibration!r}"
        )
    closed: CalibratedHead | None = None
    if calibration in CLOSED_FORM_HEADS:
        head_path = root / f"head_{calibration}.pt"
        if not head_path.is_file():
            raise SavedModelError(f"{root}: no {head_path.name} (saved: {saved or 'none'})")
        closed = load_head(
            head_path,
            num_classes=int(document["num_classes"]),
            feature_dim=int(document["feature_dim"]),
        )
        calibration = "none"  # the head scores the uncalibrated network's features
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
    except Exception as exc:  # torch raises many types for a bad file
        raise SavedModelError(f"{weights}: not a loadable state dict ({exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SavedModelError(f"{weights}: expected a dict of tensors")
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise SavedModelError(f"{weights} does not fit {spec_path}: {first}") from None
    if closed is not None:
        net = CalibratedNet(net.extractor, net.head, closed)
    net.eval()
    return net


def save_state_dict(state: Mapping[str, torch.Tensor], path: Path) -> None:
    """``torch.save`` of a dict of tensors, atomically and durably (write, fsync,
    rename, fsync of the folder).

    A failed write (a full disk) raises an :class:`OSError` that names the file and
    leaves no partial temporary file: the write through ``torch.save``'s file object
    raises one without a file name, and the coordinator's fatal line then named only
    its state directory (seen when a disk filled during a checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(dict(state), fh)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(tmp)) from exc
        raise
    replace_durably(tmp, path)
