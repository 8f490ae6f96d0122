"""FFC+bias, LDA and QDA from summed statistics against independent computations:
numpy's lstsq on the pooled augmented features, scikit-learn's LDA, scipy's Gaussian
log-density for QDA (scikit-learn's QDA normalises its covariance differently)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from spherecal.spherefed.calibrate import EmptyStatisticsError, SingularStatisticsWarning
from spherecal.spherefed.calibration_suite import closed_form_head
from spherecal.spherefed.discriminant import (
    CalibratedHead,
    ffc_bias_solve,
    lda_solve,
    qda_solve,
    shrink,
)
from spherecal.spherefed.stats import CCVRStatistics, ccvr_statistics


def _blobs(n: int, l: int, C: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class-dependent means *and* covariances (so QDA ≠ LDA), unequal class sizes."""
    rng = np.random.default_rng(seed)
    y = rng.choice(C, size=n, p=np.linspace(1, 2, C) / np.linspace(1, 2, C).sum())
    means = rng.standard_normal((C, l))
    scales = rng.uniform(0.3, 1.5, size=(C, l))
    z = means[y] + rng.standard_normal((n, l)) * scales[y]
    return z, y


def _summed(z: np.ndarray, y: np.ndarray, C: int, parts: int = 3) -> CCVRStatistics:
    """Per-"participant" statistics, summed — what secure aggregation delivers."""
    chunks = np.array_split(np.arange(len(y)), parts)
    total = ccvr_statistics(z[chunks[0]], y[chunks[0]], C)
    for idx in chunks[1:]:
        total = total + ccvr_statistics(z[idx], y[idx], C)
    return total


@pytest.mark.parametrize(("n", "l", "C", "ridge"), [(400, 6, 4, 0.0), (900, 20, 10, 0.0)])
def test_ffc_bias_equals_lstsq_on_augmented_features(n: int, l: int, C: int, ridge: float) -> None:
    z, y = _blobs(n, l, C, n)
    stats = _summed(z, y, C).to_ffc()
    counts = np.bincount(y, minlength=C).astype(float)
    head = ffc_bias_solve(stats.V, stats.U, counts, ridge=ridge)
    Z1 = np.hstack([z, np.ones((n, 1))])
    sol, *_ = np.linalg.lstsq(Z1, np.eye(C)[y], rcond=None)
    np.testing.assert_allclose(head.weight, sol[:l].T, atol=1e-9)
    np.testing.assert_allclose(head.bias, sol[l], atol=1e-9)


def test_ffc_bias_ridge_penalises_weights_not_intercept() -> None:
    n, l, C, lam = 500, 8, 5, 7.5
    z, y = _blobs(n, l, C, 1)
    stats = _summed(z, y, C).to_ffc()
    head = ffc_bias_solve(stats.V, stats.U, np.bincount(y, minlength=C), ridge=lam)
    # Independent: augmented rows sqrt(λ)·[I 0] with zero targets (ridge as least squares).
    Z1 = np.vstack(
        [np.hstack([z, np.ones((n, 1))]), np.hstack([np.sqrt(lam) * np.eye(l), np.zeros((l, 1))])]
    )
    Y = np.vstack([np.eye(C)[y], np.zeros((l, C))])
    sol, *_ = np.linalg.lstsq(Z1, Y, rcond=None)
    np.testing.assert_allclose(head.weight, sol[:l].T, atol=1e-9)
    np.testing.assert_allclose(head.bias, sol[l], atol=1e-9)


@pytest.mark.parametrize("shrinkage", [0.0, 0.05, 0.5])
def test_lda_matches_sklearn(shrinkage: float) -> None:
    n, l, C = 1200, 12, 6
    z, y = _blobs(n, l, C, 3)
    head = lda_solve(_summed(z, y, C), shrinkage=shrinkage)
    sk = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=shrinkage).fit(z, y)
    np.testing.assert_allclose(head.weight, sk.coef_, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(head.bias, sk.intercept_, rtol=1e-7, atol=1e-8)
    np.testing.assert_array_equal(head.predict(z), sk.predict(z))


@pytest.mark.parametrize("gamma", [0.0, 0.3])
def test_qda_equals_gaussian_log_density(gamma: float) -> None:
    """ESL Eq. 4.12 is log N(z; μ_c, Σ_c) + log π_c up to a constant shared by the classes."""
    n, l, C = 800, 5, 4
    z, y = _blobs(n, l, C, 5)
    head = qda_solve(_summed(z, y, C), shrinkage=gamma)
    counts = np.bincount(y, minlength=C)
    pooled = sum(
        ((z[y == c] - z[y == c].mean(0)).T @ (z[y == c] - z[y == c].mean(0))) for c in range(C)
    )
    sigma2 = np.trace(pooled) / (n * l)
    expected = np.zeros((n, C))
    for c in range(C):
        cov = (1 - gamma) * np.cov(z[y == c].T) + gamma * sigma2 * np.eye(l)
        expected[:, c] = multivariate_normal(z[y == c].mean(0), cov).logpdf(z) + np.log(
            counts[c] / n
        )
    # logpdf adds −(l/2) log 2π to every class: the same constant, so compare centred rows.
    got = head.logits(z)
    np.testing.assert_allclose(
        got - got.mean(1, keepdims=True), expected - expected.mean(1, keepdims=True), atol=1e-8
    )


def test_empty_class_is_never_predicted_and_singleton_gets_pooled_spread() -> None:
    n, l, C = 600, 4, 5
    z, y = _blobs(n, l, C, 6)
    y[y == 4] = 0  # class 4: no samples
    y[np.flatnonzero(y == 3)[1:]] = 1  # class 3: one sample
    stats = _summed(z, y, C)
    for head in (lda_solve(stats, 0.1), qda_solve(stats, 0.0), qda_solve(stats, 0.2)):
        assert head.bias[4] == -np.inf
        assert np.isfinite(head.bias[:4]).all()
        assert not (head.predict(z) == 4).any()


def test_singular_covariance_warns_and_stays_finite() -> None:
    rng = np.random.default_rng(7)
    z = np.zeros((200, 6))
    z[:, :3] = rng.standard_normal((200, 3))  # three dead coordinates
    y = rng.integers(0, 3, 200)
    with pytest.warns(SingularStatisticsWarning):
        head = lda_solve(_summed(z, y, 3), 0.0)
    assert np.isfinite(head.weight).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # shrinkage removes the singularity: no warning
        lda_solve(_summed(z, y, 3), 0.1)


def test_bad_input_is_refused() -> None:
    z, y = _blobs(100, 3, 2, 8)
    stats = _summed(z, y, 2)
    with pytest.raises(ValueError, match="shrinkage"):
        lda_solve(stats, 1.5)
    with pytest.raises(ValueError, match="shrinkage"):
        qda_solve(stats, -0.1)
    with pytest.raises(ValueError, match="ridge"):
        ffc_bias_solve(stats.to_ffc().V, stats.to_ffc().U, stats.counts, ridge=-1)
    with pytest.raises(ValueError, match="counts"):
        ffc_bias_solve(stats.to_ffc().V, stats.to_ffc().U, np.ones(5))
    empty = CCVRStatistics(np.zeros(2), np.zeros((2, 3)), np.zeros((2, 3, 3)))
    with pytest.raises(EmptyStatisticsError):
        lda_solve(empty)
    with pytest.raises(EmptyStatisticsError):
        ffc_bias_solve(empty.to_ffc().V, empty.to_ffc().U, empty.counts)
    with pytest.raises(ValueError, match="bias"):
        CalibratedHead(weight=np.zeros((2, 3)), bias=np.zeros(3))


def test_shrink_keeps_trace() -> None:
    rng = np.random.default_rng(9)
    a = rng.standard_normal((5, 5))
    cov = a @ a.T
    for g in (0.0, 0.4, 1.0):
        assert np.trace(shrink(cov, g)) == pytest.approx(np.trace(cov))
    np.testing.assert_allclose(shrink(cov, 1.0), np.trace(cov) / 5 * np.eye(5))


def test_guard_noisy_statistics_clips_counts_and_projects_scatter_to_psd() -> None:
    from spherecal.spherefed.calibration_suite import guard_noisy_statistics

    rng = np.random.default_rng(5)
    z = rng.standard_normal((400, 4))
    y = np.arange(400) % 3
    onehot = np.eye(3)[y]
    clean = CCVRStatistics(
        onehot.sum(axis=0), onehot.T @ z, np.einsum("nc,ni,nj->cij", onehot, z, z)
    )
    same, report = guard_noisy_statistics(clean)  # clean sums: nothing to change
    assert report.clipped_counts == [] and report.psd_projected == []
    np.testing.assert_allclose(same.second_moments, clean.second_moments, rtol=1e-12, atol=1e-9)
    noise = rng.standard_normal((3, 4, 4)) * 60.0
    noisy = CCVRStatistics(
        np.array([-2.0, 0.4, clean.counts[2]]),
        clean.sums,
        clean.second_moments + (noise + np.swapaxes(noise, 1, 2)) / 2,
    )
    guarded, report = guard_noisy_statistics(noisy)
    assert report.clipped_counts == [0, 1]
    np.testing.assert_array_equal(guarded.counts, [1.0, 1.0, clean.counts[2]])
    means = guarded.sums / guarded.counts[:, None]
    scatter = guarded.second_moments - guarded.counts[:, None, None] * np.einsum(
        "ci,cj->cij", means, means
    )
    assert np.linalg.eigvalsh(scatter).min() > -1e-8  # PSD now
    assert report.psd_projected  # the noise made at least one scatter indefinite
    for name in ("lda", "qda"):
        head = closed_form_head(name, guarded, 0.0)
        assert np.isfinite(head.logits(z)).all()


def test_dp_grid_keeps_the_grid_length() -> None:
    from spherecal.spherefed.calibration_suite import (
        DEFAULT_RIDGE_GRID,
        DEFAULT_SHRINKAGE_GRID,
        dp_grid,
    )

    ridge = dp_grid("ffc_bias", DEFAULT_RIDGE_GRID, 8.0)
    assert ridge == (2.0, 4.0, 8.0, 16.0, 32.0)
    assert dp_grid("lda", DEFAULT_SHRINKAGE_GRID, 8.0) == (0.03, 0.1, 0.3, 0.6, 0.9)
    assert dp_grid("qda", (0.0, 0.5), 1.0) == (0.6, 0.9)
    with pytest.raises(ValueError):
        dp_grid("ffc_bias", DEFAULT_RIDGE_GRID, 0.0)
    with pytest.raises(ValueError):
        dp_grid("ccvr", DEFAULT_RIDGE_GRID, 1.0)
