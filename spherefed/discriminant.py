"""Closed-form calibrators with a bias term, from the same secure sums as FFC/CCVR.

Every function here needs only the *summed* per-class statistics that secure
aggregation already delivers (``spherecal.spherefed.stats``): class counts ``N_c``, class sums
``S_c = Σ_{y=c} z`` and second moments ``M_c = Σ_{y=c} z zᵀ`` — or, for FFC+bias, the
FFC sums plus the ``C`` class counts. No virtual features, no SGD: one solve each.

- :func:`ffc_bias_solve` — FFC with an intercept: least squares on ``z̃ = [z; 1]``
  (SphereFed Eq. 6–7/12 applied to the augmented feature). Its normal equations are
  built from ``V = Σ_c M_c``, ``Σz = Σ_c S_c = U·1``, ``N = Σ_c N_c`` and
  ``Ũ = [U; (N_1 … N_C)]``. Upload: FFC's ``1 + l(l+1)/2 + lC`` plus ``C`` counts.
- :func:`lda_solve` — linear discriminant analysis (Hastie, Tibshirani & Friedman,
  *ESL* 2nd ed., Eq. 4.9–4.10): shared covariance, class priors, shrinkage. Needs
  ``N_c``, ``S_c`` and the pooled ``Σ_c M_c`` only: ``C + lC + l(l+1)/2`` numbers —
  FFC's upload size plus ``C − 1``.
- :func:`qda_solve` — quadratic discriminant analysis (ESL Eq. 4.12): one covariance
  per class. Needs every ``M_c``: the full CCVR upload ``C + Cl + C·l(l+1)/2``.

The results are :class:`CalibratedHead` s: a linear head ``zWᵀ + b`` (FFC+bias, LDA)
or a quadratic one (QDA) whose logits add ``−½ zᵀ A_c z`` per class. A quadratic
head is not a linear layer, so it cannot be written into the network's classifier
buffer; the calibrated model is instead *features + this head*, evaluated by
:meth:`CalibratedHead.logits` on the network's features (see
:func:`spherecal.spherefed.calibration_suite.head_accuracy`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from spherecal.spherefed.calibrate import (
    EmptyStatisticsError,
    SingularStatisticsWarning,
    _to_numpy64,
)
from spherecal.spherefed.stats import CCVRStatistics

__all__ = [
    "WIRE_NEVER",
    "CalibratedHead",
    "class_moments",
    "ffc_bias_solve",
    "lda_solve",
    "qda_solve",
    "shrink",
]


WIRE_NEVER = -1e300
"""A never-predicted class's bias as sent and saved: tensors on the wire must be
finite (``spherecal.proto.codec``), and ``-1e300`` loses every argmax that ``-inf`` loses
(logits are ``O(1e3)`` at most; ``-1e300 + x`` stays finite)."""


@dataclass(frozen=True, eq=False)
class CalibratedHead:
    """Logits ``g_c(z) = w_cᵀ z + b_c − ½ zᵀ A_c z`` (``A`` absent for a linear head).

    ``weight`` is C×l, ``bias`` C (``−inf`` for a class that can never be predicted,
    e.g. one with no training sample), ``quadratic`` C×l×l or ``None``. Float64.
    """

    weight: np.ndarray
    bias: np.ndarray
    quadratic: np.ndarray | None = None

    def __post_init__(self) -> None:
        c, dim = self.weight.shape
        if self.bias.shape != (c,):
            raise ValueError(f"bias must be ({c},), got {self.bias.shape}")
        if self.quadratic is not None and self.quadratic.shape != (c, dim, dim):
            raise ValueError(f"quadratic must be ({c}, {dim}, {dim}), got {self.quadratic.shape}")
        if not np.isfinite(self.weight).all():
            raise ValueError("calibrated weight contains NaN or Inf")

    @property
    def num_classes(self) -> int:
        return int(self.weight.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.weight.shape[1])

    def logits(self, features: np.ndarray | torch.Tensor) -> np.ndarray:
        """``N×C`` logits of ``N×l`` features (float64; vectorised over samples)."""
        z = features.detach().double().numpy() if isinstance(features, torch.Tensor) else features
        z = np.asarray(z, dtype=np.float64)
        out = z @ self.weight.T + self.bias
        if self.quadratic is not None:
            # −½ zᵀ A_c z for every sample and class: one einsum, no Python loop.
            out = out - 0.5 * np.einsum("cnj,nj->nc", np.matmul(z[None], self.quadratic), z)
        return out

    def predict(self, features: np.ndarray | torch.Tensor) -> np.ndarray:
        return np.argmax(self.logits(features), axis=1)

    @property
    def kind(self) -> str:
        """``"quadratic"`` (QDA) or ``"affine"`` (FFC+bias, LDA)."""
        return "affine" if self.quadratic is None else "quadratic"

    def finite_bias(self) -> np.ndarray:
        """The bias with ``-inf`` (a class never predicted) as :data:`WIRE_NEVER`."""
        return np.where(np.isneginf(self.bias), WIRE_NEVER, self.bias)


@dataclass(frozen=True)
class ClassMoments:
    """Priors, means and scatter matrices recovered from the sums (ESL §4.3)."""

    counts: np.ndarray  # N_c
    priors: np.ndarray  # π_c = N_c / N
    means: np.ndarray  # μ_c = S_c / N_c (0 for empty classes)
    scatter: np.ndarray  # M_c − N_c μ_c μ_cᵀ = Σ_{y=c} (z − μ_c)(z − μ_c)ᵀ


def class_moments(stats: CCVRStatistics) -> ClassMoments:
    """``π_c``, ``μ_c`` and the within-class scatter of every class, from ``N_c, S_c, M_c``."""
    counts = _to_numpy64(stats.counts, "counts")
    sums = _to_numpy64(stats.sums, "sums")
    second = _to_numpy64(stats.second_moments, "second_moments")
    if (counts < 0).any():
        raise ValueError("class counts must be non-negative")
    total = float(counts.sum())
    if total <= 0:
        raise EmptyStatisticsError("statistics are empty: every class count is zero")
    present = counts > 0
    means = np.zeros_like(sums)
    means[present] = sums[present] / counts[present, None]
    scatter = second - counts[:, None, None] * np.einsum("ci,cj->cij", means, means)
    scatter = (scatter + np.swapaxes(scatter, 1, 2)) / 2.0
    return ClassMoments(counts, counts / total, means, scatter)


def shrink(cov: np.ndarray, shrinkage: float) -> np.ndarray:
    """``(1 − γ) Σ + γ (tr Σ / l) I`` (Ledoit–Wolf's target; sklearn's ``shrinkage``).

    Works on one ``l×l`` matrix or a stack ``(C, l, l)`` (each shrunk to its own trace).
    """
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"shrinkage must lie in [0, 1], got {shrinkage}")
    dim = cov.shape[-1]
    mu = np.trace(cov, axis1=-2, axis2=-1) / dim
    eye = np.eye(dim)
    return (1.0 - shrinkage) * cov + shrinkage * mu[..., None, None] * eye


def _floored_eigh(matrix: np.ndarray, what: str, rcond: float) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition with eigenvalues floored at ``rcond · λ_max`` (warns when hit).

    DP noise or collapsed features can leave a covariance singular or slightly
    indefinite; flooring keeps the solve and the log-determinant finite, the same
    policy as :func:`spherecal.spherefed.calibrate.ffc_solve`'s fallback.
    """
    eigvals, eigvecs = np.linalg.eigh(matrix)
    top = float(np.max(eigvals))
    if top <= 0:
        raise EmptyStatisticsError(f"{what} has no positive eigenvalue: nothing to solve")
    floor = rcond * top
    low = eigvals < floor
    if low.any():
        warnings.warn(
            f"{what}: {int(low.sum())} of {eigvals.size} eigenvalues below {floor:.3e} "
            f"(smallest {eigvals.min():.3e}) floored; add shrinkage",
            SingularStatisticsWarning,
            stacklevel=3,
        )
    return np.maximum(eigvals, floor), eigvecs


def ffc_bias_solve(
    V: np.ndarray,
    U: np.ndarray,
    class_counts: np.ndarray,
    ridge: float = 0.0,
    *,
    rcond: float = 1e-10,
) -> CalibratedHead:
    """FFC with an intercept: ``[W b]ᵀ = (Ṽ + λ Ĩ)⁻¹ Ũ`` on ``z̃ = [z; 1]`` (SphereFed Eq. 12).

    ``Ṽ = Σ z̃ z̃ᵀ = [[V, Σz], [Σzᵀ, N]]`` with ``Σz = U·1`` (each sample adds ``z`` to
    exactly one column of ``U``) and ``N = Σ_c N_c``; ``Ũ = Σ z̃ e_yᵀ = [U; N_1 … N_C]``.
    So the sums needed are FFC's ``V`` and ``U`` plus the ``C`` class counts. The
    ridge ``λ`` penalises ``W`` only (``Ĩ = diag(1, …, 1, 0)``): an intercept is not
    shrunk, as in ordinary ridge regression (ESL Eq. 3.41). With ``λ = 0`` this is
    the least-squares fit of one-hot targets on ``[Z 1]`` (``numpy.linalg.lstsq``).
    """
    V = _to_numpy64(V, "V")
    U = _to_numpy64(U, "U")
    n_c = _to_numpy64(class_counts, "class_counts")
    dim, c = U.shape
    if V.shape != (dim, dim) or n_c.shape != (c,):
        raise ValueError(
            f"need V (l×l), U (l×C), counts (C,); got {V.shape}, {U.shape}, {n_c.shape}"
        )
    if ridge < 0 or not np.isfinite(ridge):
        raise ValueError(f"ridge must be a finite non-negative number, got {ridge}")
    total = float(n_c.sum())
    if total <= 0 or not V.any():
        raise EmptyStatisticsError("FFC+bias statistics are empty: nothing to solve")
    s = U.sum(axis=1)
    A = np.empty((dim + 1, dim + 1))
    A[:dim, :dim] = (V + V.T) / 2.0 + ridge * np.eye(dim)
    A[:dim, dim] = s
    A[dim, :dim] = s
    A[dim, dim] = total
    rhs = np.vstack([U, n_c[None, :]])
    try:
        L = np.linalg.cholesky(A)
        sol = np.linalg.solve(L.T, np.linalg.solve(L, rhs))
        if not np.isfinite(sol).all():
            raise np.linalg.LinAlgError("non-finite solution")
    except np.linalg.LinAlgError:
        eigvals, eigvecs = np.linalg.eigh(A)
        keep = eigvals > rcond * max(float(eigvals.max()), 0.0)
        warnings.warn(
            f"FFC+bias: augmented V + {ridge}·I is not positive definite; solving on "
            f"{int(keep.sum())} of {eigvals.size} eigen-directions",
            SingularStatisticsWarning,
            stacklevel=2,
        )
        if not keep.any():
            raise EmptyStatisticsError("augmented V has no positive eigenvalue") from None
        basis = eigvecs[:, keep]
        sol = basis @ ((basis.T @ rhs) / eigvals[keep][:, None])
    return CalibratedHead(weight=np.ascontiguousarray(sol[:dim].T), bias=sol[dim].copy())


def _log_priors(priors: np.ndarray) -> np.ndarray:
    out = np.full(priors.shape, -np.inf)
    out[priors > 0] = np.log(priors[priors > 0])
    return out


def lda_solve(
    stats: CCVRStatistics, shrinkage: float = 0.0, *, rcond: float = 1e-12
) -> CalibratedHead:
    """LDA: ``δ_c(z) = zᵀ Σ⁻¹ μ_c − ½ μ_cᵀ Σ⁻¹ μ_c + log π_c`` (ESL Eq. 4.10).

    From the sums: ``π_c = N_c / N``, ``μ_c = S_c / N_c`` and the pooled within-class
    covariance ``Σ = Σ_c (M_c − N_c μ_c μ_cᵀ) / N`` — the maximum-likelihood
    normalisation (ESL divides by ``N − C``; with ``N`` in the thousands the two
    differ by well under 0.1 %, and ``N`` matches scikit-learn's
    ``LinearDiscriminantAnalysis``), shrunk by :func:`shrink`. Only ``Σ_c M_c``
    (= FFC's ``V``) is needed, not each ``M_c``. Classes with ``N_c = 0`` get bias
    ``−inf``: never predicted.
    """
    mom = class_moments(stats)
    cov = shrink(mom.scatter.sum(axis=0) / float(mom.counts.sum()), shrinkage)
    eigvals, eigvecs = _floored_eigh(cov, "LDA pooled covariance", rcond)
    precision_means = eigvecs @ ((eigvecs.T @ mom.means.T) / eigvals[:, None])  # Σ⁻¹ μ_c, l×C
    weight = precision_means.T
    bias = -0.5 * np.einsum("ci,ic->c", mom.means, precision_means) + _log_priors(mom.priors)
    return CalibratedHead(weight=np.ascontiguousarray(weight), bias=bias)


def qda_solve(
    stats: CCVRStatistics, shrinkage: float = 0.0, *, rcond: float = 1e-12
) -> CalibratedHead:
    """QDA: ``δ_c(z) = −½ log|Σ_c| − ½ (z − μ_c)ᵀ Σ_c⁻¹ (z − μ_c) + log π_c`` (ESL Eq. 4.12).

    ``Σ_c = (M_c − N_c μ_c μ_cᵀ) / (N_c − 1)`` (CCVR Eq. 4, the unbiased per-class
    covariance, as scikit-learn's ``QuadraticDiscriminantAnalysis``), shrunk towards
    ``σ̄² I`` with ``σ̄² = tr(Σ_pooled) / l`` — the pooled spread, so that a class with
    one sample (zero covariance) still gets a proper Gaussian. Expanded into the
    head's form: ``A_c = Σ_c⁻¹``, ``w_c = Σ_c⁻¹ μ_c``,
    ``b_c = −½ μ_cᵀ Σ_c⁻¹ μ_c − ½ log|Σ_c| + log π_c``. Needs every ``M_c``.
    """
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"shrinkage must lie in [0, 1], got {shrinkage}")
    mom = class_moments(stats)
    c, dim = mom.means.shape
    pooled_var = float(np.trace(mom.scatter.sum(axis=0))) / (float(mom.counts.sum()) * dim)
    denom = np.maximum(mom.counts - 1.0, 1.0)
    covs = mom.scatter / denom[:, None, None]
    covs = (1.0 - shrinkage) * covs + shrinkage * pooled_var * np.eye(dim)
    covs[mom.counts <= 1] = pooled_var * np.eye(dim)  # no spread of its own: the pooled one
    weight = np.zeros((c, dim))
    bias = _log_priors(mom.priors)
    quadratic = np.zeros((c, dim, dim))
    for k in np.flatnonzero(mom.counts > 0):  # one eigh per class (≤ C), not per sample
        eigvals, eigvecs = _floored_eigh(covs[k], f"QDA covariance of class {k}", rcond)
        precision = (eigvecs / eigvals) @ eigvecs.T
        quadratic[k] = (precision + precision.T) / 2.0
        weight[k] = quadratic[k] @ mom.means[k]
        bias[k] += -0.5 * float(mom.means[k] @ weight[k]) - 0.5 * float(np.log(eigvals).sum())
    return CalibratedHead(weight=weight, bias=bias, quadratic=quadratic)
