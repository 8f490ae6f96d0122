"""When each participant sent each secure-aggregation message, from the coordinator's
audit table, and how strongly those moments follow each site's example count: the
measurement behind issue #9's timing channel (``docs/threat_model.md``, "Timing").
Used by ``bench/timing_channel.py`` and the malicious-participant integration test,
so both read the audit table the same way — read-only, creating and changing nothing
beside the database (:mod:`spherecal.coordinator.state.read_only`: a plain connection
made ``state.db-wal``/``-shm`` beside a kept run's database, and checkpointed a
killed coordinator's WAL into it).

Why the statistics here and not a plain Pearson correlation: one secure job has 5 to
10 sites, so one job's correlation is a rough sign (five points reach |r| > 0.8 by
chance about one time in ten), and pooling raw offsets over runs mixes jobs whose
offsets differ in scale (the shared machine's load changes between runs). So
:func:`associate` measures the *within-job* association — each job's offsets and
counts centred on the job's mean, then one correlation over every job's points — and
judges it with a permutation test that shuffles the example counts among the sites of
each job (the null hypothesis: within a job, which site sent when is unrelated to its
example count), and a bootstrap interval over jobs (the job is the independent unit:
its sites share the load of the moment). The same on within-job *ranks* (a Spearman
correlation within jobs) keeps one job whose offsets spread wide under a burst of load
from carrying the figure alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.stats import rankdata

from spherecal.coordinator.state.read_only import read_only

__all__ = [
    "JOB_MESSAGES",
    "MESSAGES",
    "Association",
    "Job",
    "associate",
    "bootstrap_interval",
    "job_offsets",
    "job_purposes",
    "jobs_of",
    "message_offsets",
    "permutation_p_value",
    "within_job_correlation",
    "within_job_slope",
]

MESSAGES = {  # audit (stage, kind) of each message whose timing is measured
    "advertise": ("advertise", "SecAggSubmission"),
    "share": ("share", "SecAggSubmission"),
    "masked": ("masked", "MaskedChunk[0]"),
}

JOB_MESSAGES = {  # every message of a secure job the audit table records, in order
    **MESSAGES,
    "consistency": ("consistency", "SecAggSubmission"),
    "unmask": ("unmask", "SecAggSubmission"),
}

Job = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
"""One job's (example counts, offsets), one entry per site, in the same order."""


def job_offsets(db: Path, stage: str, kind: str, *, purpose: str) -> dict[str, dict[str, float]]:
    """Per job of ``purpose`` (by job id): seconds from the job's first accepted
    ``stage`` message to each sender's first, by sender (the coordinator's clock,
    ``state.db``'s audit table)."""
    with read_only(db) as conn:
        rows = conn.execute(
            "SELECT a.job, a.sender, a.ts FROM audit a JOIN jobs j ON a.job = j.job_id "
            "WHERE a.stage = ? AND a.kind = ? AND a.status = 'accepted' "
            "AND j.purpose = ? ORDER BY a.ts",
            (stage, kind, purpose),
        ).fetchall()
    jobs: dict[str, dict[str, float]] = {}
    for job, sender, ts in rows:
        jobs.setdefault(job, {}).setdefault(sender, ts)
    out: dict[str, dict[str, float]] = {}
    for job, senders in jobs.items():
        start = min(senders.values())
        out[job] = {sender: ts - start for sender, ts in senders.items()}
    return out


def message_offsets(
    db: Path, stage: str, kind: str, *, purpose: str = "update"
) -> dict[str, list[float]]:
    """Per job of ``purpose``: seconds from the job's first accepted ``stage`` message
    to each sender's, by sender (the coordinator's clock, ``state.db``'s audit table)."""
    out: dict[str, list[float]] = {}
    for senders in job_offsets(db, stage, kind, purpose=purpose).values():
        for sender, offset in senders.items():
            out.setdefault(sender, []).append(offset)
    return out


def job_purposes(db: Path) -> list[str]:
    """The purposes of the secure jobs in ``db`` (``update``, ``ffc``, ``ccvr``,
    ``evaluate``, …), sorted."""
    with read_only(db) as conn:
        return sorted(str(p) for (p,) in conn.execute("SELECT DISTINCT purpose FROM jobs"))


def _centred(jobs: Sequence[Job], *, ranks: bool = False) -> list[Job]:
    """Each job's counts and offsets minus the job's means (jobs of one site dropped:
    they say nothing about an order); with ``ranks``, their ranks within the job
    (ties averaged) instead of the values."""
    out = []
    for counts, offsets in jobs:
        x = np.asarray(counts, dtype=np.float64)
        y = np.asarray(offsets, dtype=np.float64)
        if x.shape != y.shape or x.ndim != 1:
            raise ValueError(f"a job needs one count per offset, got {x.shape} and {y.shape}")
        if x.size >= 2:
            if ranks:
                x, y = rankdata(x), rankdata(y)
            out.append((x - x.mean(), y - y.mean()))
    return out


def _r(centred: Sequence[Job]) -> float:
    sxy = sum(float(x @ y) for x, y in centred)
    sxx = sum(float(x @ x) for x, _ in centred)
    syy = sum(float(y @ y) for _, y in centred)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def within_job_correlation(jobs: Sequence[Job], *, ranks: bool = False) -> float:
    """Pearson correlation of offsets with example counts after centring both on
    each job's mean: how strongly, within a job, a larger site sends later (0 when
    either side does not vary). With ``ranks``, of their ranks within each job (a
    Spearman correlation within jobs): one job whose offsets spread wide under a
    burst of load then weighs no more than any other."""
    return _r(_centred(jobs, ranks=ranks))


def within_job_slope(jobs: Sequence[Job]) -> float:
    """Least-squares seconds of offset per example, within jobs (the effect's size:
    how much later a site with one more example sends)."""
    centred = _centred(jobs)
    sxx = sum(float(x @ x) for x, _ in centred)
    return sum(float(x @ y) for x, y in centred) / sxx if sxx > 0 else 0.0


def permutation_p_value(
    jobs: Sequence[Job], *, permutations: int = 10_000, seed: int = 0, ranks: bool = False
) -> float:
    """Two-sided p-value of :func:`within_job_correlation` (``ranks``: of its rank
    form) under the null that the example counts are exchangeable among the sites of
    each job: the share of
    ``permutations`` shuffles (counts permuted within every job, independently) whose
    |r| reaches the observed one, counted with the observation itself
    (``(1 + hits) / (1 + permutations)``, never 0). Shuffling keeps every job's
    centred sums of squares, so only the cross term is recomputed (vectorised)."""
    centred = _centred(jobs, ranks=ranks)
    observed = abs(_r(centred))
    sxx = sum(float(x @ x) for x, _ in centred)
    syy = sum(float(y @ y) for _, y in centred)
    if sxx == 0 or syy == 0:
        return 1.0
    rng = np.random.default_rng(seed)
    cross = np.zeros(permutations)
    for x, y in centred:
        shuffled = rng.permuted(np.broadcast_to(x, (permutations, x.size)), axis=1)
        cross += shuffled @ y
    r = np.abs(cross) / math.sqrt(sxx * syy)
    hits = int(np.count_nonzero(r >= observed * (1 - 1e-12)))
    return (1 + hits) / (1 + permutations)


def bootstrap_interval(
    jobs: Sequence[Job], *, resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile interval of :func:`within_job_correlation` over ``resamples`` draws
    of the jobs with replacement (the job, not the site, is the independent unit).
    ``None`` with fewer than 3 jobs: their resamples say nothing about the spread."""
    centred = _centred(jobs)
    if len(centred) < 3:
        return None
    sxy = np.array([float(x @ y) for x, y in centred])
    sxx = np.array([float(x @ x) for x, _ in centred])
    syy = np.array([float(y @ y) for _, y in centred])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(centred), size=(resamples, len(centred)))
    num, dx, dy = sxy[picks].sum(1), sxx[picks].sum(1), syy[picks].sum(1)
    denominator = np.sqrt(dx * dy)
    r = np.divide(num, denominator, out=np.zeros(resamples), where=denominator > 0)
    tail = (1 - level) / 2
    low, high = np.quantile(r, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Association:
    """How one message's offsets follow the example count over a set of jobs."""

    jobs: int
    points: int
    """(job, site) pairs behind the figure."""
    correlation: float
    """:func:`within_job_correlation`."""
    p_value: float
    """:func:`permutation_p_value` (two-sided)."""
    rank_correlation: float
    """:func:`within_job_correlation` of ranks (robust to one job's wide spread)."""
    rank_p_value: float
    """:func:`permutation_p_value` of ranks."""
    interval_95: tuple[float, float] | None
    """:func:`bootstrap_interval` (None with fewer than 3 jobs)."""
    ms_per_100_examples: float
    """:func:`within_job_slope`, in milliseconds per 100 examples."""
    max_offset_s: float
    note: str
    """What the figure supports, in words (few points, or no evidence)."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["interval_95"] = list(self.interval_95) if self.interval_95 is not None else None
        return out


def associate(
    jobs: Sequence[Job], *, permutations: int = 10_000, resamples: int = 2000, seed: int = 0
) -> Association:
    """Every figure of :class:`Association` for ``jobs``, with a plain note on what it
    supports: evidence of an association needs p < 0.05 on the values *and* on the
    ranks (on the values alone it may be one loaded job's doing, on the ranks alone an
    order too small to matter), and enough points (20). The note does not correct for
    the many figures a report holds: of 20 without any association, one reaches
    p < 0.05 by chance about two times in three."""
    centred = _centred(jobs)
    points = sum(x.size for x, _ in centred)
    r = _r(centred)
    p = permutation_p_value(jobs, permutations=permutations, seed=seed)
    p_ranks = permutation_p_value(jobs, permutations=permutations, seed=seed, ranks=True)
    if points < 20:
        note = f"{points} points: too few for more than a rough sign, whatever p says"
    elif (p < 0.05) != (p_ranks < 0.05):
        shown = "values" if p < 0.05 else "ranks"
        note = f"p < 0.05 on the {shown} only: not a consistent trend"
    elif p < 0.05:
        note = f"offsets {'rise' if r > 0 else 'fall'} with the example count (p < 0.05)"
    else:
        note = "no evidence of an association (p >= 0.05)"
    return Association(
        jobs=len(centred),
        points=points,
        correlation=r,
        p_value=p,
        rank_correlation=within_job_correlation(jobs, ranks=True),
        rank_p_value=p_ranks,
        interval_95=bootstrap_interval(jobs, resamples=resamples, seed=seed),
        ms_per_100_examples=within_job_slope(jobs) * 100 * 1000,
        max_offset_s=max((float(np.max(y)) for _, y in jobs if len(y)), default=0.0),
        note=note,
    )


def jobs_of(offsets: Mapping[str, Mapping[str, float]], counts: Mapping[str, int]) -> list[Job]:
    """:func:`job_offsets`' answer paired with each sender's example count (senders
    without a known count left out)."""
    out: list[Job] = []
    for senders in offsets.values():
        known = [(counts[s], t) for s, t in sorted(senders.items()) if s in counts]
        if known:
            out.append((np.array([c for c, _ in known], float), np.array([t for _, t in known])))
    return out
