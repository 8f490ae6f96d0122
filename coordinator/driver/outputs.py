"""What a federation leaves behind: saved models, the model spec, the calibrated
heads, and the JSON summary (schema ``spherecal.coordinator-summary/1``, documented
in docs/deployment.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from spherecal.coordinator.driver.bounds import statistics_bound
from spherecal.coordinator.driver.conduct import Conduct
from spherecal.coordinator.driver.dp_releases import CoordinatorPrivacy
from spherecal.coordinator.driver.evaluation_stage import Heads
from spherecal.coordinator.driver.model import GlobalModel, file_sha256
from spherecal.coordinator.driver.stages import Progress
from spherecal.coordinator.driver.strategy import update_bound
from spherecal.coordinator.driver.verdict import coverage, headline_coverage
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.summary_schema import (
    SUMMARY_SCHEMA,
    Accuracy,
    ConductSummary,
    CoordinatorSummary,
    HistoryRow,
    RoundMetrics,
    Timings,
    as_status,
)
from spherecal.proto.codec import model_spec_to_json
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.saved import head_document, save_head

__all__ = ["round_history", "save_outputs", "summary", "write_json"]


def save_outputs(
    settings: CoordinatorSettings,
    model: GlobalModel,
    progress: Progress,
    heads: Heads,
) -> None:
    """``model_{none,ffc,ccvr}.pt``, ``model_spec.json`` and ``classifiers.pt`` in
    ``out_dir``; a closed-form head (FFC+bias, LDA, QDA) is not a linear layer, so it
    is saved as tensors (``head_{name}.pt``: ``weight``, ``bias``, QDA's
    ``quadratic``; load with ``torch.load(..., weights_only=True)``) next to the
    uncalibrated model, and described under ``heads`` in ``model_spec.json``. Paths
    and SHA-256 go into the results."""
    out = settings.out_dir
    out.mkdir(parents=True, exist_ok=True)
    models: dict[str, Any] = {}
    linear = {k: v for k, v in heads.items() if not isinstance(v, CalibratedHead)}
    for name in ("none", "ffc", "ccvr"):
        if name != "none" and name not in linear:
            continue
        path = out / f"model_{name}.pt"
        weight = linear.get(name)
        digest = model.save(
            progress.global_vector, path, None if weight is None else np.asarray(weight)
        )
        models[name] = {"path": str(path), "sha256": digest}
    described: dict[str, Any] = {}
    for name, head in heads.items():
        if not isinstance(head, CalibratedHead):
            continue
        path = out / f"head_{name}.pt"
        save_head(head, path)
        models[name] = {"path": str(path), "sha256": file_sha256(path), "model": "none"}
        described[name] = head_document(head, path.name)
    # the realised feature dimension (the extractor's default when the spec left it unset)
    spec = replace(model.spec, feature_dim=model.feature_dim)
    document = model_spec_to_json(spec)
    if described:
        document["heads"] = described
    (out / "model_spec.json").write_text(json.dumps(document, indent=2) + "\n")
    if linear:
        heads_path = out / "classifiers.pt"
        torch.save(
            {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in linear.items()}, heads_path
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
) -> CoordinatorSummary:
    """The coordinator's JSON summary (see docs/deployment.md for the schema)."""
    s = settings
    results = progress.results
    declared_update, declared_statistics = update_bound(s), statistics_bound(s)
    conducted: ConductSummary = (
        conduct.summary() if conduct is not None else {"refusals": [], "excluded": []}
    )
    return {
        "schema": SUMMARY_SCHEMA,
        "federation_id": federation_id,
        "status": as_status(status),
        "status_reasons": list(progress.status_reasons),
        "errors": list(progress.errors),
        "warnings": list(progress.warnings),
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
            "ridge_grid": list(s.calibration.ridge_grid),
            "shrinkage_grid": list(s.calibration.shrinkage_grid),
            "secure_updates": s.secagg.updates,
            "secure_statistics": s.secagg.statistics,
            "update_bound": declared_update.value,
            "update_bound_source": declared_update.source,
            "update_resolution": s.secagg.update_resolution,
            "statistics_bound": declared_statistics.value,
            "statistics_bound_source": declared_statistics.source,
        },
        "accuracy": results.get("accuracy", dict(NO_ACCURACY)),
        "accuracy_covers": headline_coverage(s, progress),
        "validation_accuracy": results.get("validation_accuracy"),
        "calibration_selection": results.get("calibration"),
        "calibration_release": results.get("calibration_release", {}),
        "validation_evaluation": results.get("validation_evaluation"),
        "central_accuracy": results.get("central_accuracy"),
        "central_test_samples": results.get("central_test_samples"),
        "federated_evaluation": results.get("federated_evaluation"),
        "statistics": results.get("statistics", {}),
        "integrity": results.get("integrity"),
        "ccvr": results.get("ccvr"),
        "per_round": list(progress.round_metrics),
        "history": round_history(progress.round_metrics),
        "resumed_after_round": progress.resumed_from,
        "coverage": coverage(s, progress),
        "retries": {
            "count": len(progress.retries),
            "wait_s": round(sum(r["waited_s"] for r in progress.retries), 3),
            "log": list(progress.retries),
        },
        "jobs": list(progress.job_summaries),
        # the driver's accumulator (keys made per statistics kind): the shape test
        # holds what it wrote against ``Timings``
        "timings": cast(Timings, dict(progress.timings)),
        "models": results.get("models", {}),
        "saved_statistics": results.get("saved_statistics", {}),
        "model": {
            "feature_dim": model.feature_dim,
            "num_classes": model.num_classes,
            "parameters": model.length,
        },
        "audit_log": str(audit_log),
        "privacy": privacy.summary() if privacy is not None else {"enabled": False},
        "refusals": conducted["refusals"],
        "excluded": conducted["excluded"],
    }


NO_ACCURACY: Accuracy = {"none": None, "ffc": None, "ccvr": None}
"""``accuracy`` of a run that ended before its evaluation."""


def round_history(per_round: list[RoundMetrics]) -> list[HistoryRow]:
    """One small row per completed round, what a plot of the run needs (issue #23):
    ``round`` (1-based), ``train_loss`` (the mean over contributors, as summed
    securely; None if unknown), ``federated_accuracy`` / ``test_accuracy`` (None
    where not evaluated that round), ``contributors`` (how many), ``seconds``."""
    rows: list[HistoryRow] = []
    for m in per_round:
        loss = m.get("train_loss")
        rows.append(
            {
                "round": int(m["round"]),
                "train_loss": None if loss is None else float(loss),
                "federated_accuracy": m.get("federated_accuracy"),
                "test_accuracy": m.get("test_accuracy"),
                "contributors": len(m.get("contributors") or ()),
                "seconds": float(m.get("seconds") or 0.0),
            }
        )
    return rows


def write_json(path: Path, data: Mapping[str, object]) -> None:
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
