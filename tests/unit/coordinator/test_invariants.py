"""Aggregate invariants: honest sums pass, each violated invariant is refused."""

from __future__ import annotations

import numpy as np
import pytest

from spherecal.coordinator.driver import invariants
from spherecal.coordinator.driver.invariants import (
    AggregateInvariantViolated,
    Tolerance,
    check_ccvr,
    check_ffc,
    check_pair,
)
from spherecal.spherefed.privacy.sensitivity import exact_ffc_statistics
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics, ccvr_statistics, ffc_statistics

DIM, CLASSES = 6, 4


def _features(n: int, seed: int, *, unit: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, DIM))
    if unit:
        z /= np.linalg.norm(z, axis=1, keepdims=True)
    return z, rng.integers(0, CLASSES, size=n)


def _honest(unit: bool = True) -> tuple[FFCStatistics, CCVRStatistics]:
    """Three participants' statistics, summed (what an honest aggregate is)."""
    parts = [_features(n, seed, unit=unit) for seed, n in enumerate((40, 7, 90))]
    ffc = ffc_statistics(*parts[0], CLASSES)
    ccvr = ccvr_statistics(*parts[0], CLASSES)
    for z, y in parts[1:]:
        ffc = ffc + ffc_statistics(z, y, CLASSES)
        ccvr = ccvr + ccvr_statistics(z, y, CLASSES)
    return ffc, ccvr


def _quantised(vector: np.ndarray, scale_bits: int = 24) -> np.ndarray:
    """What secure aggregation returns: each of 3 inputs rounded to the scale."""
    step = 2.0**-scale_bits
    return np.rint(vector / step) * step


TOL = Tolerance(quantum=3 * 2.0**-24)


def test_honest_sums_pass_with_and_without_unit_norm() -> None:
    ffc, ccvr = _honest()
    check_ffc(ffc, unit_norm=True, tol=TOL)
    check_ccvr(ccvr, unit_norm=True, tol=TOL)
    check_pair(ffc, ccvr, tol=TOL)
    check_ffc(ccvr.to_ffc(), unit_norm=True, tol=TOL)
    raw_ffc, raw_ccvr = _honest(unit=False)
    check_ffc(raw_ffc, unit_norm=False, tol=TOL)
    check_ccvr(raw_ccvr, unit_norm=False, tol=TOL)


def test_fixed_point_rounding_is_within_tolerance() -> None:
    ffc, ccvr = _honest()
    packed = _quantised(ffc.pack())
    check_ffc(FFCStatistics.unpack(packed, DIM, CLASSES), unit_norm=True, tol=TOL)
    packed = _quantised(ccvr.pack())
    check_ccvr(CCVRStatistics.unpack(packed, DIM, CLASSES), unit_norm=True, tol=TOL)


def _violates(invariant: str, check: object, stats: object, *, unit_norm: bool = True) -> None:
    with pytest.raises(AggregateInvariantViolated) as info:
        check(stats, unit_norm=unit_norm, tol=TOL)  # type: ignore[operator]
    assert info.value.invariant == invariant


def test_negative_or_fractional_counts_are_refused() -> None:
    ffc, ccvr = _honest()
    _violates("counts", check_ffc, FFCStatistics(ffc.V, ffc.U, -3.0), unit_norm=False)
    _violates("counts", check_ffc, FFCStatistics(ffc.V, ffc.U, ffc.count + 0.5), unit_norm=False)
    counts = ccvr.counts.astype(np.float64).copy()
    counts[1] = -1.0
    _violates(
        "counts",
        check_ccvr,
        CCVRStatistics(counts, ccvr.sums, ccvr.second_moments),
        unit_norm=False,
    )


def test_indefinite_second_moments_are_refused() -> None:
    ffc, ccvr = _honest(unit=False)
    v = ffc.V.copy()
    v[0, 0] = -5.0
    _violates("psd", check_ffc, FFCStatistics(v, ffc.U, ffc.count), unit_norm=False)
    m = ccvr.second_moments.copy()
    m[2] = -m[2]
    _violates("psd", check_ccvr, CCVRStatistics(ccvr.counts, ccvr.sums, m), unit_norm=False)


def test_class_sums_larger_than_the_counts_allow_are_refused() -> None:
    """S_c ties to N_c through the PSD augmented moment matrix: a class sum the class
    could not produce is refused even though M_c alone is PSD."""
    ffc, ccvr = _honest()
    sums = ccvr.sums.copy()
    sums[0] *= 50.0
    _violates(
        "moments",
        check_ccvr,
        CCVRStatistics(ccvr.counts, sums, ccvr.second_moments),
        unit_norm=False,
    )
    u = ffc.U * 50.0
    _violates("moments", check_ffc, FFCStatistics(ffc.V, u, ffc.count), unit_norm=False)


def test_trace_identities_for_unit_norm_features() -> None:
    ffc, ccvr = _honest()
    _violates("trace", check_ffc, FFCStatistics(ffc.V * 2.0, ffc.U, ffc.count))
    counts = ccvr.counts.astype(np.float64) + np.array([0, 3, 0, 0])
    _violates("trace", check_ccvr, CCVRStatistics(counts, ccvr.sums, ccvr.second_moments))
    # the same statistics are fine when the head does not normalise
    check_ffc(FFCStatistics(ffc.V * 2.0, ffc.U, ffc.count), unit_norm=False, tol=TOL)


def test_ffc_count_must_equal_the_class_counts() -> None:
    ffc, ccvr = _honest()
    with pytest.raises(AggregateInvariantViolated) as info:
        check_pair(FFCStatistics(ffc.V, ffc.U, ffc.count + 5), ccvr, tol=TOL)
    assert info.value.invariant == "pair"


def test_nan_is_refused() -> None:
    ffc, _ = _honest()
    v = ffc.V.copy()
    v[1, 2] = np.nan
    with pytest.raises(AggregateInvariantViolated):
        check_ffc(FFCStatistics(v, ffc.U, ffc.count), unit_norm=False, tol=TOL)


def test_dp_noise_widens_the_tolerance_instead_of_breaking_the_path() -> None:
    """Honest statistics plus noise of σ per entry pass with σ in the tolerance (and
    fail the exact-integer count check without it)."""
    ffc, ccvr = _honest()
    rng = np.random.default_rng(7)
    sigma = 0.5
    noisy = ccvr.pack() + rng.normal(scale=sigma, size=ccvr.pack().shape)
    stats = CCVRStatistics.unpack(noisy, DIM, CLASSES)
    check_ccvr(stats, unit_norm=True, tol=Tolerance(noise_sigma=sigma))
    with pytest.raises(AggregateInvariantViolated):
        check_ccvr(stats, unit_norm=True, tol=TOL)
    noisy_ffc = ffc.pack() + rng.normal(scale=sigma, size=ffc.pack().shape)
    check_ffc(
        FFCStatistics.unpack(noisy_ffc, DIM, CLASSES),
        unit_norm=True,
        tol=Tolerance(noise_sigma=sigma),
    )


def test_a_dp_releases_truncated_features_keep_the_trace_below_the_count() -> None:
    """A DP release sums exact statistics of features truncated to the 2⁻q grid: each
    ‖z‖² falls short of 1 by up to 2^{1−q}√l, so at a large ε (little noise) the trace
    identity fails by far more than float rounding — the case a 1 200-sample digits
    run at ε = 1000 hit (tr V = 1202.8, count 1212.9). The one-sided ``truncation``
    slack admits it; a trace above the count is still refused."""
    z, y = _features(2000, 11)
    q = 6  # a coarse grid makes the shortfall large at this small l
    stats = exact_ffc_statistics(z, y, CLASSES, quant_bits=q)
    assert np.trace(stats.V) < stats.count * (1 - 1e-3)
    tol = Tolerance(quantum=1e-9, noise_sigma=1e-3, truncation=2.0 ** (1 - q) * np.sqrt(DIM))
    check_ffc(stats, unit_norm=True, tol=tol)
    with pytest.raises(AggregateInvariantViolated, match="trace"):
        check_ffc(stats, unit_norm=True, tol=Tolerance(quantum=1e-9, noise_sigma=1e-3))
    scaled = stats.V * (stats.count / np.trace(stats.V)) * 1.01
    inflated = FFCStatistics(scaled, stats.U, stats.count)
    with pytest.raises(AggregateInvariantViolated, match="trace"):
        check_ffc(inflated, unit_norm=True, tol=tol)


def _with_lowest(lowest: float, *, dim: int = DIM, seed: int = 0) -> np.ndarray:
    """A symmetric matrix whose lowest eigenvalue is ``lowest`` (the others in [1, 2])."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    values = np.concatenate([[lowest], rng.uniform(1.0, 2.0, size=dim - 1)])
    return (q * values) @ q.T


def test_the_psd_rule_holds_on_both_sides_of_its_slack() -> None:
    """The factorisation's pass and the eigenvalues' refusal meet at ``-tol.eigen``:
    a lowest eigenvalue half the slack below zero passes, one and a half refused,
    with the eigenvalue named."""
    slack = TOL.eigen(DIM, 10.0)
    v_in, v_out = _with_lowest(-0.5 * slack), _with_lowest(-1.5 * slack)
    u = np.zeros((DIM, CLASSES))
    assert invariants._within_psd_slack(v_in, np.array([slack]))
    assert not invariants._within_psd_slack(v_out, np.array([slack]))
    invariants._psd(v_in, np.array(10.0), TOL, "V")
    with pytest.raises(
        AggregateInvariantViolated, match=r"V is not positive semi-definite"
    ) as info:
        check_ffc(FFCStatistics(v_out, u, 10.0), unit_norm=False, tol=TOL)
    assert info.value.invariant == "psd"
    assert f"{-1.5 * slack:.4g}" in str(info.value)


def test_a_failed_factorisation_is_decided_by_the_eigenvalues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The factorisation only ever shortcuts a pass: forced to fail, an honest
    aggregate still passes on its eigenvalues."""
    ffc, ccvr = _honest()
    monkeypatch.setattr(invariants, "_within_psd_slack", lambda matrices, slack: False)
    check_ffc(ffc, unit_norm=True, tol=TOL)
    check_ccvr(ccvr, unit_norm=True, tol=TOL)


def test_every_batch_of_class_moments_is_factorised() -> None:
    """More classes than one factorisation batch: an indefinite ``M_c`` in the last
    batch is refused and named by its class."""
    classes = invariants.PSD_BATCH + 3
    bad = classes - 1
    moments = np.stack([_with_lowest(0.5, seed=c) for c in range(classes)])
    moments[bad] = _with_lowest(-0.25, seed=bad)
    stats = CCVRStatistics(np.full(classes, 50.0), np.zeros((classes, DIM)), moments)
    with pytest.raises(AggregateInvariantViolated, match=rf"M_c\[{bad}\] is not positive") as info:
        check_ccvr(stats, unit_norm=False, tol=TOL)
    assert info.value.invariant == "psd"
    moments[bad] = _with_lowest(0.5, seed=bad)
    check_ccvr(
        CCVRStatistics(np.full(classes, 50.0), np.zeros((classes, DIM)), moments),
        unit_norm=False,
        tol=TOL,
    )
