"""Cross-checks between independent sums, and the per-site bound (issue #22).

Why: secure aggregation hides who sent what, so one dishonest site can send a
well-formed, in-bound vector that passes every structural invariant
(``invariants``) — 10⁵ fake examples per class, say — and the calibrated head
silently collapses. But the coordinator holds *several* sums that an honest
federation makes agree, each computed by the sites independently:

* every training round's weight ``Σ_k n_k`` (FedAvg's update sums, ``[n_k Δ_k, n_k,
  loss_k]``) and each statistics family's example count (FFC's ``count``, CCVR's
  ``Σ_c N_c``; SphereFed Eq. 9, CCVR Eq. 2) count the *same* training examples:
  over the same contributors they are equal;
* rounds over the same contributors carry the same ``Σ n_k``;
* FFC's ``U[:, c]`` and CCVR's ``S_c`` are the same class sums when both jobs ran
  (``ffc_from_ccvr = false``), and ``count = Σ_c N_c`` (``invariants.check_pair``);
* every evaluation of one split over the same contributors has the same total, the
  uncalibrated model's correct count is the same in every evaluation of one model
  on one split, and no head is correct more often than there are samples;
* every count sum is at most ``contributors × [federation] max_examples_per_site``
  (the *bound*: what the sites' declared data could give at most).

Validation, test and training totals count *different* examples (each site's
splits), so no identity ties one to another: each is checked against itself across
evaluations and against the bound. With sampled rounds (``sample_fraction < 1``) a
round is compared with a statistics job only when their contributors are the same.

Tolerances: exact (a fixed-point quantum) without DP; with DP noise of standard
deviation ``σ`` per count entry, ``gate_sigmas · σ · √(entries summed)`` (at least
``NOISE_SDS``). A round's weights are the sites' *released* counts ``ñ_k``, each off
its count by noise of ``[federation] example_count_noise_sd`` (drawn once;
``spherecal.participant.example_weight``), so comparisons with them add that noise
once per contributor.

A disagreement is a typed refusal (:class:`IntegrityCheckFailed`): of the aggregate
when one sum is out of bound or two statistics disagree (no classifier is built from
it), and of the run's ``completed`` status when a check spans stages (the model was
already trained). Every check, passed or failed, is recorded in ``results.json``
(``integrity.checks``), the event log and ``spherecal audit``'s integrity section.
What this cannot see — a lie that keeps every count honest — is the validation
gate's (``validation_gate``) and is documented in ``docs/threat_model.md``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from spherecal.coordinator.driver.invariants import AggregateInvariantViolated
from spherecal.coordinator.driver.stages import Progress, StageContext
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

__all__ = [
    "IntegrityCheckFailed",
    "check_bound",
    "check_evaluation_counts",
    "cross_check_evaluations",
    "cross_check_statistics",
    "integrity_record",
    "integrity_reasons",
    "note",
    "statistics_count",
]


class IntegrityCheckFailed(AggregateInvariantViolated):
    """Two independent sums disagree (``cross-check``) or a sum exceeds what its
    contributors' declared data could give (``bound``)."""


def integrity_record(progress: Progress, settings: Any | None = None) -> dict[str, Any]:
    """``results["integrity"]``: the bound, every check, the gates' decisions."""
    record: dict[str, Any] = progress.results.setdefault(
        "integrity", {"checks": [], "gate": {"heads": {}, "rounds": []}, "evaluations": []}
    )
    if settings is not None:
        record["max_examples_per_site"] = settings.max_examples_per_site
        record["validation_gate"] = settings.validation_gate
        record["round_gate"] = settings.round_gate
        record["gate_sigmas"] = settings.gate_sigmas
        record["example_count_noise_sd"] = settings.example_count_noise_sd
    return record


def note(ctx: StageContext, check: str, passed: bool, detail: str, tolerance: float = 0.0) -> None:
    """Record one check; a failure is also an error event and a status reason."""
    entry = {"check": check, "passed": passed, "detail": detail, "tolerance": tolerance}
    integrity_record(ctx.progress, ctx.settings)["checks"].append(entry)
    if not passed:
        line = f"integrity check failed: {check}: {detail}"
        ctx.say(line)
        ctx.store.event("error", line)


def integrity_reasons(progress: Progress) -> list[str]:
    """Why the run is not ``completed`` on integrity grounds: every failed check and
    every round the round gate flagged (heads the gate rejected are missing heads,
    which ``verdict.assess`` reports)."""
    record = progress.results.get("integrity") or {}
    reasons = [
        f"integrity check failed: {c['check']}: {c['detail']}"
        for c in record.get("checks", [])
        if not c.get("passed")
    ]
    for r in record.get("gate", {}).get("rounds", []):
        if r.get("flagged"):
            reasons.append(
                f"round {r['round']}: federated validation accuracy dropped from "
                f"{r['before']:.4f} to {r['after']:.4f}"
                + (" (the round was rolled back)" if r.get("rolled_back") else "")
            )
    return reasons


NOISE_SDS = 6.0
"""How many standard deviations of DP noise a cross-check allows at least. Two honest
sums of the same counts differ *only* by their noise here, so the bound is set where
honest noise never reaches it (two-sided normal tail at 6 sd ≈ 2e-9 per check; at
``gate_sigmas`` = 3, 0.27 % per check, several checks per run turned honest runs
``degraded`` in the suite), while a count moved beyond it is still caught."""


def _slack(noise_sigma: float, entries: int, sigmas: float, quantum: float) -> float:
    sds = max(sigmas, NOISE_SDS) if noise_sigma > 0 else sigmas
    return quantum + 1e-6 + sds * noise_sigma * math.sqrt(max(entries, 1))


def check_bound(
    what: str,
    total: float,
    contributors: int,
    max_examples: int,
    *,
    noise_sigma: float = 0.0,
    entries: int = 1,
    sigmas: float = 3.0,
) -> None:
    """Raise :class:`IntegrityCheckFailed` when ``total`` exceeds ``contributors ×
    max_examples`` (plus the noise's slack)."""
    limit = contributors * max_examples + _slack(noise_sigma, entries, sigmas, 0.0)
    if not total <= limit:
        raise IntegrityCheckFailed(
            "bound",
            f"{what} = {total:.6g} exceeds {contributors} contributors × "
            f"max_examples_per_site {max_examples}",
        )


def statistics_count(stats: FFCStatistics | CCVRStatistics) -> float:
    return float(np.sum(stats.counts)) if isinstance(stats, CCVRStatistics) else stats.count


def cross_check_statistics(
    ctx: StageContext,
    aggregates: dict[str, FFCStatistics | CCVRStatistics],
    noise_sigma: dict[str, float],
) -> None:
    """Each statistics aggregate's example count against every completed round's
    ``Σ n_k`` over the same contributors (and FFC's ``U`` against CCVR's ``S_c``). A
    disagreement refuses every statistics aggregate (``aggregates`` is emptied: no
    classifier is built from sums that contradict the training) and is a status
    reason: either the training weights or the statistics are not what the sites'
    data gives, and which one cannot be told from sums."""
    progress = ctx.progress
    sigmas = ctx.settings.gate_sigmas
    info: dict[str, Any] = progress.results.get("statistics", {})
    failures: list[str] = []
    for kind, stats in aggregates.items():
        count = statistics_count(stats)
        contributors = info.get(kind, {}).get("contributors")
        entries = stats.num_classes if isinstance(stats, CCVRStatistics) else 1
        # the statistics' DP noise on every count entry, and each contributor's noise
        # on its training weight (``[federation] example_count_noise_sd``)
        sigma = math.sqrt(
            noise_sigma.get(kind, 0.0) ** 2 * entries
            + len(contributors or ()) * float(ctx.settings.example_count_noise_sd) ** 2
        )
        slack = _slack(sigma, 1, sigmas, 1e-6 * max(1.0, count))
        compared = 0
        for m in progress.round_metrics:
            weight = m.get("weight")
            if weight is None or m.get("contributors") != contributors:
                continue
            compared += 1
            detail = (
                f"round {m['round']} trained on Σ n_k = {float(weight):.6g} examples (the "
                f"sites' released counts), the {kind} statistics count {count:.6g} (same "
                f"{len(contributors)} contributors)"
            )
            if abs(float(weight) - count) > slack:
                failures.append(detail)
                note(ctx, f"training weights vs {kind} count", False, detail, slack)
                break
        else:
            if compared:
                note(
                    ctx,
                    f"training weights vs {kind} count",
                    True,
                    f"{compared} round(s) agree with the {kind} count {count:.6g}",
                    slack,
                )
    ffc, ccvr = aggregates.get("ffc"), aggregates.get("ccvr")
    if (
        isinstance(ffc, FFCStatistics)
        and isinstance(ccvr, CCVRStatistics)
        and info.get("ffc", {}).get("contributors") == info.get("ccvr", {}).get("contributors")
    ):
        gap = float(np.max(np.abs(ffc.U - ccvr.sums.T)))
        slack = _slack(
            math.hypot(noise_sigma.get("ffc", 0.0), noise_sigma.get("ccvr", 0.0)),
            1,
            sigmas + 3.0,  # a maximum over l·C entries
            1e-6 * max(1.0, ffc.count),
        )
        detail = f"max |U[:, c] − S_c| = {gap:.4g} between the ffc and ccvr aggregates"
        note(ctx, "ffc U vs ccvr class sums", gap <= slack, detail, slack)
        if gap > slack:
            failures.append(detail)
    if failures:
        for kind in list(aggregates):
            aggregates.pop(kind)
            message = f"{kind} statistics failed: aggregate refused: cross-check: {failures[0]}"
            if message not in progress.errors:
                progress.errors.append(message)
            ctx.store.event("error", message)


def check_evaluation_counts(
    total: float,
    correct: dict[str, float],
    contributors: int,
    max_examples: int,
    *,
    noise_sigma: float = 0.0,
    sigmas: float = 3.0,
) -> None:
    """One evaluation's sums: ``0 ≤ correct_h ≤ total ≤ contributors × bound``."""
    slack = _slack(noise_sigma, 1, sigmas, 0.0)
    check_bound(
        "the evaluation total",
        total,
        contributors,
        max_examples,
        noise_sigma=noise_sigma,
        sigmas=sigmas,
    )
    if total < -slack:
        raise IntegrityCheckFailed("cross-check", f"the evaluation total {total} is negative")
    for name, value in correct.items():
        if value < -slack or value > total + slack:
            raise IntegrityCheckFailed(
                "cross-check", f"head {name!r}: {value} correct of {total} samples"
            )


def cross_check_evaluations(ctx: StageContext) -> None:
    """Evaluations of one split over the same contributors must have the same total,
    and evaluations of one model on one split the same uncalibrated correct count."""
    record = integrity_record(ctx.progress, ctx.settings)
    sigmas = ctx.settings.gate_sigmas
    seen: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
    same_model: dict[tuple[str, str, tuple[str, ...]], dict[str, Any]] = {}
    for e in record.get("evaluations", []):
        key = (str(e["split"]), tuple(e["contributors"]))
        slack = _slack(float(e.get("noise_sigma", 0.0)), 2, sigmas, 0.0)
        first = seen.setdefault(key, e)
        if first is not e:
            detail = (
                f"{e['split']} evaluations over the same {len(key[1])} participants "
                f"counted {first['total']} and {e['total']} samples"
            )
            note(
                ctx,
                f"{e['split']} totals",
                abs(first["total"] - e["total"]) <= slack,
                detail,
                slack,
            )
        model_key = (str(e["split"]), str(e["model"]), tuple(e["contributors"]))
        earlier = same_model.setdefault(model_key, e)
        if earlier is not e and "none" in earlier["correct"] and "none" in e["correct"]:
            a, b = earlier["correct"]["none"], e["correct"]["none"]
            note(
                ctx,
                f"{e['split']} uncalibrated counts",
                abs(a - b) <= slack,
                f"two {e['split']} evaluations of one model counted {a} and {b} correct",
                slack,
            )
