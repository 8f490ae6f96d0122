"""``results.json`` of ``spherecal simulate`` (schema in ``docs/deployment.md``).

Built from the coordinator's ``summary.json`` plus what only the harness knows: which
participants it killed and when, exit codes, how often the coordinator was started.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spherecal.simulate.settings import SimulationSettings

__all__ = ["RESULTS_SCHEMA", "build_results"]

RESULTS_SCHEMA = "spherecal.results/1"


def build_results(
    settings: SimulationSettings,
    summary: dict[str, Any],
    *,
    dropped: Sequence[dict[str, Any]],
    exit_codes: dict[str, int | None],
    wall_s: float,
    coordinator_starts: int,
    logs: Path,
) -> dict[str, Any]:
    """The ``results.json`` document: the summary's numbers and the harness's record."""
    s = settings
    fired = {d["participant"] for d in dropped}
    return {
        "schema": RESULTS_SCHEMA,
        "federation_id": summary.get("federation_id"),
        "status": summary.get("status"),
        "status_reasons": summary.get("status_reasons", []),
        "errors": summary.get("errors", []),
        "warnings": summary.get("warnings", []),
        "settings": {
            **s.reference.to_json(),
            "calibration": list(s.calibration),
            "secure_updates": s.secure_updates,
            "secure_statistics": s.secure_statistics,
            "threshold": s.threshold,
            "ffc_from_ccvr": s.ffc_from_ccvr,
            "drop": [str(d) for d in s.drops],
            "adversary": [f"{pid}:{spec}" for pid, spec in s.adversaries],
            "tls": s.tls,
            "threads": s.threads,
            "epsilon": s.epsilon,
            "delta": s.delta if s.privacy else None,
            "dp_mechanism": s.dp_mechanism if s.privacy else None,
            "dp_budget": s.dp_budget,
        },
        "accuracy": summary.get("accuracy"),
        "accuracy_covers": summary.get("accuracy_covers"),
        "central_accuracy": summary.get("central_accuracy"),
        "validation_accuracy": summary.get("validation_accuracy"),
        "calibration": summary.get("calibration_selection"),
        "calibration_release": summary.get("calibration_release", {}),
        "validation_evaluation": summary.get("validation_evaluation"),
        "federated_evaluation": summary.get("federated_evaluation"),
        "per_round": summary.get("per_round", []),
        "history": summary.get("history", []),
        "jobs": summary.get("jobs", []),
        "statistics": summary.get("statistics", {}),
        "integrity": summary.get("integrity"),
        "ccvr": summary.get("ccvr"),
        "timings": {**summary.get("timings", {}), "wall_s": wall_s},
        "bytes": summary.get("bytes", {}),
        "dropped": sorted(dropped, key=lambda d: d["at_s"]),
        "drops_not_triggered": [str(d) for d in s.drops if d.participant not in fired],
        "exit_codes": exit_codes,
        "coordinator_starts": coordinator_starts,
        "resumed_after_round": summary.get("resumed_after_round"),
        "coverage": summary.get("coverage"),
        "retries": summary.get("retries"),
        "audit_log": summary.get("audit_log"),
        "models": summary.get("models", {}),
        "saved_statistics": summary.get("saved_statistics", {}),
        "model": summary.get("model"),
        "privacy": summary.get("privacy", {"enabled": False}),
        "refusals": summary.get("refusals", []),
        "excluded": summary.get("excluded", []),
        "logs": str(logs),
    }
