"""Cross-checks between independent sums, the per-site bound and the validation gate's
arithmetic (issue #22), on real statistics of random unit features and a real
coordinator ``Store`` — the attacks come from ``spherecal.participant.adversary``,
the participant's own test-only attack code, so the sums here are what a dishonest
site would really send.

Each rule has its mutation check: the attack passes the structural invariants (the
defence before this issue), and only the new check refuses it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from spherecal.audit_integrity import check_integrity
from spherecal.coordinator.driver.integrity import (
    IntegrityCheckFailed,
    check_bound,
    check_evaluation_counts,
    cross_check_evaluations,
    cross_check_statistics,
    integrity_reasons,
    integrity_record,
)
from spherecal.coordinator.driver.invariants import Tolerance, check_ccvr
from spherecal.coordinator.driver.stages import StageContext
from spherecal.coordinator.driver.validation_gate import margin, noise_band
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.summary_schema import RoundMetrics
from spherecal.participant.adversary import Adversary, parse_adversary
from spherecal.participant.example_weight import draw_example_count
from spherecal.spherefed.classifier import fixed_classifier
from spherecal.spherefed.stats import CCVRStatistics, ccvr_statistics
from tests.unit.coordinator.helpers import stage_context

ROSTER = ("p0", "p1", "p2", "p3", "p4")
DIM, CLASSES = 16, 10


def _site(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, DIM)).astype(np.float32).astype(np.float64)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return z, rng.integers(0, CLASSES, size=n)


def _federation(adversary: Adversary | None) -> tuple[CCVRStatistics, int]:
    """The CCVR sum of five sites (the last one possibly dishonest) and Σ n_k."""
    w = fixed_classifier(CLASSES, DIM, seed=3)
    total = np.zeros(0)
    n_total = 0
    for k in range(5):
        z, y = _site(k, 40 + 10 * k)
        n_total += len(y)
        honest = ccvr_statistics(z, y, CLASSES).pack()
        if adversary is not None and k == 4:
            honest = adversary.statistics(
                "ccvr", honest, features=z, labels=y, classifier=np.asarray(w, dtype=np.float64)
            )
        total = honest if total.size == 0 else total + honest
    return CCVRStatistics.unpack(total, DIM, CLASSES), n_total


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[StageContext]:
    """Sites that send their exact example counts (``example_count_noise_sd = 0``):
    every check at its exact tolerance."""
    settings = CoordinatorSettings(
        participants=ROSTER, state_dir=tmp_path, example_count_noise_sd=0
    )
    with stage_context(settings, tmp_path) as ctx:
        yield ctx


@pytest.fixture
def noised_ctx(tmp_path: Path) -> Iterator[StageContext]:
    """The default: each site's training weight carries noise of sd 4, once."""
    settings = CoordinatorSettings(participants=ROSTER, state_dir=tmp_path)
    assert settings.example_count_noise_sd == 4
    with stage_context(settings, tmp_path) as ctx:
        yield ctx


def _rounds(ctx: StageContext, weight: float) -> None:
    for r in (1, 2):
        ctx.progress.round_metrics.append(
            cast(RoundMetrics, {"round": r, "contributors": list(ROSTER), "weight": weight})
        )
    ctx.progress.results["statistics"] = {"ccvr": {"contributors": list(ROSTER)}}


@pytest.mark.parametrize("spec", ["directions:100000", "relabel:300", "replace"])
def test_the_attacks_pass_the_structural_invariants(spec: str) -> None:
    """The premise of issue #22: what the dishonest site sends is a possible sum."""
    stats, _ = _federation(parse_adversary(spec))
    check_ccvr(stats, unit_norm=True, tol=Tolerance(quantum=1e-6 * float(stats.counts.sum())))


def test_honest_statistics_agree_with_the_training_weights(ctx: StageContext) -> None:
    stats, n = _federation(None)
    _rounds(ctx, float(n))
    aggregates: dict = {"ccvr": stats}
    cross_check_statistics(ctx, aggregates, {})
    assert "ccvr" in aggregates
    (check,) = integrity_record(ctx.progress)["checks"]
    assert check["passed"] and "2 round(s) agree" in check["detail"]
    assert integrity_reasons(ctx.progress) == []


@pytest.mark.parametrize("spec", ["directions:100000", "relabel:300", "directions:1"])
def test_inflated_counts_disagree_with_the_training_weights_and_are_refused(
    ctx: StageContext, spec: str
) -> None:
    stats, n = _federation(parse_adversary(spec))
    _rounds(ctx, float(n))
    aggregates: dict = {"ccvr": stats}
    cross_check_statistics(ctx, aggregates, {})
    assert aggregates == {}  # no classifier from sums that contradict the training
    assert any("aggregate refused: cross-check" in e for e in ctx.progress.errors)
    (reason,) = integrity_reasons(ctx.progress)
    assert f"Σ n_k = {n}" in reason and "training weights vs ccvr count" in reason
    events = [m for _, m in _events(ctx)]
    assert any("integrity check failed" in m for m in events)


def test_a_training_weight_claim_disagrees_with_honest_statistics(ctx: StageContext) -> None:
    """Row 5 of the table: the update claims weight 10⁵, the statistics are honest."""
    stats, n = _federation(None)
    _rounds(ctx, float(n - 302 + 100_000))
    aggregates: dict = {"ccvr": stats}
    cross_check_statistics(ctx, aggregates, {})
    assert aggregates == {}


def test_the_noise_widens_the_tolerance_and_only_so_far(ctx: StageContext) -> None:
    stats, n = _federation(None)
    _rounds(ctx, float(n) + 20.0)  # 20 examples off
    aggregates: dict = {"ccvr": stats}
    cross_check_statistics(ctx, aggregates, {"ccvr": 5.0})  # 3 · 5 · √10 ≈ 47 > 20
    assert "ccvr" in aggregates
    aggregates = {"ccvr": stats}
    cross_check_statistics(ctx, aggregates, {"ccvr": 1.0})  # ≈ 9.5 < 20
    assert aggregates == {}


def test_released_weights_agree_with_honest_statistics(noised_ctx: StageContext) -> None:
    """Sites weight their updates by their counts drawn with noise (the participant's
    own draw, ``spherecal.participant.example_weight``): honest statistics agree."""
    stats, n = _federation(None)
    for _ in range(20):
        released = sum(draw_example_count("f", b"", 40 + 10 * k, 4).released for k in range(5))
        noised_ctx.progress.round_metrics.clear()
        _rounds(noised_ctx, float(released))
        aggregates: dict = {"ccvr": stats}
        cross_check_statistics(noised_ctx, aggregates, {})
        assert "ccvr" in aggregates, released - n
    assert integrity_reasons(noised_ctx.progress) == []


@pytest.mark.parametrize("spec", ["directions:100000", "relabel:300", "directions:10"])
def test_the_weights_noise_still_refuses_inflated_counts(
    noised_ctx: StageContext, spec: str
) -> None:
    stats, n = _federation(parse_adversary(spec))
    _rounds(noised_ctx, float(n))
    aggregates: dict = {"ccvr": stats}
    cross_check_statistics(noised_ctx, aggregates, {})
    assert aggregates == {}


def test_the_weights_noise_widens_the_tolerance_by_six_sds(noised_ctx: StageContext) -> None:
    """Five contributors' weights, each off by noise of sd 4: ``6 · 4 · √5 ≈ 53.7``
    examples — also what one dishonest site can add unseen (the validation gate's)."""
    stats, n = _federation(None)
    for off, agrees in ((53.0, True), (-53.0, True), (55.0, False), (-55.0, False)):
        noised_ctx.progress.round_metrics.clear()
        _rounds(noised_ctx, float(n) + off)
        aggregates: dict = {"ccvr": stats}
        cross_check_statistics(noised_ctx, aggregates, {})
        assert ("ccvr" in aggregates) is agrees, off


def test_rounds_over_other_contributors_are_not_compared(ctx: StageContext) -> None:
    stats, n = _federation(None)
    ctx.progress.round_metrics.append(
        cast(RoundMetrics, {"round": 1, "contributors": ["p0"], "weight": 1.0})
    )
    ctx.progress.results["statistics"] = {"ccvr": {"contributors": list(ROSTER)}}
    aggregates: dict = {"ccvr": stats}
    cross_check_statistics(ctx, aggregates, {})
    assert "ccvr" in aggregates and integrity_record(ctx.progress)["checks"] == []


def test_the_bound_caps_the_sum_at_contributors_times_the_per_site_maximum() -> None:
    check_bound("count", 5 * 1000, 5, 1000)
    with pytest.raises(IntegrityCheckFailed, match="exceeds 5 contributors") as info:
        check_bound("count", 5 * 1000 + 1, 5, 1000)
    assert info.value.invariant == "bound"
    stats, _ = _federation(parse_adversary("directions:100000"))
    with pytest.raises(IntegrityCheckFailed):
        check_bound("count", float(stats.counts.sum()), 5, 100_000)
    check_bound("count", 5 * 1000 + 5, 5, 1000, noise_sigma=2.0, sigmas=3.0)  # within 6·2
    check_bound("count", 5 * 1000 + 11, 5, 1000, noise_sigma=2.0, sigmas=3.0)  # 5.5 sd: noise
    with pytest.raises(IntegrityCheckFailed):  # beyond what DP noise reaches (6 sd)
        check_bound("count", 5 * 1000 + 13, 5, 1000, noise_sigma=2.0, sigmas=3.0)


def test_evaluation_counts_are_bounded_by_their_total() -> None:
    check_evaluation_counts(100, {"none": 80, "ccvr": 100}, 5, 1000)
    with pytest.raises(IntegrityCheckFailed, match="101 correct of 100"):
        check_evaluation_counts(100, {"none": 80, "ccvr": 101}, 5, 1000)
    with pytest.raises(IntegrityCheckFailed, match="bound"):
        check_evaluation_counts(5001, {"none": 0}, 5, 1000)


def test_evaluations_of_one_split_and_model_must_agree(ctx: StageContext) -> None:
    evaluations = integrity_record(ctx.progress)["evaluations"]
    base = {"split": "validation", "model": "m", "contributors": list(ROSTER)}
    evaluations.append({**base, "total": 135, "correct": {"none": 100, "ffc": 120}})
    evaluations.append({**base, "total": 135, "correct": {"none": 100, "ccvr": 3}})
    cross_check_evaluations(ctx)
    assert all(c["passed"] for c in integrity_record(ctx.progress)["checks"])
    evaluations.append({**base, "total": 140, "correct": {"none": 104}})
    cross_check_evaluations(ctx)
    failed = [c for c in integrity_record(ctx.progress)["checks"] if not c["passed"]]
    assert {c["check"] for c in failed} == {"validation totals", "validation uncalibrated counts"}


def test_the_gate_margin_is_the_uncertainty_of_a_difference() -> None:
    # 135 samples at 0.74 and 0.84: 3 · √((0.74·0.26 + 0.84·0.16)/135) ≈ 0.148
    assert margin(0.74, 0.84, 135, sigmas=3.0) == pytest.approx(0.148, abs=1e-3)
    assert margin(0.74, 0.06, 135, sigmas=3.0) < 0.74 - 0.06  # CCVR wrecked: rejected
    assert margin(0.5, 0.5, 0, sigmas=3.0) == float("inf")  # no samples: no decision
    assert margin(0.5, 0.5, 100, sigmas=3.0, noise_sigma=10.0) > margin(0.5, 0.5, 100, sigmas=3.0)


def test_the_audit_integrity_section_fails_on_any_failed_check_rejection_or_flag(
    ctx: StageContext,
) -> None:
    record = integrity_record(ctx.progress, ctx.settings)
    record["gate"]["heads"]["ffc"] = {"shipped": True, "reason": "no worse"}
    ctx.store.set_meta("integrity", json.dumps(record))
    conn = sqlite3.connect(ctx.store.path)
    try:
        ok = check_integrity(conn)
        assert ok["ok"] and "each site bounded at 100000 examples" in ok["summary"]
        record["gate"]["heads"]["ccvr"] = {"shipped": False, "reason": "0.06 < 0.74"}
        ctx.store.set_meta("integrity", json.dumps(record))
        bad = check_integrity(conn)
        assert not bad["ok"] and bad["violations"] == [
            {"rejected_head": "ccvr", "reason": "0.06 < 0.74"}
        ]
    finally:
        conn.close()


def _events(ctx: StageContext) -> list[tuple[str, str]]:
    rows = ctx.store.query("SELECT level, message FROM events")  # after the queued writes
    return [(str(level), str(message)) for level, message in rows]


def test_the_noise_band_is_the_noise_term_of_the_margin_and_zero_for_exact_counts() -> None:
    assert noise_band(100, sigmas=3.0, noise_sigma=0.0) == 0.0
    assert noise_band(0, sigmas=3.0, noise_sigma=2.0) == 0.0
    band = noise_band(100, sigmas=3.0, noise_sigma=2.0)
    assert band == pytest.approx(3.0 * 2.0**0.5 * 2.0 / 100)
    # the margin is sampling uncertainty plus exactly this band
    with_noise = margin(0.8, 0.8, 100, sigmas=3.0, noise_sigma=2.0)
    assert with_noise - margin(0.8, 0.8, 100, sigmas=3.0) == pytest.approx(band)
    assert band < with_noise
