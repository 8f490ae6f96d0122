"""Classifier calibration after federated training: FFC (closed form) and CCVR.

**FFC** (SphereFed §4.3): with the feature extractor frozen, the MSE-optimal linear
classifier is a least-squares problem (Eq. 6) whose solution ``W* = (ZᵀZ)⁻¹ ZᵀY``
(Eq. 7) only needs the additive statistics ``V = Σ_k V^k`` and ``U = Σ_k U^k``
(Eq. 8–10); with the L2 penalty of appendix C.1 it becomes
``W* = (V + λI)⁻¹ U`` (Eq. 12). :func:`ffc_solve` returns ``W*ᵀ`` (C×l), the weight
the head uses.

**CCVR** (Luo et al. 2021, §4): per-class Gaussians ``N(μ_c, Σ_c)`` from the summed
statistics (Eq. 3–4), virtual features sampled from them with counts proportional
to ``N_c`` (Algorithm 1), optional ReLU + Tukey(β=0.5) transform (§5.1), and the
classifier re-trained on the virtual features with cross-entropy.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from spherecal.spherefed.losses import make_loss
from spherecal.spherefed.stats import CCVRStatistics


class SingularStatisticsWarning(UserWarning):
    """``V + λI`` was not positive definite; FFC fell back to the eigen-floor solve."""


class EmptyStatisticsError(ValueError):
    """The statistics describe no data at all (all-zero ``V``/``U``): nothing to solve."""


class DegenerateClassWarning(UserWarning):
    """Some classes had 0 or 1 samples, so their Gaussian is missing or has no spread."""


def _to_numpy64(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return arr


def ffc_solve(V: Any, U: Any, ridge: float = 0.0, *, rcond: float = 1e-10) -> np.ndarray:
    """Closed-form FFC classifier ``(V + λI)⁻¹ U`` transposed to C×l (Eq. 10 / Eq. 12).

    Cholesky when ``V + λI`` is positive definite (the normal case once there are
    more samples than feature dimensions). Otherwise — fewer samples than ``l``,
    collapsed features, or a ``V`` perturbed by DP noise into indefiniteness — it
    falls back to an *eigen-floor* solve: eigenvalues at or below
    ``rcond · λ_max`` are treated as zero and dropped, i.e. the Moore–Penrose
    pseudo-inverse on the well-conditioned subspace. For ``λ = 0`` that is exactly
    the minimum-norm least-squares solution ``numpy.linalg.lstsq`` gives on the
    pooled features. A :class:`SingularStatisticsWarning` says so.
    """
    V = _to_numpy64(V, "V")
    U = _to_numpy64(U, "U")
    if V.ndim != 2 or V.shape[0] != V.shape[1]:
        raise ValueError(f"V must be a square l×l matrix, got shape {V.shape}")
    if U.ndim != 2 or U.shape[0] != V.shape[0]:
        raise ValueError(f"U must be l×C with l={V.shape[0]} (V's size), got shape {U.shape}")
    if ridge < 0 or not np.isfinite(ridge):
        raise ValueError(f"ridge must be a finite non-negative number, got {ridge}")
    if not V.any() or not U.any():
        raise EmptyStatisticsError(
            "FFC statistics are empty (V or U is all zeros): no participant contributed "
            "any feature; cannot calibrate"
        )
    V = (V + V.T) / 2.0
    A = V + ridge * np.eye(V.shape[0])
    try:
        L = np.linalg.cholesky(A)
        # Two triangular solves; np.linalg.solve is fine here (l ≤ a few thousand).
        W = np.linalg.solve(L.T, np.linalg.solve(L, U))
        if np.isfinite(W).all():
            return np.ascontiguousarray(W.T)
    except np.linalg.LinAlgError:
        pass
    eigvals, eigvecs = np.linalg.eigh(A)
    floor = rcond * max(float(eigvals.max()), 0.0)
    keep = eigvals > floor
    warnings.warn(
        f"V + {ridge}·I is not positive definite (smallest eigenvalue {eigvals.min():.3e}); "
        f"solving on the {int(keep.sum())} of {len(eigvals)} eigen-directions above the "
        f"floor {floor:.3e}",
        SingularStatisticsWarning,
        stacklevel=2,
    )
    if not keep.any():
        raise EmptyStatisticsError("V has no positive eigenvalue: nothing to solve")
    basis = eigvecs[:, keep]
    W = basis @ ((basis.T @ U) / eigvals[keep][:, None])
    return np.ascontiguousarray(W.T)


@dataclass(frozen=True)
class GaussianEstimate:
    """Per-class ``μ_c`` (C×l) and ``Σ_c`` (C×l×l) from CCVR sums (Eq. 3–4).

    Iterates as ``(means, covariances)`` so ``means, covs = ccvr_gaussians(s)`` works.
    ``empty_classes`` (``N_c = 0``: mean and covariance are zero placeholders and the
    class gets no virtual features) and ``singleton_classes`` (``N_c = 1``: the mean is
    the one sample, the covariance is zero because Eq. 4's ``N_c − 1`` vanishes) say
    which classes are degenerate.
    """

    means: np.ndarray
    covariances: np.ndarray
    counts: np.ndarray
    empty_classes: tuple[int, ...] = field(default=())
    singleton_classes: tuple[int, ...] = field(default=())

    def __iter__(self) -> Iterator[np.ndarray]:
        yield self.means
        yield self.covariances


def ccvr_gaussians(ccvr_stats: CCVRStatistics) -> GaussianEstimate:
    """Global class means and covariances from summed statistics (CCVR Eq. 3–4).

    ``μ_c = S_c / N_c`` and ``Σ_c = (M_c − N_c μ_c μ_cᵀ) / (N_c − 1)`` — Eq. 4 written
    in the raw sums, which is what secure aggregation delivers. Tiny negative
    eigenvalues from cancellation are left in place here and clipped at sampling.
    """
    counts = _to_numpy64(ccvr_stats.counts, "counts")
    sums = _to_numpy64(ccvr_stats.sums, "sums")
    second = _to_numpy64(ccvr_stats.second_moments, "second_moments")
    if (counts < 0).any():
        raise ValueError("class counts must be non-negative")
    if not counts.any():
        raise EmptyStatisticsError("CCVR statistics are empty: every class count is zero")
    C, dim = sums.shape
    means = np.zeros((C, dim))
    covs = np.zeros((C, dim, dim))
    present = counts > 0
    means[present] = sums[present] / counts[present, None]
    spread = counts > 1
    outer = np.einsum("ci,cj->cij", means[spread], means[spread])
    covs[spread] = (second[spread] - counts[spread, None, None] * outer) / (
        counts[spread, None, None] - 1.0
    )
    covs = (covs + np.swapaxes(covs, 1, 2)) / 2.0
    empty = tuple(int(c) for c in np.flatnonzero(~present))
    singleton = tuple(int(c) for c in np.flatnonzero(present & ~spread))
    if empty or singleton:
        warnings.warn(
            f"CCVR: classes with no samples {list(empty)} get no virtual features; classes "
            f"with one sample {list(singleton)} have zero covariance",
            DegenerateClassWarning,
            stacklevel=2,
        )
    return GaussianEstimate(means, covs, counts, empty, singleton)


def tukey_transform(features: np.ndarray, beta: float = 0.5) -> np.ndarray:
    """ReLU then Tukey's ladder of powers ``z^β`` (CCVR §5.1 uses β = 0.5)."""
    relu = np.maximum(features, 0.0)
    return np.log(relu + 1e-12) if beta == 0 else np.power(relu, beta)


def virtual_counts(counts: np.ndarray, total: int) -> np.ndarray:
    """Virtual features per class, proportional to ``N_c`` (Algorithm 1), summing to ``total``.

    Largest-remainder rounding so the total is exact; classes with ``N_c = 0`` get 0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if total < 0:
        raise ValueError(f"total virtual features must be >= 0, got {total}")
    share = total * counts / counts.sum()
    base = np.floor(share).astype(np.int64)
    remainder = total - int(base.sum())
    if remainder > 0:
        order = np.argsort(-(share - base), kind="stable")
        base[order[:remainder]] += 1
    return base


def sample_virtual_features(
    estimate: GaussianEstimate,
    *,
    total: int,
    seed: int = 0,
    tukey: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw virtual features ``z ~ N(μ_c, Σ_c)`` (Algorithm 1), labels alongside.

    Sampling uses the eigen-decomposition of ``Σ_c`` with negative eigenvalues
    clipped to zero, so a singular or slightly indefinite covariance still samples.
    """
    rng = np.random.default_rng(seed)
    per_class = virtual_counts(estimate.counts, total)
    feats, labels = [], []
    for c in np.flatnonzero(per_class):
        eigvals, eigvecs = np.linalg.eigh(estimate.covariances[c])
        root = eigvecs * np.sqrt(np.clip(eigvals, 0.0, None))
        noise = rng.standard_normal((int(per_class[c]), root.shape[0]))
        feats.append(estimate.means[c] + noise @ root.T)
        labels.append(np.full(int(per_class[c]), c, dtype=np.int64))
    z = np.concatenate(feats) if feats else np.zeros((0, estimate.means.shape[1]))
    y = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    if tukey:
        z = tukey_transform(z)
    return z, y


def retrain_classifier(
    features: np.ndarray,
    labels: np.ndarray,
    init_weight: np.ndarray,
    *,
    loss: str = "ce",
    lr: float = 0.1,
    epochs: int = 20,
    batch_size: int = 64,
    momentum: float = 0.9,
    seed: int = 0,
) -> np.ndarray:
    """Fine-tune a bias-free linear classifier (C×l) on fixed features by minibatch SGD.

    Used by CCVR (on virtual features) and by the reference runner's oracle (on the
    pooled real features). Seeded: same inputs and seed ⇒ same weight.
    """
    z = torch.as_tensor(np.asarray(features), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    if z.ndim != 2 or y.shape != (z.shape[0],):
        raise ValueError(
            f"features must be N×l and labels N, got {tuple(z.shape)}, {tuple(y.shape)}"
        )
    init = torch.as_tensor(np.asarray(init_weight), dtype=torch.float32)
    weight = torch.nn.Parameter(init.clone())
    if weight.shape[1] != z.shape[1]:
        raise ValueError(f"init_weight is {tuple(weight.shape)} but features have l={z.shape[1]}")
    if z.shape[0] == 0:
        return weight.detach().double().numpy()
    loss_fn = make_loss(loss)
    opt = torch.optim.SGD([weight], lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(z.shape[0], generator=gen)
        for start in range(0, z.shape[0], batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad()
            loss_fn(z[idx] @ weight.t(), y[idx]).backward()
            opt.step()
    out = weight.detach().double().numpy()
    if not np.isfinite(out).all():
        raise FloatingPointError(
            f"classifier retraining diverged (lr={lr}); lower the learning rate"
        )
    return out


@dataclass(frozen=True)
class CCVRConfig:
    """CCVR hyper-parameters. ``virtual_per_class`` × C virtual features in total
    (the paper's ``M_c`` = 100 on CIFAR-10), spread proportionally to ``N_c``."""

    virtual_per_class: int = 100
    tukey: bool = False
    lr: float = 0.1
    epochs: int = 20
    batch_size: int = 64
    seed: int = 0


def ccvr_calibrate(
    ccvr_stats: CCVRStatistics, init_weight: np.ndarray, config: CCVRConfig | None = None
) -> np.ndarray:
    """The whole of CCVR: Gaussians (Eq. 3–4) → virtual features → CE retraining. C×l."""
    cfg = config or CCVRConfig()
    estimate = ccvr_gaussians(ccvr_stats)
    total = cfg.virtual_per_class * ccvr_stats.num_classes
    z, y = sample_virtual_features(estimate, total=total, seed=cfg.seed, tukey=cfg.tukey)
    return retrain_classifier(
        z,
        y,
        init_weight,
        loss="ce",
        lr=cfg.lr,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    )
