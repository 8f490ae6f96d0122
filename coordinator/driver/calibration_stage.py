"""After training: one statistics job per configured kind, then FFC / CCVR solved on
the aggregate (the solvers themselves are in ``calibration``), and FFC+bias / LDA /
QDA from the same CCVR sums (``closed_forms``; chosen on validation).

CCVR implies FFC by default, as in the reference runner: FFC is then solved from the
CCVR statistics' class blocks summed (``CCVRStatistics.to_ffc``). With distributed
DP on, each statistics job is a DP release; its noise sets a floor on the ridge
(``CoordinatorPrivacy.ridge``, ≈ 2√l·σ).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from spherecal import crypto
from spherecal.coordinator.driver.bounds import statistics_bound
from spherecal.coordinator.driver.discriminant_heads import select_closed_forms
from spherecal.coordinator.driver.dp_releases import CoordinatorPrivacy
from spherecal.coordinator.driver.evaluation_stage import Heads
from spherecal.coordinator.driver.ffc_ccvr_heads import (
    ccvr_classifier,
    ffc_classifier,
    unpack_statistics,
)
from spherecal.coordinator.driver.futile_retry import (
    FutileRetry,
    RefusalWatch,
    fewest_for_a_job,
)
from spherecal.coordinator.driver.integrity import (
    IntegrityCheckFailed,
    check_bound,
    cross_check_statistics,
    note,
    statistics_count,
)
from spherecal.coordinator.driver.invariants import (
    AggregateInvariantViolated,
    Tolerance,
    check_ccvr,
    check_ffc,
    check_pair,
)
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.driver.rejoin import wait_before_retry
from spherecal.coordinator.driver.secure_job import SecureJob, guaranteed_inputs
from spherecal.coordinator.driver.stages import StageContext, with_first_cause
from spherecal.coordinator.driver.tasks import Task
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.task_context import task_context
from spherecal.spherefed.heads import UNIT_NORM_HEADS
from spherecal.spherefed.privacy.plan import CalibrationPlan
from spherecal.spherefed.privacy.projection import project_ccvr
from spherecal.spherefed.stats import (
    CCVRStatistics,
    FFCStatistics,
    ccvr_layout_size,
    ffc_layout_size,
)

__all__ = ["Aggregates", "calibrate", "collect_statistics"]

Aggregates = dict[str, FFCStatistics | CCVRStatistics]


def record_statistics_failure(ctx: StageContext, kind: str, error: str) -> None:
    message = f"{kind} statistics failed: {error}"
    if message not in ctx.progress.errors:
        ctx.progress.errors.append(message)
    ctx.say(message)
    ctx.store.event("error", message)


def check_aggregate(
    stats: FFCStatistics | CCVRStatistics, *, unit_norm: bool, tol: Tolerance
) -> None:
    if isinstance(stats, FFCStatistics):
        check_ffc(stats, unit_norm=unit_norm, tol=tol)
    else:
        check_ccvr(stats, unit_norm=unit_norm, tol=tol)


def refuse_aggregate(
    ctx: StageContext,
    kind: str,
    job: SecureJob | None,
    contributors: list[str],
    exc: AggregateInvariantViolated,
) -> None:
    """A violating aggregate never becomes a classifier: the job is marked failed
    with the invariant that failed, and the calibration is recorded as failed."""
    error = f"AggregateInvariantViolated: {exc}"
    record_statistics_failure(ctx, kind, f"aggregate refused: {exc}")
    job_hex = job.job_hex if job is not None else None
    for summary in ctx.progress.job_summaries:
        if summary.get("purpose") == kind and summary.get("job_id") == job_hex:
            summary["status"] = "failed"
            summary["error"] = error
    if job is not None:
        ctx.store.job_finished(
            job.job_hex,
            "failed",
            contributors=contributors,
            dropouts=[],
            excluded=[],
            error=error,
        )


@dataclass
class _Summed:
    """A statistics job's checked aggregate — or the sum of several jobs' over disjoint
    sites — and what the results say of it, kept aside until the stage ends."""

    stats: FFCStatistics | CCVRStatistics
    contributors: list[str]
    record: dict[str, Any]
    """``results["statistics"][kind]``."""
    dp_ridge: dict[str, float]
    vector: npt.NDArray[np.float64]
    """The summed vector, for ``[calibration] save_statistics``."""
    seconds: float
    noised: bool
    """A DP release (its sums carry noise)."""

    @property
    def parts(self) -> list[dict[str, Any]]:
        """Each job's own record, in the order they were added (one: itself)."""
        return list(self.record.get("parts", [_part(self.record)]))

    def plus(self, other: _Summed, order: Callable[[str], int]) -> _Summed:
        """The sum over both jobs' sites, which are disjoint: the statistics are sums
        over examples, so two checked sums over disjoint sites add to the exact sum
        over their union (each part passed the aggregate checks, whose rules — counts
        within the bound, positive semi-definite moments — hold for a sum of parts).
        Independent DP noise adds in variance: ``σ`` and the ridge floor, linear in
        ``σ`` (``CoordinatorPrivacy.ridge``), combine as a root sum of squares."""
        shared = set(self.contributors) & set(other.contributors)
        if shared:  # a site in both would be counted twice
            raise ValueError(f"statistics parts share {sorted(shared)}: not added")
        stats = cast(Any, self.stats) + other.stats
        contributors = sorted([*self.contributors, *other.contributors], key=order)
        parts = [*self.parts, _part(other.record)]
        record = {
            "contributors": contributors,
            "samples": _samples(stats),
            "missing_classes": _missing_classes(stats, noised=self.noised),
            "noise_sigma": math.hypot(self.record["noise_sigma"], other.record["noise_sigma"]),
            "parts": parts,
        }
        ridge = {
            key: math.hypot(self.dp_ridge.get(key, 0.0), other.dp_ridge.get(key, 0.0))
            for key in {*self.dp_ridge, *other.dp_ridge}
        }
        return _Summed(
            stats=stats,
            contributors=contributors,
            record=record,
            dp_ridge=ridge,
            vector=self.vector + other.vector,
            seconds=self.seconds + other.seconds,
            noised=self.noised,
        )


def _part(record: dict[str, Any]) -> dict[str, Any]:
    """One job's share of a combined ``results["statistics"][kind]``."""
    return {k: v for k, v in record.items() if k != "parts"}


def _samples(stats: FFCStatistics | CCVRStatistics) -> float:
    return float(np.sum(stats.counts)) if isinstance(stats, CCVRStatistics) else stats.count


def _missing_classes(stats: FFCStatistics | CCVRStatistics, *, noised: bool) -> list[int]:
    """Classes no summed participant has (the verdict's coverage): a CCVR count below
    one half (DP noise included); without DP noise, an FFC class whose feature sum
    ``U[:, c]`` is exactly zero (no sample of it was summed)."""
    if isinstance(stats, CCVRStatistics):
        return [int(c) for c in np.flatnonzero(stats.counts < 0.5)]
    if noised:
        return []
    return [int(c) for c in np.flatnonzero(~np.any(stats.U != 0, axis=0))]


def collect_statistics(
    ctx: StageContext, model: GlobalModel, privacy: CoordinatorPrivacy | None
) -> Aggregates:
    """One job per kind in ``calibration.jobs``, each retried like a round (up to
    ``max_round_attempts``, waiting for participants to rejoin in between, see
    ``rejoin``) — unless the sites' refusals are ones a retry meets again and leave
    too few others for a job (``futile_retry``): then the kind ends at once. A kind
    that still fails is recorded once, with its cause, not fatal.

    A sum over fewer than ``calibration_minimum`` contributors is *kept*, not thrown
    away: each of its contributors spent its one release of these moments on it
    (``participant.release_ledger``) and refuses to release them again. A retry asks
    only the others — it is made only if they could make a job — and its sum is added
    to the one kept: sums over disjoint sites add to the sum over their union
    (:meth:`_Summed.plus`). The heads are solved from that sum; short of the minimum
    still, the status says so (``verdict``)."""
    s = ctx.settings
    out: Aggregates = {}
    final = ctx.board.publish("final", ctx.progress.global_vector)
    attempts = s.training.max_round_attempts
    minimum = s.calibration_minimum
    for kind in s.calibration.jobs:
        error = ""
        kept: _Summed | None = None
        watch = RefusalWatch(ctx, kind)
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                wait_before_retry(
                    ctx,
                    stage=f"statistics {kind}",
                    next_attempt=attempt,
                    reason=error,
                    wanted=ctx.registry.joined(),
                )
            result = _collect_kind(
                ctx,
                model,
                privacy,
                kind,
                final,
                released=kept.contributors if kept else (),
                part=1 if kept is None else len(kept.parts) + 1,
            )
            if result is None:
                break  # refused and recorded: no retry helps
            if isinstance(result, str):
                error = result
            else:
                if kept is not None:
                    line = (
                        f"statistics {kind}: attempt {attempt} summed {len(result.contributors)} "
                        f"more participants, added to the {len(kept.contributors)} kept"
                    )
                    ctx.say(line)
                    ctx.store.event("info", line)
                kept = result if kept is None else kept.plus(result, ctx.registry.index_of)
                if len(kept.contributors) >= minimum:
                    break
                error = (
                    f"only {len(kept.contributors)} participants summed (minimum {minimum}); "
                    "kept, and a retry asks the others"
                )
            if attempt == attempts:
                if attempts > 1 and kept is None:
                    error = f"{attempts} attempts failed; the last: {error}"
                break
            line = f"statistics {kind}: attempt {attempt} failed: {error}"
            ctx.say(line)
            ctx.store.event("warning", line)
            futile = _futile(ctx, watch, kept)
            if futile is not None:
                error = futile.reason()  # the per-attempt detail is in the line above
                if kept is not None:
                    line = f"statistics {kind}: {error}; the sum kept is used"
                    ctx.say(line)
                    ctx.store.event("warning", line)
                break
        if kept is not None:
            out[kind] = _use(ctx, model, kind, kept)
        elif error:
            record_statistics_failure(ctx, kind, error)
    _check_pair(ctx, out)
    stats_info = ctx.progress.results.get("statistics", {})
    cross_check_statistics(
        ctx, out, {k: float(v.get("noise_sigma", 0.0)) for k, v in stats_info.items()}
    )
    return out


def _use(
    ctx: StageContext, model: GlobalModel, kind: str, summed: _Summed
) -> FFCStatistics | CCVRStatistics:
    """``summed`` becomes the ``kind`` statistics the heads are solved from: its
    results entry, its DP ridge floor, its timing and (``save_statistics``) its file.

    A DP release of CCVR's sums is noisy in every entry: it is projected onto what
    honest data can give (counts ≥ 0, means in the unit ball, PSD scatter) before any
    solver sees it — post-processing, no privacy cost (``spherefed.privacy.projection``)
    — once, on the sum of every part (projecting each part first would clip each
    part's noise on its own and bias the sum)."""
    s = ctx.settings
    progress = ctx.progress
    stats, record = summed.stats, summed.record
    if summed.noised and isinstance(stats, CCVRStatistics):
        stats, change = project_ccvr(stats, unit_norm=s.model.head in UNIT_NORM_HEADS)
        for line in change.notes():
            ctx.say(f"{kind} DP release projected: {line}")
        record = {
            **record,
            "samples": _samples(stats),
            "missing_classes": _missing_classes(stats, noised=True),
            "projection": change.to_json(),
        }
    if s.calibration.save_statistics:
        target = s.out_dir / f"statistics_{kind}.npz"
        s.out_dir.mkdir(parents=True, exist_ok=True)
        np.savez(target, vector=summed.vector, dim=model.feature_dim, num_classes=model.num_classes)
        progress.results.setdefault("saved_statistics", {})[kind] = str(target)
    progress.dp_ridge.update(summed.dp_ridge)
    progress.timings[f"statistics_{kind}_s"] = summed.seconds
    progress.results.setdefault("statistics", {})[kind] = record
    return stats


def _futile(ctx: StageContext, watch: RefusalWatch, kept: _Summed | None) -> FutileRetry | None:
    """Whether a retry of the statistics job cannot be made: the eligible roster,
    less the sites that refused it for good — and the contributors of a short sum
    ``kept``, which would — is smaller than any job (secure: the threshold and
    ``[secure_aggregation] min_participants``; plaintext: one upload)."""
    s = ctx.settings
    pool = ctx.eligible(list(s.participants))
    released = kept.contributors if kept is not None else ()
    if s.secagg.statistics:
        least = fewest_for_a_job(s.secagg, len(pool), s.privacy.colluders)
        needs = "a secure job needs"
    else:
        least, needs = 1, "a statistics task needs"
    return watch.futile(pool, least=least, needs=needs, released=released)


def _check_pair(ctx: StageContext, out: Aggregates) -> None:
    """FFC and CCVR from the same contributors must agree on the sample count; if
    they do not, neither is trusted."""
    ffc, ccvr = out.get("ffc"), out.get("ccvr")
    if not (isinstance(ffc, FFCStatistics) and isinstance(ccvr, CCVRStatistics)):
        return
    stats = ctx.progress.results.get("statistics", {})
    if stats.get("ffc", {}).get("contributors") != stats.get("ccvr", {}).get("contributors"):
        return
    if ctx.progress.dp_ridge:  # independent noise in each release: no exact identity
        return
    try:
        check_pair(ffc, ccvr, tol=Tolerance(quantum=1e-6 * max(1.0, ffc.count)))
    except AggregateInvariantViolated as exc:
        for kind in ("ffc", "ccvr"):
            record_statistics_failure(ctx, kind, f"aggregate refused: {exc}")
            out.pop(kind, None)


def _statistics_task(
    kind: str,
    final: pb.TensorRef,
    privacy: CoordinatorPrivacy | None,
    plan: CalibrationPlan | None,
    secure: pb.SecAggJob | None = None,
) -> pb.StatisticsTask:
    """One member's statistics task (without ``secure``: the task the job's context
    is the digest of)."""
    return pb.StatisticsTask(
        kind=pb.FFC if kind == "ffc" else pb.CCVR,
        model=final,
        secure=secure,
        privacy=(
            privacy.release_message(plan) if privacy is not None and plan is not None else None
        ),
    )


def _collect_kind(
    ctx: StageContext,
    model: GlobalModel,
    privacy: CoordinatorPrivacy | None,
    kind: str,
    final: pb.TensorRef,
    *,
    released: Collection[str] = (),
    part: int = 1,
) -> _Summed | str | None:
    """One attempt at the ``kind`` statistics job: the checked aggregate, however many
    it sums (the caller weighs it against ``calibration_minimum``); why it failed (a
    string: the caller retries, without any peer excluded meanwhile); or None (refused
    and recorded: no retry helps). ``released``: the contributors of a sum already
    kept, left out of this job's roster (each would refuse to release again).

    ``part``: which sum of the kind this job computes — 1, or the next one to add to
    a short sum kept — and so its journal slot (``ffc``, ``ffc+2``, …): a coordinator
    restarted after any of them continues each from the journal, its result with it,
    instead of asking its sites for a second release (issue #20)."""
    s = ctx.settings
    slot = kind if part == 1 else f"{kind}+{part}"
    progress = ctx.progress
    dim, classes = model.feature_dim, model.num_classes
    t0 = time.monotonic()
    length = ffc_layout_size(dim, classes) if kind == "ffc" else ccvr_layout_size(dim, classes)
    participants = [
        p
        for p in ctx.eligible(sorted(ctx.registry.alive(), key=ctx.registry.index_of))
        if p not in released
    ]
    job: SecureJob | None = None
    plan: CalibrationPlan | None = None
    if s.secagg.statistics:
        participants = ctx.resume_participants(slot, participants)  # continued after a restart
        try:
            if privacy is not None:
                n = len(participants)
                plan = privacy.plan(
                    kind,
                    dim=dim,
                    num_classes=classes,
                    n=n,
                    t=guaranteed_inputs(s.secagg, n, s.privacy.colluders),
                )
            bound = statistics_bound(s)
            if plan is None:
                ctx.say(f"{kind} statistics: {bound.describe()}")
            job = ctx.new_job(
                kind,
                None,
                participants,
                length,
                bound.value,
                s.timeouts.round_s,
                spec_arguments=plan.job_spec_arguments() if plan is not None else None,
                context=task_context(
                    _statistics_task(kind, final, privacy, plan), ctx.shared_plan()
                ),
                slot=slot,
            )
        except (crypto.SecAggError, ValueError) as exc:
            return f"cannot create the job: {exc}"
    task = Task(
        task_id=ctx.task_id(slot),
        kind="statistics",
        expected=frozenset(participants),
        instructions={
            p: pb.Instruction(
                statistics=_statistics_task(
                    kind, final, privacy, plan, job.job_message(p) if job is not None else None
                )
            )
            for p in participants
        },
        purpose=kind,
        job=job,
        expected_shape=(length,),
    )
    ctx.board.set_task(task, f"statistics: {kind}")
    ctx.say(f"statistics {kind}: {len(participants)} participants, {length} entries")
    gathered = ctx.gather(
        task, timeout_s=s.timeouts.round_s, phase_after=f"statistics: {kind} done"
    )
    if job is not None and privacy is not None:
        for line in privacy.note_refusals(job.job_hex, kind, gathered.dropped):
            ctx.say(line)
            ctx.store.event("warning", line)
    if gathered.error is not None:
        return with_first_cause(gathered.error, gathered.dropped)
    if gathered.values is None:
        return "no participant uploaded statistics"
    vector = gathered.values
    contributors = gathered.contributors
    sigma = 0.0
    dp_ridge: dict[str, float] = {}
    if job is None:
        progress.job_summaries.append(
            {
                "job_id": None,
                "purpose": kind,
                "round": None,
                "status": "done",
                "participants": participants,
                "contributors": contributors,
                "dropped": gathered.dropped,
                "secure": False,
                "vector_length": length,
            }
        )
    elif privacy is not None and plan is not None:
        release = privacy.record(job.job_hex, plan, contributors)
        ctx.store.dp_release(job.job_hex, kind, plan.to_json(), contributors, release)
        sigma = float(release["stddev_real_units"])
        dp_ridge[kind] = privacy.ridge(plan, sigma)
        if kind == "ccvr":
            dp_ridge["ffc-from-ccvr"] = privacy.ridge(plan, sigma, summed_blocks=classes)
        ctx.say(
            f"{kind} DP release: {plan.mechanism}, ε = {release['epsilon']:.4g} "
            f"at δ = {plan.delta:g} with {len(contributors)} contributors"
        )
    stats = unpack_statistics(kind, vector, dim, classes, isometric=plan is not None)
    tol = Tolerance(
        quantum=len(contributors) * 2.0**-job.spec.scale_bits if job is not None else 0.0,
        noise_sigma=sigma,
        truncation=2.0 ** (1 - plan.quant_bits) * math.sqrt(dim) if plan is not None else 0.0,
    )
    try:
        check_aggregate(stats, unit_norm=s.model.head in UNIT_NORM_HEADS, tol=tol)
        check_bound(
            f"the {kind} example count",
            statistics_count(stats),
            len(contributors),
            s.max_examples_per_site,
            noise_sigma=sigma,
            entries=classes if kind == "ccvr" else 1,
            sigmas=s.gate_sigmas,
        )
    except AggregateInvariantViolated as exc:
        if isinstance(exc, IntegrityCheckFailed):
            note(ctx, f"{kind} count bound", False, str(exc))
        refuse_aggregate(ctx, kind, job, contributors, exc)
        return None
    record: dict[str, Any] = {
        "contributors": sorted(contributors, key=ctx.registry.index_of),
        "samples": _samples(stats),
        "missing_classes": _missing_classes(stats, noised=plan is not None),
        "noise_sigma": sigma,
    }
    return _Summed(
        stats=stats,
        contributors=list(contributors),
        record=record,
        dp_ridge=dp_ridge,
        vector=vector,
        seconds=time.monotonic() - t0,
        noised=plan is not None,
    )


def calibrate(ctx: StageContext, model: GlobalModel, aggregates: Aggregates) -> Heads:
    """The calibrated heads that could be solved: ``"ffc"``, ``"ccvr"`` (weights) and
    the closed forms ``"ffc_bias"``, ``"lda"``, ``"qda"`` (``closed_forms``)."""
    s = ctx.settings
    progress = ctx.progress
    ctx.board.set_task(None, "calibrating")
    heads: Heads = {}
    ccvr = aggregates.get("ccvr")
    ffc = aggregates.get("ffc")
    if "ffc" in s.calibration.methods:
        source = (
            ffc
            if ffc is not None
            else (ccvr.to_ffc() if isinstance(ccvr, CCVRStatistics) else None)
        )
        if isinstance(source, FFCStatistics):
            t0 = time.monotonic()
            try:
                ridge = s.calibration.ffc_ridge
                dp_ridge = progress.dp_ridge.get("ffc" if ffc is not None else "ffc-from-ccvr")
                if dp_ridge is not None and dp_ridge > ridge:
                    ctx.say(f"ffc: ridge {dp_ridge:.4g} (≈ 2√l·σ of the DP noise)")
                    ridge = dp_ridge
                progress.results.setdefault("ffc_ridge", ridge)
                heads["ffc"], notes = ffc_classifier(source, ridge)
                for note in notes:
                    ctx.say(f"ffc: {note}")
            except ValueError as exc:
                record_statistics_failure(ctx, "ffc", f"solve failed: {exc}")
            progress.timings["ffc_s"] = time.monotonic() - t0
    if "ccvr" in s.calibration.methods and isinstance(ccvr, CCVRStatistics):
        t0 = time.monotonic()
        try:
            init = model.head_weight(progress.global_vector)
            heads["ccvr"], notes = ccvr_classifier(ccvr, init, s.calibration.ccvr, s.seed)
            for note in notes:
                ctx.say(f"ccvr: {note}")
            progress.results["ccvr"] = {
                "empty_classes": [int(c) for c in np.flatnonzero(ccvr.counts == 0)],
                "singleton_classes": [int(c) for c in np.flatnonzero(ccvr.counts == 1)],
            }
        except (ValueError, FloatingPointError) as exc:
            record_statistics_failure(ctx, "ccvr", f"calibration failed: {exc}")
        progress.timings["ccvr_s"] = time.monotonic() - t0
    if s.calibration.closed_forms:
        if isinstance(ccvr, CCVRStatistics):
            dp_ridge = progress.dp_ridge.get("ffc-from-ccvr")  # set only for a DP release
            heads.update(select_closed_forms(ctx, progress.global_vector, ccvr, dp_ridge=dp_ridge))
        else:
            for name in s.calibration.closed_forms:
                record_statistics_failure(ctx, name, "no CCVR statistics to solve from")
    return heads
