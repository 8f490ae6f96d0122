"""FFC solve and CCVR estimation against independent numpy computations."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from spherecal.spherefed.calibrate import (
    CCVRConfig,
    DegenerateClassWarning,
    EmptyStatisticsError,
    SingularStatisticsWarning,
    ccvr_calibrate,
    ccvr_gaussians,
    ffc_solve,
    retrain_classifier,
    sample_virtual_features,
    tukey_transform,
    virtual_counts,
)
from spherecal.spherefed.stats import CCVRStatistics, ccvr_statistics, ffc_statistics


def _data(n: int, l: int, C: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, l))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return z, rng.integers(0, C, size=n)


@pytest.mark.parametrize(("n", "l", "C"), [(300, 10, 4), (1000, 64, 10), (50, 3, 7)])
def test_ffc_equals_lstsq_on_pooled_features(n: int, l: int, C: int) -> None:
    z, y = _data(n, l, C, n)
    Y = np.eye(C)[y]
    # Split across three "clients" and sum, as the federation does.
    parts = np.array_split(np.arange(n), 3)
    stats = [ffc_statistics(z[p], y[p], C) for p in parts]
    V = sum(s.V for s in stats)
    U = sum(s.U for s in stats)
    W = ffc_solve(V, U)
    expected = np.linalg.lstsq(z, Y, rcond=None)[0].T
    assert W.shape == (C, l)
    np.testing.assert_allclose(W, expected, rtol=1e-8, atol=1e-10)


def test_ffc_ridge_matches_closed_form() -> None:
    z, y = _data(100, 8, 3, 1)
    s = ffc_statistics(z, y, 3)
    W = ffc_solve(s.V, s.U, ridge=0.5)
    expected = np.linalg.solve(z.T @ z + 0.5 * np.eye(8), z.T @ np.eye(3)[y]).T
    np.testing.assert_allclose(W, expected, rtol=1e-10)


def test_ffc_singular_falls_back_to_min_norm_lstsq() -> None:
    # Fewer samples than dimensions: V is rank-deficient.
    z, y = _data(5, 12, 3, 2)
    s = ffc_statistics(z, y, 3)
    with pytest.warns(SingularStatisticsWarning, match="not positive definite"):
        W = ffc_solve(s.V, s.U)
    expected = np.linalg.lstsq(z, np.eye(3)[y], rcond=None)[0].T
    np.testing.assert_allclose(W, expected, rtol=1e-6, atol=1e-8)


def test_ffc_indefinite_noisy_V_still_solves() -> None:
    z, y = _data(200, 6, 3, 3)
    s = ffc_statistics(z, y, 3)
    V = s.V.copy()
    V[0, 0] = -1.0  # as DP noise could do on a near-empty direction
    with pytest.warns(SingularStatisticsWarning):
        W = ffc_solve(V, s.U)
    assert np.isfinite(W).all()


def test_ffc_errors() -> None:
    with pytest.raises(EmptyStatisticsError, match="empty"):
        ffc_solve(np.zeros((4, 4)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="square"):
        ffc_solve(np.zeros((4, 3)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="l×C"):
        ffc_solve(np.eye(4), np.ones((3, 2)))
    with pytest.raises(ValueError, match="NaN"):
        ffc_solve(np.full((2, 2), np.nan), np.ones((2, 2)))
    with pytest.raises(ValueError, match="ridge"):
        ffc_solve(np.eye(2), np.ones((2, 2)), ridge=-1.0)


def test_ccvr_gaussians_equal_numpy_mean_and_cov_with_degenerate_clients() -> None:
    l, C = 6, 4
    z, y = _data(400, l, C, 4)
    # Client 0 has a single sample of class 0 and none of the others; client 1 has
    # exactly one sample of class 1; the rest is spread over clients 2..4.
    owner = np.random.default_rng(5).integers(2, 5, size=400)
    owner[np.flatnonzero(y == 0)[0]] = 0
    owner[np.flatnonzero(y == 1)[0]] = 1
    total = CCVRStatistics(np.zeros(C), np.zeros((C, l)), np.zeros((C, l, l)))
    for k in range(5):
        total = total + ccvr_statistics(z[owner == k], y[owner == k], C)
    means, covs = ccvr_gaussians(total)
    for c in range(C):
        zc = z[y == c]
        np.testing.assert_allclose(means[c], zc.mean(axis=0), atol=1e-12)
        np.testing.assert_allclose(covs[c], np.cov(zc, rowvar=False), atol=1e-12)


def test_ccvr_reports_empty_and_singleton_classes() -> None:
    z = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    y = np.array([0, 0, 2])
    with pytest.warns(DegenerateClassWarning, match=r"no samples \[1\].*one sample \[2\]"):
        est = ccvr_gaussians(ccvr_statistics(z, y, 3))
    assert est.empty_classes == (1,) and est.singleton_classes == (2,)
    np.testing.assert_allclose(est.means[2], [0.6, 0.8])
    assert not est.covariances[2].any() and not est.means[1].any()
    with pytest.raises(EmptyStatisticsError):
        ccvr_gaussians(CCVRStatistics(np.zeros(2), np.zeros((2, 2)), np.zeros((2, 2, 2))))


def test_virtual_counts_proportional_and_exact_total() -> None:
    counts = virtual_counts(np.array([10.0, 0.0, 30.0, 60.0]), 100)
    np.testing.assert_array_equal(counts, [10, 0, 30, 60])
    odd = virtual_counts(np.array([1.0, 1.0, 1.0]), 10)
    assert odd.sum() == 10 and odd.max() - odd.min() <= 1


def test_virtual_features_match_the_gaussians() -> None:
    rng = np.random.default_rng(0)
    l, C = 3, 2
    A = rng.standard_normal((l, l))
    true_cov = A @ A.T / 10
    z = np.concatenate(
        [rng.multivariate_normal([1.0, 0, 0], true_cov, 3000), rng.normal(size=(1000, l))]
    )
    y = np.array([0] * 3000 + [1] * 1000)
    est = ccvr_gaussians(ccvr_statistics(z, y, C))
    vz, vy = sample_virtual_features(est, total=40000, seed=1)
    assert (vy == 0).sum() == 30000 and (vy == 1).sum() == 10000
    np.testing.assert_allclose(vz[vy == 0].mean(axis=0), est.means[0], atol=0.02)
    np.testing.assert_allclose(np.cov(vz[vy == 0], rowvar=False), est.covariances[0], atol=0.02)
    again, _ = sample_virtual_features(est, total=40000, seed=1)
    np.testing.assert_array_equal(vz, again)
    tz, _ = sample_virtual_features(est, total=100, seed=1, tukey=True)
    assert (tz >= 0).all()


def test_tukey_transform() -> None:
    np.testing.assert_allclose(tukey_transform(np.array([-1.0, 0.25, 4.0])), [0.0, 0.5, 2.0])


def test_ccvr_calibrate_fixes_a_biased_classifier() -> None:
    # Two well separated classes; start from a classifier that predicts class 0 always.
    rng = np.random.default_rng(1)
    z = np.concatenate([rng.normal([2, 0], 0.3, (200, 2)), rng.normal([0, 2], 0.3, (200, 2))])
    y = np.repeat([0, 1], 200)
    init = np.array([[1.0, 1.0], [0.0, 0.0]])
    assert ((z @ init.T).argmax(1) == y).mean() == 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        W = ccvr_calibrate(ccvr_statistics(z, y, 2), init, CCVRConfig(virtual_per_class=200))
    assert ((z @ W.T).argmax(1) == y).mean() > 0.98


def test_retrain_classifier_is_seeded_and_validates() -> None:
    z, y = _data(100, 4, 3, 8)
    a = retrain_classifier(z, y, np.zeros((3, 4)), seed=3, epochs=2)
    b = retrain_classifier(z, y, np.zeros((3, 4)), seed=3, epochs=2)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="l=4"):
        retrain_classifier(z, y, np.zeros((3, 5)))
    with pytest.raises(FloatingPointError, match="diverged"):
        retrain_classifier(z * 1e30, y, np.zeros((3, 4)), loss="mse", lr=1e10, epochs=3)
