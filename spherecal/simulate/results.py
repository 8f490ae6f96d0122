"""``results.json`` of ``spherecal simulate`` (schema in ``docs/deployment.md``).

Built from the coordinator's ``summary.json`` plus what only the harness knows: which
participants it killed and when, exit codes, how often the coordinator was started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from spherecal.coordinator.summary_schema import SummaryDocument, is_complete
from spherecal.results_schema import Dropped, ReferenceSettings, SimulationResults
from spherecal.simulate.settings import SimulationSettings

__all__ = ["RESULTS_SCHEMA", "build_results", "dropped_entry"]

RESULTS_SCHEMA = "spherecal.results/1"


def build_results(
    settings: SimulationSettings,
    summary: SummaryDocument,
    *,
    dropped: Sequence[Dropped],
    exit_codes: dict[str, int | None],
    wall_s: float,
    coordinator_starts: int,
    logs: Path,
) -> SimulationResults:
    """The ``results.json`` document: the summary's numbers and the harness's record.
    A summary the stop watchdog wrote (:class:`~spherecal.coordinator.summary_schema.
    AbortedSummary`) has none of the numbers: they are empty or None."""
    s = settings
    fired = {d["participant"] for d in dropped}
    full = summary if is_complete(summary) else None
    return {
        "schema": RESULTS_SCHEMA,
        "federation_id": summary["federation_id"],
        "status": summary["status"],
        "status_reasons": summary["status_reasons"],
        "errors": full["errors"] if full else [],
        "warnings": full["warnings"] if full else [],
        "settings": {
            # ReferenceConfig.to_json(): the shape test holds it against ReferenceSettings
            **cast(ReferenceSettings, s.reference.to_json()),
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
        "accuracy": full["accuracy"] if full else None,
        "accuracy_covers": full["accuracy_covers"] if full else None,
        "central_accuracy": full["central_accuracy"] if full else None,
        "validation_accuracy": full["validation_accuracy"] if full else None,
        "calibration": full["calibration_selection"] if full else None,
        "calibration_release": full["calibration_release"] if full else {},
        "validation_evaluation": full["validation_evaluation"] if full else None,
        "federated_evaluation": full["federated_evaluation"] if full else None,
        "per_round": full["per_round"] if full else [],
        "history": full["history"] if full else [],
        "jobs": full["jobs"] if full else [],
        "statistics": full["statistics"] if full else {},
        "integrity": full["integrity"] if full else None,
        "ccvr": full["ccvr"] if full else None,
        "timings": (
            {**full["timings"], "wall_s": wall_s}
            if full
            else {"secagg_stages_s": {}, "wall_s": wall_s}
        ),
        "bytes": full.get("bytes", {}) if full else {},
        "dropped": sorted(dropped, key=lambda d: d["at_s"]),
        "drops_not_triggered": [str(d) for d in s.drops if d.participant not in fired],
        "exit_codes": exit_codes,
        "coordinator_starts": coordinator_starts,
        "resumed_after_round": full["resumed_after_round"] if full else None,
        "coverage": full["coverage"] if full else None,
        "retries": full["retries"] if full else None,
        "audit_log": full["audit_log"] if full else None,
        "models": full["models"] if full else {},
        "saved_statistics": full["saved_statistics"] if full else {},
        "model": full["model"] if full else None,
        "privacy": full["privacy"] if full else {"enabled": False},
        "refusals": full["refusals"] if full else [],
        "excluded": full["excluded"] if full else [],
        "logs": str(logs),
    }

def dropped_entry(record: Mapping[str, object], at_s: float) -> Dropped:
    """A participant host's record of a participant it cut off, as ``dropped`` holds it
    (``at_s``: seconds after the harness started)."""
    return {
        "participant": str(record["participant"]),
        "stage": str(record["stage"]),
        "job": str(record["job"]),
        "task_or_job_id": str(record["task_or_job_id"]),
        "how": str(record["how"]),
        "at_s": round(at_s, 3),
    }
