"""What a federation leaves behind: saved models, the model spec, the calibrated
heads, and the JSON summary (schema ``spherecal.coordinator-summary/1``, documented
in docs/deployment.md).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from proto.codec import model_spec_to_json

from .conduct import Conduct
from .model import GlobalModel, file_sha256
from .privacy import CoordinatorPrivacy
from .settings import CoordinatorSettings
from .stages import Progress

__all__ = ["save_outputs", "summary", "write_json"]


def save_outputs(
    settings: CoordinatorSettings,
    model: GlobalModel,
    progress: Progress,
    heads: dict[str, npt.NDArray[np.float64]],
) -> None:
    """``model_{none,ffc,ccvr}.pt``, ``model_spec.json`` and ``classifiers.pt`` in
    ``out_dir``; their paths and SHA-256 go into the results."""
    out = settings.out_dir
    out.mkdir(parents=True, exist_ok=True)
    models: dict[str, Any] = {}
    for name in ("none", "ffc", "ccvr"):
        if name != "none" and name not in heads:
            continue
        path = out / f"model_{name}.pt"
        digest = model.save(progress.global_vector, path, heads.get(name))
        models[name] = {"path": str(path), "sha256": digest}
    # the realised feature dimension (the extractor's default when the spec left it unset)
    spec = replace(model.spec, feature_dim=model.feature_dim)
    (out / "model_spec.json").write_text(json.dumps(model_spec_to_json(spec), indent=2) + "\n")
    if heads:
        heads_path = out / "classifiers.pt"
        torch.save(
            {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in heads.items()}, heads_path
        )
        models["classifiers"] = {"path": str(heads_path), "sha256": file_sha256(heads_path)}
    progress.results["models"] = models


def summary(
    *,
    settings: CoordinatorSettings,
    federation_id: str,
    status: str,
    progress: Progress,
    model: GlobalModel,
    audit_log: Path,
    privacy: CoordinatorPrivacy | None,
    conduct: Conduct | None = None,
) -> dict[str, Any]:
    """The coordinator's JSON summary (see docs/deployment.md for the schema)."""
    s = settings
    results = progress.results
    return {
        "schema": "spherecal.coordinator-summary/1",
        "federation_id": federation_id,
        "status": status,
        "errors": list(progress.errors),
        "settings": {
            "name": s.name,
            "participants": list(s.participants),
            "seed": s.seed,
            "rounds": s.training.rounds,
            "algorithm": s.training.algorithm,
            "sample_fraction": s.training.sample_fraction,
            "local_epochs": s.training.local_epochs,
            "batch_size": s.training.batch_size,
            "lr": s.training.lr,
            "loss": s.training.loss,
            "model": {
                "extractor": s.model.extractor,
                "head": s.model.head,
                "norm": s.model.norm,
                "classifier": s.model.classifier,
            },
            "calibration": list(s.calibration.methods),
            "secure_updates": s.secagg.updates,
            "secure_statistics": s.secagg.statistics,
            "update_bound": s.secagg.update_bound,
            "statistics_bound": s.secagg.statistics_bound,
        },
        "accuracy": results.get("accuracy", {"none": None, "ffc": None, "ccvr": None}),
        "central_accuracy": results.get("central_accuracy"),
        "central_test_samples": results.get("central_test_samples"),
        "federated_evaluation": results.get("federated_evaluation"),
        "statistics": results.get("statistics", {}),
        "ccvr": results.get("ccvr"),
        "per_round": list(progress.round_metrics),
        "resumed_after_round": progress.resumed_from,
        "jobs": list(progress.job_summaries),
        "timings": dict(progress.timings),
        "models": results.get("models", {}),
        "saved_statistics": results.get("saved_statistics", {}),
        "model": {
            "feature_dim": model.feature_dim,
            "num_classes": model.num_classes,
            "parameters": model.length,
        },
        "audit_log": str(audit_log),
        "privacy": privacy.summary() if privacy is not None else {"enabled": False},
        **(conduct.summary() if conduct is not None else {"refusals": [], "excluded": []}),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")
