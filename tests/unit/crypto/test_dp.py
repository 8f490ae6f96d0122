"""Distributed-DP noise in the ring: exact samplers, sizing, bounds, overflow refusal.

Distribution tests draw from ``RandomSource.deterministic`` so they are reproducible
(a fixed seed cannot flake); :func:`test_goodness_of_fit_has_power` shows the same
test rejects samplers that are only slightly wrong, so passing means something.
"""

from __future__ import annotations

import decimal
import math
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from spherecal.crypto import InvalidSpec, JobSpec, run_protocol
from spherecal.crypto.dp import (
    DGAUSS,
    SKELLAM,
    NoiseTooLarge,
    RingOverflowRisk,
    check_ring_headroom,
    guaranteed_contributors,
    max_noise_bound,
    noise_bound_for,
    plan_noise,
    realised_noise,
    sample_noise,
    tail_log2_probability,
    verify_plan,
)
from spherecal.crypto.entropy import RandomSource
from spherecal.crypto.exact import (
    _count_below,
    _leading_j,
    bernoulli_exp,
    bernoulli_exp_scalar,
    discrete_gaussian,
    discrete_laplace,
    geometric_exp1,
    lazy_less,
)
from spherecal.crypto.poisson import (
    accept_bounds,
    envelope,
    log_accept,
    poisson,
    skellam,
    slow_accept,
)
from spherecal.crypto.ring import RING_DTYPE, decode, encode

P_MIN = 1e-6  # fixed seeds: a p-value below this is a real discrepancy, not bad luck


def src(label: str) -> RandomSource:
    return RandomSource.deterministic(label)


def gof_pvalue(samples: npt.NDArray[np.int64], pmf: npt.NDArray[np.float64], lo: int) -> float:
    """Chi-square goodness of fit of integer samples against ``pmf`` on ``lo..lo+len-1``;
    cells with expected count < 10 are pooled into the two tails."""
    n = samples.size
    counts = np.bincount(samples - lo, minlength=pmf.size)[: pmf.size].astype(np.float64)
    expected = pmf * n
    keep = expected >= 10
    first, last = np.flatnonzero(keep)[[0, -1]]
    obs = [counts[: first + 1].sum(), *counts[first + 1 : last], n - counts[:last].sum()]
    exp = [expected[: first + 1].sum(), *expected[first + 1 : last], n - expected[:last].sum()]
    return float(stats.chisquare(obs, exp).pvalue)


def laplace_pmf(t: int, ks: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    w = np.exp(-np.abs(ks) / t)
    return w / (1 + 2 * np.exp(-1 / t) / (1 - np.exp(-1 / t)))


def dgauss_pmf(sigma: int, ks: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    wide = np.arange(-40 * sigma - 40, 40 * sigma + 41)
    norm = np.exp(-(wide.astype(float) ** 2) / (2 * sigma**2)).sum()
    return np.exp(-(ks.astype(float) ** 2) / (2 * sigma**2)) / norm


# ------------------------------------------------------------------ entropy
def test_uniform_below_is_uniform_and_in_range() -> None:
    x = src("uniform").uniform(60_000, 7)
    assert x.min() >= 0 and x.max() <= 6
    assert gof_pvalue(x, np.full(7, 1 / 7), 0) > P_MIN
    big = src("uniform-big").uniform(10_000, (1 << 63) - 25)
    assert big.min() >= 0 and big.max() < (1 << 63) - 25


def test_per_entry_bounds_and_big_integers() -> None:
    s = src("below")
    m = np.array([1, 2, 3, 1000, (1 << 62) + 1] * 2000)
    x = s.below(m)
    assert (x >= 0).all() and (x < m).all() and (x[m == 1] == 0).all()
    assert all(0 <= s.below_int((1 << 200) + 7) < (1 << 200) + 7 for _ in range(50))


def test_bernoulli_with_one_denominator() -> None:
    s = src("bernoulli")
    for num, den in ((0, 5), (5, 5), (1, 3), (7, 1 << 40)):
        b = s.bernoulli(np.full(200_000, num), den)
        p = num / den
        assert abs(b.mean() - p) <= 5 * math.sqrt(p * (1 - p) / b.size) + 1e-12


def test_default_sources_are_fresh_and_test_sources_reproducible() -> None:
    assert not np.array_equal(RandomSource().words(8), RandomSource().words(8))
    assert np.array_equal(src("x").words(8), src("x").words(8))
    assert not np.array_equal(src("x").words(8), src("y").words(8))


# ---------------------------------------------------------- exact primitives
@pytest.mark.parametrize(("num", "den"), [(0, 7), (1, 7), (7, 7), (3, 2), (25, 4)])
def test_bernoulli_exp_frequency(num: int, den: int) -> None:
    b = bernoulli_exp(src(f"bexp{num}/{den}"), np.full(300_000, num), den)
    p = math.exp(-num / den)
    assert abs(b.mean() - p) <= 5 * math.sqrt(p * (1 - p) / b.size) + 1e-12


def test_bernoulli_exp_scalar_handles_big_integers() -> None:
    s = src("bexp-scalar")
    num, den = 3 * (1 << 70), 4 * (1 << 70)  # γ = 3/4 with 72-bit integers
    hits = sum(bernoulli_exp_scalar(s, num, den) for _ in range(20_000))
    p = math.exp(-0.75)
    assert abs(hits / 20_000 - p) <= 5 * math.sqrt(p * (1 - p) / 20_000)


def test_geometric_matches_exp_law() -> None:
    v = geometric_exp1(src("geom"), 200_000)
    ks = np.arange(0, 30)
    pmf = np.exp(-ks) * (1 - math.exp(-1))
    assert gof_pvalue(v, pmf, 0) > P_MIN


def test_threshold_counts_and_ties() -> None:
    asc = np.array([10, 20, 30, 40], dtype=np.uint64)  # thresholds 40 > 30 > 20 > 10
    u = np.array([5, 10, 15, 30, 39, 40, 41], dtype=np.uint64)
    count, tie = _count_below(u, asc)
    assert count.tolist() == [4, 3, 3, 1, 1, 0, 0]
    assert tie.tolist() == [-1, 3, -1, 1, -1, 0, -1]


def test_lazy_comparison_on_a_tie_has_the_exact_conditional_probability() -> None:
    # U's first word equals floor(2^64/6): U < 1/6 iff the remaining bits are below
    # the fractional part (2^64/6 - floor) = (2^64 mod 6)/6.
    s = src("lazy")
    first = (1 << 64) // 6
    p = ((1 << 64) % 6) / 6
    hits = sum(
        lazy_less(s, first, lambda _d: (Fraction(1, 6), Fraction(1, 6))) for _ in range(6000)
    )
    assert abs(hits / 6000 - p) <= 5 * math.sqrt(p * (1 - p) / 6000)


def test_leading_j_law() -> None:
    j = _leading_j(src("J"), 200_000)
    ks = np.arange(1, 12)
    pmf = np.array([1 / math.factorial(k) - 1 / math.factorial(k + 1) for k in ks])
    assert gof_pvalue(j, pmf, 1) > P_MIN


@pytest.mark.parametrize("t", [1, 3, 50])
def test_discrete_laplace_matches_pmf(t: int) -> None:
    x = discrete_laplace(src(f"dlap{t}"), 200_000, t)
    ks = np.arange(-40 * t, 40 * t + 1)
    assert gof_pvalue(x, laplace_pmf(t, ks), -40 * t) > P_MIN


@pytest.mark.parametrize("sigma", [1, 2, 7])
def test_discrete_gaussian_matches_pmf(sigma: int) -> None:
    x = discrete_gaussian(src(f"dg{sigma}"), 200_000, sigma)
    ks = np.arange(-12 * sigma, 12 * sigma + 1)
    assert gof_pvalue(x, dgauss_pmf(sigma, ks), -12 * sigma) > P_MIN


def test_discrete_gaussian_large_sigma_moments() -> None:
    sigma = 3_000_000
    x = discrete_gaussian(src("dg-large"), 200_000, sigma).astype(np.float64)
    assert abs(x.mean()) < 5 * sigma / math.sqrt(x.size)
    assert abs(x.var() / sigma**2 - 1) < 5 * math.sqrt(2 / x.size)
    assert abs(stats.kurtosis(x)) < 0.05  # Gaussian shape, not Laplace (kurtosis 3)


# ------------------------------------------------------------------ Poisson
@pytest.mark.parametrize("mu", [1, 3, 40, 300, 5000])
def test_poisson_matches_pmf(mu: int) -> None:
    x = poisson(src(f"pois{mu}"), 150_000, mu)
    hi = mu + 12 * math.isqrt(mu) + 30
    ks = np.arange(0, hi)
    assert gof_pvalue(x, stats.poisson.pmf(ks, mu), 0) > P_MIN


@pytest.mark.parametrize("mu", [10**9, 1 << 50])
def test_poisson_huge_mean_moments(mu: int) -> None:
    x = poisson(src(f"pois-huge{mu}"), 100_000, mu).astype(np.float64)
    assert abs(x.mean() - mu) < 5 * math.sqrt(mu / x.size)
    assert abs(x.var() / mu - 1) < 5 * math.sqrt(2 / x.size)
    assert abs(stats.skew(x) - 1 / math.sqrt(mu)) < 5 * math.sqrt(6 / x.size)


def _true_log_accept(mu: int, y: int) -> Fraction:
    """``ln A(y)`` to ~40 digits (independent of the code under test's float paths)."""
    lo, hi = accept_bounds(envelope(mu), y, 60)
    ctx = decimal.Context(prec=50)
    mid = (lo + hi) / 2
    return Fraction(
        ctx.ln(ctx.divide(decimal.Decimal(mid.numerator), decimal.Decimal(mid.denominator)))
    )


@pytest.mark.parametrize("mu", [1, 5, 2047, 2048, 10**6, 10**12, 1 << 50])
def test_fast_path_error_bound_covers_the_true_error(mu: int) -> None:
    env = envelope(mu)
    s = env.scale
    candidates = {0, 1, -1, 2, -2, s, -s, 3 * s, -3 * s, 10 * s, -10 * s, 40 * s, mu // 2}
    candidates.add(-(mu // 2))
    ys = sorted(y for y in candidates if mu + y >= 0 and abs(y) <= 10**7)
    ln_a, err = log_accept(env, np.array(ys, dtype=np.int64))
    for y, got, bound in zip(ys, ln_a, err, strict=True):
        if not math.isfinite(bound):
            continue  # uncertified: the slow path decides those
        true = _true_log_accept(mu, y)
        assert abs(Fraction(float(got)) - true) <= Fraction(float(bound)) / 16, (mu, y)
        assert float(true) <= 1e-9  # the envelope holds: A <= 1


def test_slow_path_decides_consistently_with_exact_bounds() -> None:
    s = src("slow")
    for mu, y in ((3, 1), (3, -3), (5000, 70), (10**12, -2_000_000)):
        lo, hi = accept_bounds(envelope(mu), y, 60)
        a = float((lo + hi) / 2)
        for u53 in (0, int(a * 2**53) - 10, int(a * 2**53) + 10, (1 << 53) - 1):
            u53 = min(max(u53, 0), (1 << 53) - 1)
            expected = (u53 + 1) / 2**53 <= a
            assert slow_accept(s, envelope(mu), y, u53) == expected


@pytest.mark.parametrize("mu", [2, 3000])
def test_poisson_stays_exact_when_every_decision_takes_the_slow_path(
    mu: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spherecal.crypto.poisson as P

    monkeypatch.setattr(P, "_SAFETY", 1e15)  # no float certificate: all decisions exact
    x = poisson(src(f"pois-slow{mu}"), 6000, mu)
    ks = np.arange(0, mu + 12 * math.isqrt(mu) + 30)
    assert gof_pvalue(x, stats.poisson.pmf(ks, mu), 0) > P_MIN


@pytest.mark.parametrize("mu", [1, 4, 30])
def test_skellam_matches_pmf(mu: int) -> None:
    x = skellam(src(f"sk{mu}"), 150_000, mu)
    r = 12 * math.isqrt(2 * mu) + 20
    ks = np.arange(-r, r + 1)
    assert gof_pvalue(x, stats.skellam.pmf(ks, mu, mu), -r) > P_MIN


def test_goodness_of_fit_has_power() -> None:
    """The same test with the same sample size rejects near-misses: Poisson(μ+1)
    passed off as Poisson(μ), and a rounded continuous Gaussian as N_Z(0, σ²)."""
    mu = 40
    x = poisson(src("power"), 150_000, mu + 1)
    ks = np.arange(0, mu + 100)
    assert gof_pvalue(x, stats.poisson.pmf(ks, mu), 0) < P_MIN
    sigma = 1
    g = np.rint(np.random.default_rng(0).normal(0, sigma, 200_000)).astype(np.int64)
    kg = np.arange(-12 * sigma, 12 * sigma + 1)
    assert gof_pvalue(g, dgauss_pmf(sigma, kg), -12 * sigma) < P_MIN


# ---------------------------------------------------------- sizing and plans
@pytest.mark.parametrize("mechanism", [SKELLAM, DGAUSS])
def test_any_t_contributors_reach_the_target(mechanism: str) -> None:
    target = 1e6
    plan = plan_noise(target, min_contributors=3, participants=7, length=50, mechanism=mechanism)
    for m in range(3, 8):
        realised = realised_noise(plan, m)
        assert realised.meets_target and realised.total_variance >= target
    assert not realised_noise(plan, 2).meets_target
    # Empirically: the sum of any 3 participants' vectors has at least the target variance.
    s = src(f"sum-{mechanism}")
    draws = np.stack([sample_noise(plan, source=s) for _ in range(3)])
    many = sample_noise(plan, source=s, count=6000)  # 6000 vectors of 50 entries
    summed = many.reshape(2000, 3, 50).sum(axis=1).astype(np.float64)
    var = summed.var()
    assert var >= target * (1 - 5 * math.sqrt(2 / summed.size))
    assert abs(var / (3 * plan.participant_variance) - 1) < 5 * math.sqrt(2 / summed.size)
    assert draws.shape == (3, 50)


def test_colluders_are_subtracted() -> None:
    plan = plan_noise(9e6, min_contributors=5, participants=8, length=10, colluders=2)
    assert plan.participant_variance >= 3e6
    assert realised_noise(plan, 5).honest_contributors == 3
    assert realised_noise(plan, 5).meets_target
    with pytest.raises(InvalidSpec):
        plan_noise(1.0, min_contributors=2, participants=3, length=1, colluders=2)


def test_sampler_limits_are_refused() -> None:
    with pytest.raises(NoiseTooLarge):
        plan_noise(1e17, min_contributors=1, participants=2, length=1, mechanism=SKELLAM)
    with pytest.raises(NoiseTooLarge):
        plan_noise(1e17, min_contributors=1, participants=2, length=1, mechanism=DGAUSS)


@pytest.mark.parametrize(("mechanism", "param"), [(SKELLAM, 3), (SKELLAM, 500), (DGAUSS, 4)])
def test_chernoff_tail_bounds_dominate_the_exact_tail(mechanism: str, param: int) -> None:
    for b in (1, 5, 20, 60):
        if mechanism == SKELLAM:
            exact = 2 * stats.skellam.sf(b, param, param)
        else:
            ks = np.arange(b + 1, b + 400 * param)
            exact = 2 * dgauss_pmf(param, ks).sum()
        assert exact <= 2.0 ** tail_log2_probability(mechanism, param, b) * (1 + 1e-9)


def test_noise_bound_is_about_eleven_deviations_and_tail_is_tiny() -> None:
    bound, tail = noise_bound_for(SKELLAM, 10**8, length=13_000_000, participants=100)
    sd = math.sqrt(2 * 10**8)
    assert 10 < bound / sd < 13 and tail <= 2.0**-64
    assert bound - 1 < sd * 13
    smaller, _ = noise_bound_for(SKELLAM, 10**8, length=13_000_000, participants=100, tail_log2=-20)
    assert smaller < bound


def test_sampled_noise_respects_the_bound_by_redrawing() -> None:
    plan = plan_noise(2e4, min_contributors=1, participants=2, length=20_000)
    tight = replace(plan, noise_bound=30)  # ~0.3 sd: forces many redraws
    x = sample_noise(tight, source=src("tight"))
    assert np.abs(x).max() <= 30 and x.dtype == np.int64 and x.shape == (20_000,)
    # redrawing gives the truncated law: symmetric, inside the bound
    assert abs(x.mean()) < 5 * x.std() / math.sqrt(x.size)


def test_plan_round_trips_through_json() -> None:
    plan = plan_noise(1234.5, min_contributors=2, participants=3, length=9, mechanism=DGAUSS)
    assert type(plan).from_json(plan.to_json()) == plan


# ------------------------------------------------------------------ overflow
def test_ring_headroom_refusal_names_the_cause() -> None:
    check_ring_headroom(10, 1000.0, 20, 10**9)
    with pytest.raises(RingOverflowRisk) as err:
        check_ring_headroom(1000, 2.0**40, 20, 10)
    assert err.value.cause == "values" and "values" in str(err.value)
    with pytest.raises(RingOverflowRisk) as err:
        check_ring_headroom(1000, 1.0, 0, 2**60)
    assert err.value.cause == "noise"
    n, bound, f = 4, 2.0**20, 40
    room = max_noise_bound(n, bound, f)
    check_ring_headroom(n, bound, f, room)
    with pytest.raises(RingOverflowRisk) as err:
        check_ring_headroom(n, bound, f, room + 1)
    assert err.value.cause == "values and noise"
    assert isinstance(err.value, InvalidSpec)  # the service maps it like any bad spec


def test_verify_plan_against_the_job_spec() -> None:
    plan = plan_noise(1e6, min_contributors=3, participants=4, length=8)
    ids = ["a", "b", "c", "d"]
    spec = JobSpec.create(ids, threshold=3, length=8, bound=10.0, noise_bound=plan.noise_bound)
    assert guaranteed_contributors(spec) == 3
    verify_plan(spec, plan)
    with pytest.raises(InvalidSpec, match="noise bound"):
        verify_plan(replace(spec, noise_bound=plan.noise_bound - 1), plan)
    low = JobSpec.create(ids, threshold=2, length=8, bound=10.0, noise_bound=plan.noise_bound)
    with pytest.raises(InvalidSpec, match="guarantees only 2"):
        verify_plan(low, plan)


def test_noise_goes_through_secure_aggregation_exactly() -> None:
    """The wiring: a participant passes ``sample_noise(plan)`` to ``set_input(noise=)``;
    the unmasked ring sum is the exact encoded sum plus every contributor's noise."""
    ids = ["p0", "p1", "p2", "p3"]
    plan = plan_noise(1e8, min_contributors=3, participants=4, length=16)
    spec = JobSpec.create(
        ids, threshold=3, length=16, bound=4.0, scale_bits=20, noise_bound=plan.noise_bound
    )
    verify_plan(spec, plan)
    rng = np.random.default_rng(1)
    inputs = {p: rng.uniform(-4, 4, 16) for p in ids}
    noise = {p: sample_noise(plan) for p in ids}
    report = run_protocol(spec, inputs, noise=noise, drop={"p3": "advertise"})
    contributors = report.result.contributors
    assert len(contributors) == 3 and realised_noise(plan, len(contributors)).meets_target
    exact = np.zeros(16, dtype=RING_DTYPE)
    for p in contributors:
        exact += encode(inputs[p], scale_bits=20, bound=4.0)
        exact += noise[p].astype(np.int64).view(RING_DTYPE)
    assert np.array_equal(report.result.ring_sum, exact)
    signal = np.zeros(16, dtype=RING_DTYPE)
    for p in contributors:
        signal += encode(inputs[p], scale_bits=20, bound=4.0)
    err = np.asarray(report.result.values) - decode(signal, scale_bits=20)
    assert np.allclose(err * 2**20, sum(noise[p] for p in contributors))


def test_crypto_dp_does_not_import_torch() -> None:
    code = "import sys, spherecal.crypto.dp; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
