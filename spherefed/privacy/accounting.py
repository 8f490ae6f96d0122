"""Rényi-DP accounting: the curves of our mechanisms, composition, (ε, δ) conversion.

Every mechanism is represented by its RDP curve ``ε(α)`` on one shared grid of orders
:data:`ORDERS`. Composition adds curves (Mironov 2017, Prop. 1); conversion to
``(ε, δ)`` is Balle et al. 2020, "Hypothesis testing interpretations and Rényi
differential privacy", Thm. 21 of arXiv:1905.09982, minimised over the grid — the
expression of Opacus's :func:`opacus.accountants.analysis.rdp.get_privacy_spent`,
written out here (tests compare the two bit for bit) because importing Opacus imports
its whole privacy engine: about 1.5 s of CPU in a participant that only converts an
evaluation release's curve. Keeping the
curve, not just ε, is what makes the ledger's composition across heterogeneous
releases (Skellam calibration + DP-SGD) tight.

Curves (sensitivities and variances in the *same* units — ring units for the
integer mechanisms):

* **Gaussian mechanism / DP-SGD**: Opacus's
  :func:`opacus.accountants.analysis.rdp.compute_rdp` (``α/2σ²`` for one release;
  the sampled Gaussian mechanism of Mironov, Talwar & Zhang 2019 for DP-SGD).
* **Skellam** (Agarwal, Kairouz & Liu 2021, "The Skellam Mechanism for Differentially
  Private Federated Learning", NeurIPS; the multi-dimensional RDP bound, Theorem 3.5
  of arXiv:2110.04995 — the same expression as ``_skellam_rdp`` in Google's
  ``distributed_dp`` code): noise of total variance ``μ`` per coordinate, integer
  ``α > 1``::

      ε(α) <= α Δ₂²/(2μ) + min( ((2α-1)Δ₂² + 6Δ₁) / (4μ²),  3Δ₁/(2μ) )

* **Distributed discrete Gaussian** (Kairouz, Liu & Steinke 2021, "The Distributed
  Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML;
  Proposition 14 / Eq. 17 of arXiv:2102.06387): ``n`` contributors each adding
  ``N_Z(0, σ²)`` to ``d`` coordinates; with ``τ = 10 Σ_{k=1}^{n-1} exp(-2π²σ² k/(k+1))``
  and ``s² = nσ²``::

      ε(α) <= min( α Δ₂²/(2s²) + τd,
                   α/2 · (Δ₂²/s² + 2Δ₁τ/s + τ²d),
                   α/2 · (Δ₂/s + τ√d)² )

Both papers state their bounds for integer orders; Rényi divergence is
non-decreasing in the order (van Erven & Harremoës 2014, Thm. 3), so on a fractional
order we use the bound at ``⌈α⌉`` — valid, if slightly loose.

**Truncation.** The noise is truncated at the job's noise bound (``spherecal.crypto.dp``); a
mechanism within total variation ``η`` of an ``(ε, δ)``-DP one is
``(ε, δ + (1 + e^ε)η)``-DP. :func:`delta_with_truncation` does that arithmetic; with
``η <= 2^-64`` it never matters, but it is reported, not assumed.

Calibration (:func:`calibrate`) is a bisection on a monotone function: ε is
non-increasing in the noise and non-decreasing in the number of compositions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

# Opacus is imported where it is called, not here: importing it pulls in
# torch.distributed, sympy and scipy.stats — about 4 of the 7 s it takes to import
# ``spherecal.cli`` at the time — and every coordinator and participant process imports this
# module whether or not it adds DP noise.

__all__ = [
    "ORDERS",
    "calibrate",
    "compose",
    "ddg_rdp",
    "ddg_sigma_for",
    "ddg_tau",
    "delta_with_truncation",
    "dpsgd_rdp",
    "epsilon",
    "gaussian_multiplier_for",
    "gaussian_rdp",
    "gdp_epsilon",
    "skellam_rdp",
    "skellam_variance_for",
]

OPACUS_DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)]
)
"""``opacus.accountants.RDPAccountant.DEFAULT_ALPHAS`` (a test keeps them equal)."""
ORDERS: tuple[float, ...] = OPACUS_DEFAULT_ORDERS + tuple(
    float(a) for a in (64, 72, 80, 96, 112, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 2048)
)
"""Opacus's default orders (1.1 … 63) extended upwards for small per-release ε."""

Curve = npt.NDArray[np.float64]


def _orders(orders: Sequence[float] | None) -> npt.NDArray[np.float64]:
    arr = np.asarray(ORDERS if orders is None else orders, dtype=np.float64)
    if arr.ndim != 1 or not arr.size or float(arr.min()) <= 1.0:
        raise ValueError("RDP orders must be a non-empty list of numbers > 1")
    return arr


# ------------------------------------------------------------------- curves
def gaussian_rdp(
    noise_multiplier: float,
    *,
    sample_rate: float = 1.0,
    steps: int = 1,
    orders: Sequence[float] | None = None,
) -> Curve:
    """Gaussian mechanism with ``σ = noise_multiplier · Δ₂`` (Opacus ``compute_rdp``)."""
    if noise_multiplier <= 0:
        return np.full(_orders(orders).shape, np.inf)
    from opacus.accountants.analysis.rdp import compute_rdp

    alphas = _orders(orders)
    rdp = compute_rdp(
        q=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=list(alphas)
    )
    curve = np.asarray(rdp, dtype=np.float64)
    # Opacus's series overflows at very large orders (NaN): no bound there, i.e. +inf.
    return np.where(np.isnan(curve), np.inf, curve)


def dpsgd_rdp(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    *,
    orders: Sequence[float] | None = None,
) -> Curve:
    """DP-SGD (the sampled Gaussian mechanism), exactly as Opacus's RDP accountant."""
    return gaussian_rdp(noise_multiplier, sample_rate=sample_rate, steps=steps, orders=orders)


def skellam_rdp(
    variance: float, l2: float, l1: float, *, orders: Sequence[float] | None = None
) -> Curve:
    """AKL21 Theorem 3.5 for total Skellam variance ``variance`` (same units as Δ)."""
    alphas = np.ceil(_orders(orders))
    if variance <= 0:
        return np.full(alphas.shape, np.inf)
    mu = float(variance)
    first = alphas * l2 * l2 / (2.0 * mu)
    second = np.minimum(
        ((2.0 * alphas - 1.0) * l2 * l2 + 6.0 * l1) / (4.0 * mu * mu), 1.5 * l1 / mu
    )
    return first + second


def ddg_tau(sigma2: float, contributors: int) -> float:
    """KLS21's ``τ = 10 Σ_{k=1}^{n-1} exp(-2π²σ² k/(k+1))`` for per-party variance ``σ²``."""
    if contributors <= 1:
        return 0.0
    k = np.arange(1, contributors, dtype=np.float64)
    return float(10.0 * np.exp(-2.0 * math.pi**2 * sigma2 * k / (k + 1.0)).sum())


def ddg_rdp(
    sigma2: float,
    contributors: int,
    l2: float,
    l1: float,
    dim: int,
    *,
    tau_contributors: int | None = None,
    orders: Sequence[float] | None = None,
) -> Curve:
    """KLS21 Proposition 14 for ``contributors`` parties each adding ``N_Z(0, sigma2)``.

    ``tau_contributors`` (default ``contributors``) evaluates ``τ`` at another count:
    planning uses the largest possible count there, because ``τ`` grows with ``n``
    while every term of the bound grows with ``τ`` and shrinks with ``nσ²``.
    """
    alphas = np.ceil(_orders(orders))
    if sigma2 <= 0 or contributors < 1:
        return np.full(alphas.shape, np.inf)
    tau = ddg_tau(sigma2, contributors if tau_contributors is None else tau_contributors)
    s2 = contributors * sigma2
    s = math.sqrt(s2)
    t1 = alphas * l2 * l2 / (2.0 * s2) + tau * dim
    t2 = alphas / 2.0 * (l2 * l2 / s2 + 2.0 * l1 * tau / s + tau * tau * dim)
    t3 = alphas / 2.0 * (l2 / s + tau * math.sqrt(dim)) ** 2
    return np.minimum(np.minimum(t1, t2), t3)


# ------------------------------------------------------- conversion, composition
def compose(curves: Sequence[npt.ArrayLike]) -> Curve:
    """RDP composition: the sum of the curves (on the same orders)."""
    if not curves:
        return np.zeros(len(ORDERS))
    return np.sum([np.asarray(c, dtype=np.float64) for c in curves], axis=0)


def epsilon(
    rdp: npt.ArrayLike, delta: float, *, orders: Sequence[float] | None = None
) -> tuple[float, float]:
    """``(ε, best order)`` at ``δ``: Balle et al. 2020, Thm. 21,

    ``ε = min_α  ε(α) − (log δ + log α)/(α − 1) + log((α − 1)/α)``,

    the same expression, evaluated in the same order, as Opacus's
    ``get_privacy_spent`` (so the two agree to the last bit; the first minimum wins)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    alphas = _orders(orders)
    curve = np.asarray(rdp, dtype=np.float64)
    if curve.shape != alphas.shape:
        raise ValueError(f"RDP curve has {curve.shape} values for {alphas.shape} orders")
    if not np.isfinite(curve).any():
        return math.inf, float(alphas[0])
    eps = curve - (np.log(delta) + np.log(alphas)) / (alphas - 1) + np.log((alphas - 1) / alphas)
    if np.isnan(eps).all():
        return math.inf, float(alphas[0])
    best = int(np.nanargmin(eps))
    return max(0.0, float(eps[best])), float(alphas[best])


def delta_with_truncation(eps: float, delta: float, tail_probability: float) -> float:
    """``δ + (1 + e^ε)·η`` for a mechanism within TV ``η`` of an ``(ε, δ)``-DP one."""
    if tail_probability <= 0:
        return delta
    return delta + (1.0 + math.exp(min(eps, 700.0))) * tail_probability


def gdp_epsilon(mu: float, delta: float) -> float:
    """ε of ``μ``-Gaussian DP at ``δ`` (Dong, Roth & Su 2022, Cor. 2.13), by bisection."""
    if mu <= 0:
        return 0.0
    from statistics import NormalDist

    phi = NormalDist().cdf

    def delta_of(eps: float) -> float:
        return phi(-eps / mu + mu / 2.0) - math.exp(eps) * phi(-eps / mu - mu / 2.0)

    if delta_of(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while delta_of(hi) > delta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e4:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if delta_of(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


# --------------------------------------------------------------- calibration
def calibrate(
    eps_of_noise: Callable[[float], float],
    target: float,
    *,
    lo: float,
    hi: float,
    rel_tol: float = 1e-6,
) -> float:
    """Smallest noise ``x`` in ``[lo, hi·2^k]`` with ``eps_of_noise(x) <= target``, for a
    non-increasing ``eps_of_noise``; bisection in log space. The returned ``x`` always
    satisfies the target (it is the upper end of the final bracket)."""
    if target <= 0:
        raise ValueError("target ε must be positive")
    if not 0 < lo < hi:
        raise ValueError("need 0 < lo < hi")
    grow = 0
    while eps_of_noise(hi) > target:
        lo, hi = hi, hi * 4.0
        grow += 1
        if grow > 200:
            raise ValueError(f"no noise level reaches ε = {target}")
    if eps_of_noise(lo) <= target:
        return lo
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        if eps_of_noise(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def gaussian_multiplier_for(
    target_epsilon: float, delta: float, *, sample_rate: float = 1.0, steps: int = 1
) -> float:
    """The smallest noise multiplier meeting ``target_epsilon`` at ``delta`` (RDP)."""

    def eps_of(z: float) -> float:
        return epsilon(gaussian_rdp(z, sample_rate=sample_rate, steps=steps), delta)[0]

    return calibrate(eps_of, target_epsilon, lo=0.05, hi=10.0)


def skellam_variance_for(
    target_epsilon: float,
    delta: float,
    l2: float,
    l1: float,
    *,
    compositions: int = 1,
    extra_rdp: npt.ArrayLike | None = None,
) -> float:
    """Smallest total Skellam variance meeting ``target_epsilon`` at ``delta`` for
    ``compositions`` identical releases (plus an already-spent ``extra_rdp`` curve)."""
    spent = np.zeros(len(ORDERS)) if extra_rdp is None else np.asarray(extra_rdp)

    def eps_of(var: float) -> float:
        return epsilon(compositions * skellam_rdp(var, l2, l1) + spent, delta)[0]

    return calibrate(eps_of, target_epsilon, lo=1e-6 * l2 * l2, hi=l2 * l2)


def ddg_sigma_for(
    target_epsilon: float,
    delta: float,
    l2: float,
    l1: float,
    dim: int,
    *,
    contributors: int,
    max_contributors: int,
    compositions: int = 1,
) -> float:
    """Smallest per-party ``σ`` of the distributed discrete Gaussian meeting the target
    with ``contributors`` parties, ``τ`` taken at ``max_contributors`` (conservative)."""

    def eps_of(sigma: float) -> float:
        curve = ddg_rdp(sigma * sigma, contributors, l2, l1, dim, tau_contributors=max_contributors)
        return epsilon(compositions * curve, delta)[0]

    return calibrate(eps_of, target_epsilon, lo=1e-3 * l2, hi=l2)
