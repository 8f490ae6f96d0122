"""The federation's honest final status, and what each part of the result covers.

Why: a federation that "ran to the end" is not the same as one that delivered what
was asked. Under churn a statistics job can fail (no FFC/CCVR head) or sum one
participant, and the headline accuracy can come from one participant's 127 test
samples; calling that ``completed`` hides it (issue #10). So the driver ends with

``completed``  every requested calibration produced its head from statistics summed
               over at least ``CoordinatorSettings.calibration_minimum`` participants,
               and the final federated evaluation covered at least that many;
``degraded``   the run reached its end but one of those did not hold (a head from a
               DP release that the validation gate withheld, because it did not
               beat the uncalibrated model, included) — the reasons say which,
               and ``coverage`` lists, per round and per job, who was missing and
               how many inputs were summed;
``failed``     the federation stopped (a round failed every attempt, join deadline,
               SIGTERM); no outputs.

Coverage (issue #20): a calibration must also cover what the federation *has* —
every participant whose update was summed in a training round, and every class
(``calibration_gaps``). Statistics above the minimum that still lack such a
participant, or whose per-class counts (in the CCVR sums) are zero for a class, are
``degraded`` with a reason naming who or which class is missing: a head solved
without class 0 silently never predicts it, and one solved without a site fits the
others' feature distribution.

Rounds that trained without some selected participants do not degrade the status by
themselves (partial participation is how federated training works, and a round
below ``training.min_participants`` is retried or fails the run); they are listed in
``coverage.rounds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spherecal.coordinator.driver.stages import Progress
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.summary_schema import (
    Coverage,
    HeadlineCoverage,
    JobCoverage,
    RoundCoverage,
)

__all__ = [
    "Verdict",
    "assess",
    "calibration_gaps",
    "coverage",
    "headline_coverage",
    "method_causes",
]


@dataclass(frozen=True)
class Verdict:
    status: str  # "completed" or "degraded"
    reasons: list[str] = field(default_factory=list)


def _source_job(settings: CoordinatorSettings, method: str) -> str:
    """The statistics job a calibration method is solved from."""
    if method == "ffc" and "ffc" not in settings.calibration.jobs:
        return "ccvr"  # FFC from the CCVR sums
    return method


def assess(settings: CoordinatorSettings, progress: Progress, heads: set[str]) -> Verdict:
    """``completed`` or ``degraded`` (with reasons) for a federation that reached its
    end with the calibrated ``heads`` (see the module docstring)."""
    reasons: list[str] = []
    minimum = settings.calibration_minimum
    statistics: dict[str, Any] = progress.results.get("statistics", {})
    roster = settings.participants
    release: dict[str, Any] = progress.results.get("calibration_release", {})
    for method in settings.calibration.methods:
        if method in heads:
            continue
        decision = release.get(method) or {}
        if decision.get("dp") and not decision.get("shipped"):
            # withheld by the validation gate's DP rule: not an error, but not what was
            # asked for either (issue #25)
            reasons.append(f"{method}: {decision.get('reason')}")
            continue
        source = _source_job(settings, method)
        why = method_causes(progress.errors, source, method)
        reasons.append(
            f"{method}: no calibrated classifier"
            + (f" ({'; '.join(why)})" if why else f" (the {source} statistics are missing)")
        )
    for kind, info in statistics.items():
        summed = list(info.get("contributors", []))
        if len(summed) < minimum:
            missing = [p for p in roster if p not in summed]
            reasons.append(
                f"{kind} statistics summed {len(summed)} participants (minimum {minimum}); "
                f"missing {missing}"
            )
    reasons.extend(calibration_gaps(settings, progress))
    fed = progress.results.get("federated_evaluation")
    if isinstance(fed, dict):
        evaluated = list(fed.get("participants", []))
        if len(evaluated) < minimum:
            not_retried = [e for e in progress.errors if e.startswith("final evaluation ")]
            reasons.append(
                f"the final evaluation covered {len(evaluated)} participants "
                f"({fed.get('samples', 0)} test samples; minimum {minimum}); "
                f"missing {[p for p in roster if p not in evaluated]}"
                + (f" ({not_retried[-1]})" if not_retried else "")
            )
    # a round given up because its sites' updates already left (training_rounds.lose)
    reasons.extend(e for e in progress.errors if e.startswith("round ") and " lost: " in e)
    return Verdict("degraded" if reasons else "completed", reasons)


def method_causes(errors: list[str], source: str, method: str) -> list[str]:
    """Why calibration ``method`` (solved from the ``source`` statistics) is missing,
    each cause once.

    The statistics stage records one conclusion per kind — ``ccvr statistics failed:
    …``, with the first cause or why it was not retried — while ``errors`` also holds
    every failed job of it (``ccvr job 1a2b3c4d: …``), one per attempt. Until
    2026-11-27 the reason took both, so a job asked three times put its causal chain
    in the status three times over, and the conclusion a fourth; the per-job lines
    stay in ``errors`` and the events. Only where no conclusion was recorded do they
    stand in for one."""
    concluded = (f"{source} statistics failed: ", f"{method} statistics failed: ")
    why = [e for e in errors if e.startswith(concluded)]
    if not why:
        why = [e for e in errors if e.startswith((f"{source} ", f"{method} "))]
    return list(dict.fromkeys(why))


def participants_had(progress: Progress) -> set[str]:
    """Who the federation has: every participant whose update was summed in a
    training round — whose data shaped the model the calibration completes. (One
    excluded from every job for misconduct, or that never joined, is not.)"""
    had: set[str] = set()
    for m in progress.round_metrics:
        had.update(m.get("contributors", []))
    return had


def calibration_gaps(settings: CoordinatorSettings, progress: Progress) -> list[str]:
    """Reasons the calibration statistics lack a participant or a class the federation
    has (see the module docstring); statistics below the minimum are already named
    by :func:`assess`, so they are not repeated here."""
    reasons: list[str] = []
    statistics: dict[str, Any] = progress.results.get("statistics", {})
    had = participants_had(progress)
    order = {p: k for k, p in enumerate(settings.participants)}
    for kind, info in statistics.items():
        summed = set(info.get("contributors", []))
        if len(summed) < settings.calibration_minimum:
            continue
        lacking = sorted(had - summed, key=lambda p: order.get(p, len(order)))
        if lacking:
            reasons.append(
                f"{kind} statistics lack {len(lacking)} of the federation's "
                f"{len(had | summed)} participants: {lacking}"
            )
        classes = [int(c) for c in info.get("missing_classes", [])]
        if classes:
            reasons.append(
                f"{kind} statistics have no samples of class(es) {classes} "
                f"(of {settings.model.num_classes}): the calibrated heads cannot represent them"
            )
    return reasons


def coverage(settings: CoordinatorSettings, progress: Progress) -> Coverage:
    """Per round and per job: who was asked, how many inputs were summed, who was
    missing and why."""
    rounds: list[RoundCoverage] = []
    for m in progress.round_metrics:
        selected = list(m.get("selected", []))
        summed = list(m.get("contributors", []))
        dropped = dict(m.get("dropped", {}))
        rounds.append(
            {
                "round": m.get("round"),
                "attempt": m.get("attempt"),
                "selected": len(selected),
                "summed": len(summed),
                "missing": {
                    p: dropped.get(p, "did not contribute") for p in selected if p not in summed
                },
            }
        )
    jobs: list[JobCoverage] = []
    for j in progress.job_summaries:
        asked = list(j.get("participants", []))
        summed = list(j.get("contributors", []))
        dropped = dict(j.get("dropped", {}))
        jobs.append(
            {
                "purpose": j["purpose"],
                "round": j.get("round"),
                "status": j["status"],
                "asked": len(asked),
                "summed": len(summed) if j.get("status") == "done" else 0,
                "missing": {
                    p: dropped.get(p, "did not contribute") for p in asked if p not in summed
                },
                "not_asked": [p for p in settings.participants if p not in asked],
                "error": j.get("error"),
            }
        )
    return {
        "rounds": rounds,
        "jobs": jobs,
        "evaluation": headline_coverage(settings, progress),
    }


def headline_coverage(settings: CoordinatorSettings, progress: Progress) -> HeadlineCoverage:
    """What the headline accuracy (federated evaluation of the final model) covers."""
    fed = progress.results.get("federated_evaluation")
    roster = list(settings.participants)
    if not isinstance(fed, dict):
        return {"participants": 0, "of": len(roster), "test_samples": 0, "missing": roster}
    evaluated = list(fed.get("participants", []))
    return {
        "participants": len(evaluated),
        "of": len(roster),
        "test_samples": int(fed.get("samples", 0)),
        "missing": [p for p in roster if p not in evaluated],
    }
