"""Noisy CCVR sums projected onto what honest data can give (issue #25).

The reported failure: 3 contributors at ε = 1, CCVR stopped with "class counts must
be non-negative". Reproduced here with the real release path (exact statistics,
the planned exact noise from a deterministic source, ring encoding and decoding), then
projected: every solver runs on the projection, and the projection satisfies the
invariants an honest sum satisfies.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from spherecal.coordinator.driver.invariants import Tolerance, check_ccvr
from spherecal.crypto.dp import sample_noise
from spherecal.crypto.entropy import RandomSource
from spherecal.crypto.ring import RING_DTYPE, add_noise, decode, encode
from spherecal.spherefed.calibrate import CCVRConfig, ccvr_calibrate, ccvr_gaussians
from spherecal.spherefed.discriminant import class_moments
from spherecal.spherefed.privacy.plan import CalibrationPlan, plan_calibration_release
from spherecal.spherefed.privacy.projection import project_ccvr, project_ffc, psd_part
from spherecal.spherefed.privacy.sensitivity import exact_ccvr_statistics
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

DIM, CLASSES, SITES = 8, 12, 3


def _sites(seed: int) -> list[CCVRStatistics]:
    """Three sites' exact statistics of unit features; classes 0–2 only (label skew),
    so nine classes have a true count of 0 at every site."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, DIM)) * 2
    out = []
    for _ in range(SITES):
        y = rng.integers(0, 3, 60)
        z = centres[y] + rng.normal(size=(60, DIM))
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        out.append(exact_ccvr_statistics(z, y, CLASSES, quant_bits=10))
    return out


def _release(parts: list[CCVRStatistics], plan: CalibrationPlan, key: str) -> CCVRStatistics:
    """The noisy sum the coordinator decodes (the participants' encoding and noise)."""
    source = RandomSource.deterministic(key)
    total = np.zeros(plan.length, dtype=RING_DTYPE)
    for s in parts:
        encoded = encode(s.pack(isometric=True), scale_bits=plan.scale_bits, bound=plan.value_bound)
        add_noise(
            encoded, sample_noise(plan.noise, source=source), noise_bound=plan.noise.noise_bound
        )
        np.add(total, encoded, out=total)
    vector = decode(total, scale_bits=plan.scale_bits)
    return CCVRStatistics.unpack(vector, DIM, CLASSES, isometric=True)


def _plan(epsilon: float) -> CalibrationPlan:
    return plan_calibration_release(
        "ccvr",
        dim=DIM,
        num_classes=CLASSES,
        participants=SITES,
        min_contributors=SITES,
        epsilon_target=epsilon,
        delta=1e-5,
        max_examples=100,
    )


def test_three_contributors_at_epsilon_one_project_instead_of_crashing() -> None:
    parts = _sites(0)
    plan = _plan(1.0)
    noisy = _release(parts, plan, "issue-25")
    sigma = math.sqrt(plan.noise.total_variance(SITES)) / 2**plan.scale_bits
    # nine classes are truly empty; with σ per count they come out negative about half
    # the time (this deterministic draw: at least one — the reported failure)
    assert sigma > 1.0
    assert (noisy.counts < 0).any()
    with pytest.raises(ValueError, match="class counts must be non-negative"):
        ccvr_gaussians(noisy)
    with pytest.raises(ValueError, match="class counts must be non-negative"):
        class_moments(noisy)
    # honest-sum invariants with the DP tolerance let it through (it is a possible
    # noisy sum), so only the solvers stood in the way
    check_ccvr(noisy, unit_norm=True, tol=Tolerance(noise_sigma=sigma, quantum=1e-3))

    projected, change = project_ccvr(noisy, unit_norm=True)
    assert set(change.negative_counts) == set(np.flatnonzero(noisy.counts < 0).tolist())
    assert set(change.negative_counts) <= set(change.emptied_classes)
    assert (projected.counts >= 0).all()
    # what honest data gives, without any noise allowance: counts ≥ 0, every moment
    # matrix PSD, means inside the unit ball (counts stay real numbers: a vanishing
    # noise_sigma only waives the integer test)
    check_ccvr(projected, unit_norm=False, tol=Tolerance(quantum=1e-9, noise_sigma=1e-12))
    kept = projected.counts > 0
    norms = np.linalg.norm(projected.sums[kept], axis=1) / projected.counts[kept]
    assert (norms <= 1.0 + 1e-9).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weight = ccvr_calibrate(projected, np.eye(CLASSES, DIM), CCVRConfig(epochs=2))
        moments = class_moments(projected)
    assert np.isfinite(weight).all() and np.isfinite(moments.scatter).all()


def test_projection_leaves_honest_statistics_unchanged() -> None:
    """Exact sums already lie in the feasible set: the projection is the identity
    (up to the round-off of one eigen-decomposition); mutation: a projection that
    always shrinks or clamps would move them."""
    total = sum(_sites(1)[1:], _sites(1)[0])
    projected, change = project_ccvr(total, unit_norm=True)
    assert change.negative_counts == () and change.shrunk_means == ()
    # classes 3.. are truly empty and stay so (not "emptied": they had no count)
    assert change.emptied_classes == ()
    np.testing.assert_array_equal(projected.counts, total.counts)
    np.testing.assert_allclose(projected.sums, total.sums, atol=1e-12)
    np.testing.assert_allclose(projected.second_moments, total.second_moments, atol=1e-9)


def test_each_step_moves_only_what_is_infeasible() -> None:
    counts = np.array([-3.0, 0.4, 10.0, 10.0])
    sums = np.zeros((4, 2))
    sums[2] = [30.0, 0.0]  # mean of norm 3: outside the unit ball
    sums[3] = [5.0, 0.0]
    second = np.zeros((4, 2, 2))
    second[2] = np.diag([10.0, 0.0])
    second[3] = np.array([[2.5, 0.0], [0.0, -4.0]])  # scatter diag(0, -4): indefinite
    stats = CCVRStatistics(counts, sums, second)
    projected, change = project_ccvr(stats, unit_norm=True)
    assert change.negative_counts == (0,)
    assert change.emptied_classes == (0, 1)
    assert change.shrunk_means == (2,)
    assert change.clipped_eigenvalues == 1
    np.testing.assert_array_equal(projected.counts, [0.0, 0.0, 10.0, 10.0])
    np.testing.assert_allclose(projected.sums[2], [10.0, 0.0])  # ‖μ‖ = 1
    np.testing.assert_allclose(projected.second_moments[3], [[2.5, 0.0], [0.0, 0.0]], atol=1e-12)
    # without unit-norm features the mean is not bounded
    loose, change = project_ccvr(stats, unit_norm=False)
    assert change.shrunk_means == ()
    np.testing.assert_allclose(loose.sums[2], [30.0, 0.0])
    # the trace option rescales a PSD-clipped scatter to N − ‖S‖²/N
    matched, _ = project_ccvr(
        CCVRStatistics(np.array([4.0]), np.zeros((1, 2)), np.array([[[3.0, 0.0], [0.0, 3.0]]])),
        unit_norm=True,
        match_trace=True,
    )
    assert np.trace(matched.second_moments[0]) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="min_count"):
        project_ccvr(stats, unit_norm=True, min_count=0.5)


def test_psd_part_is_the_nearest_psd_matrix() -> None:
    a = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3, −1
    out, negative = psd_part(a)
    assert negative == 1
    np.testing.assert_allclose(out, 1.5 * np.ones((2, 2)))
    ffc, clipped = project_ffc(FFCStatistics(V=a, U=np.ones((2, 3)), count=-1.0))
    assert clipped == 1 and ffc.count == 0.0
    assert np.linalg.eigvalsh(ffc.V).min() >= -1e-12
