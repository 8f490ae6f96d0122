"""Every site gets the result: the final models, written into the participant's ``out_dir``.

The final evaluation task already hands each participant the final global model and
every calibrated classifier the run made (FFC, CCVR, ...) as :class:`pb.TensorRef` s,
downloaded through ``DownloadTensor`` and checked against the SHA-256 in the announced
header (``spherecal.proto.codec.TensorAssembler``). The participant keeps them and, once the
coordinator says the federation *completed*, writes the same directory layout the
coordinator writes (``spherecal.spherefed.saved``): ``model_spec.json`` and ``model_<name>.pt``
per linear classifier (FFC, CCVR), ``head_<name>.pt`` per closed-form head (FFC+bias,
LDA, QDA — described under ``heads`` in ``model_spec.json``, loaded by
``spherefed.load_model(d, name)``), plus ``models.json`` recording which federation
they came from and the SHA-256 of every tensor and file. Every file is written
atomically (temporary file, then rename), ``models.json`` last, and model or head files
of an earlier result that this one does not list are removed, so the directory holds
exactly one result. A failed federation writes nothing (status is honest: no half
result that looks final).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.participant.trainer import LocalTrainer
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.network import classifier_swapped
from spherecal.spherefed.saved import head_document, model_spec_document, save_head, save_state_dict

_SAFE_NAME = re.compile(r"^[a-z0-9_]{1,32}$")

__all__ = ["FinalModels", "refuse_extractor", "save_after_completion", "write_final_models"]


@dataclass
class FinalModels:
    """What the final evaluation delivered: the global vector and the classifiers,
    with the SHA-256 (hex) each was verified against."""

    vector: npt.NDArray[np.float64]
    vector_sha256: str
    heads: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict)
    head_sha256: dict[str, str] = field(default_factory=dict)
    closed: dict[str, CalibratedHead] = field(default_factory=dict)
    """The closed-form heads (FFC+bias, LDA, QDA) on the features of the final model."""


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_final_models(
    out_dir: Path, trainer: LocalTrainer, final: FinalModels, *, federation_id: str
) -> dict[str, Any]:
    """Write ``model_spec.json``, ``model_none.pt``, ``model_<head>.pt``,
    ``head_<closed form>.pt`` and ``models.json`` into ``out_dir``; returns the manifest."""
    bad = [n for n in (*final.heads, *final.closed) if not _SAFE_NAME.match(n) or n == "none"]
    if bad:  # names come from the coordinator: never let one pick a path
        raise ValueError(f"refusing classifier names {bad!r} from the coordinator")
    out_dir.mkdir(parents=True, exist_ok=True)
    trainer.load(final.vector)
    net = trainer.model
    files: dict[str, Any] = {}
    for name in ("none", *sorted(final.heads)):
        weight = final.heads.get(name)
        head = None if weight is None else np.array(weight, dtype=np.float64)
        with classifier_swapped(net, head):
            state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        path = out_dir / f"model_{name}.pt"
        save_state_dict(state, path)
        files[name] = {
            "path": path.name,
            "sha256": _file_sha256(path),
            "classifier_sha256": final.head_sha256.get(name),
        }
    described: dict[str, Any] = {}
    for name in sorted(final.closed):
        path = out_dir / f"head_{name}.pt"
        save_head(final.closed[name], path)
        files[name] = {"path": path.name, "sha256": _file_sha256(path), "model": "none"}
        described[name] = head_document(final.closed[name], path.name)
    document = model_spec_document(trainer.spec, net.feature_dim)
    if described:
        document["heads"] = described
    spec_path = out_dir / "model_spec.json"
    tmp = spec_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(spec_path)
    manifest = {
        "schema": "spherecal.participant-models/1",
        "federation_id": federation_id,
        "global_model_sha256": final.vector_sha256,
        "models": files,
    }
    manifest_path = out_dir / "models.json"
    tmp = manifest_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(manifest_path)
    _remove_stale(out_dir, {entry["path"] for entry in files.values()})
    return manifest


def _remove_stale(out_dir: Path, kept: set[str]) -> None:
    """Remove the model and head files of an earlier result that this one does not
    list: a later run with fewer heads (a degraded one) left ``model_ffc.pt`` beside a
    ``models.json`` that no longer named it, and ``predict`` loaded it by default.
    Only files of the saved-model layout are touched (``model_*.pt``, ``head_*.pt``):
    ``out_dir`` may hold a site's other files."""
    for pattern in ("model_*.pt", "head_*.pt"):
        for path in out_dir.glob(pattern):
            if path.name not in kept:
                path.unlink(missing_ok=True)


def save_after_completion(
    out_dir: Path,
    trainer: LocalTrainer,
    final: FinalModels | None,
    federation_id: str,
    log: Callable[[str], None],
) -> int:
    """Write the final models after a completed federation; the participant's exit
    status (1 when they could not be written: the site lost what it asked for)."""
    if final is None:
        log(
            "no final models to save: this participant did not take part in the final "
            "evaluation (the coordinator's out_dir has them)"
        )
        return 0
    try:
        manifest = write_final_models(out_dir, trainer, final, federation_id=federation_id)
    except (OSError, ValueError) as exc:
        log(f"could not save the final models in {out_dir}: {exc}")
        return 1
    log(f"saved the final models ({', '.join(manifest['models'])}) in {out_dir}")
    return 0


def refuse_extractor(name: str, allowed: tuple[str, ...]) -> str | None:
    """Why a plan's extractor is refused, or None. A user extractor
    (``package.module:factory``) makes this process import and run that code, so
    only names the site allowed in its own config are built."""
    if ":" in name and name not in allowed:
        return (
            f"the coordinator's plan uses the custom extractor {name!r}, which this "
            "participant does not allow; add it to [participant] extractors to agree"
        )
    return None
