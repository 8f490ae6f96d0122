"""Sensitivity of the calibration releases, from unit-norm features, in ring units.

**Neighbouring datasets** differ by adding or removing one example ``(x, y)`` at one
participant (the relation of DP-SGD and of Opacus). The released vector is the packed
statistic of :mod:`spherecal.spherefed.stats` with ``isometric=True``, summed over participants;
one example changes only its owner's term, by exactly its own contribution.

**Derivation** (``z`` = the example's feature, ``‖z‖₂ <= 1``; SphereFed §4.1 puts every
feature on the unit sphere):

* FFC: the count changes by 1; ``V = Σ z zᵀ`` by ``z zᵀ``, whose Frobenius norm is
  ``‖z‖² <= 1``; ``U = Σ z e_yᵀ`` by ``z e_yᵀ``, Frobenius norm ``‖z‖ <= 1``.
* CCVR: only class ``y``'s blocks change: ``N_y`` by 1, ``S_y`` by ``z`` (norm ``<= 1``),
  ``M_y`` by ``z zᵀ`` (Frobenius ``<= 1``).
* The isometric triangle scales off-diagonal entries by ``√2``, so its Euclidean norm
  equals the Frobenius norm of the full symmetric matrix: a symmetric block costs the
  same as a full one, while the noise per off-diagonal entry of the unpacked matrix is
  halved in variance (the reason for the layout).
* Jointly, three blocks each of norm ``<= 1`` change: ``Δ₂ <= √(1 + 1 + 1) = √3`` —
  in general ``√(number of blocks released together)``.

**Fixed point.** The ring carries ``F(x) = rint(2^f x)`` (:func:`spherecal.crypto.ring.encode`).
Rounding can *inflate* the sensitivity: ``|rint(a) - rint(b)| <= |a - b| + 1``. We use
an explicit inflated bound rather than conditional randomised rounding (Kairouz et al.
2021), because randomised rounding bounds a *participant's* vector norm, whereas our
neighbours differ by one example *inside* a participant's sum, for which an explicit
worst case is both simpler and exact. To make the bound small and free of
floating-point guesswork, DP releases are computed by :func:`exact_ffc_statistics` /
:func:`exact_ccvr_statistics`:

1. each feature is truncated toward zero onto the grid ``2^-q`` (``|z_q,i| <= |z_i|``,
   so ``‖z_q‖ <= ‖z‖``), after renormalising in float64, and the integer vector is
   checked to satisfy ``Σ (2^q z_q,i)² <= 2^{2q}`` exactly (``‖z_q‖ <= 1``, proven in
   integers, not floats);
2. the sums are then sums of integers below ``2^53`` (``N · 2^{2q}`` for ``V``), which
   float64 BLAS adds *exactly* in any order, so the statistic is an exact dyadic number;
3. with ``f >= 2q``, counts, ``U``/``S`` and the diagonals are exact multiples of
   ``2^-f``: they encode without rounding. Only the ``√2``-scaled off-diagonal entries
   round, each by at most ``ρ = 1 + 2^{f-49}·N_max`` ring units (one rounding to an
   integer plus the float error of the ``√2`` product, ``<= 2^-51`` relative).

So ``‖F(x) - F(x')‖₂ <= 2^f Δ₂ + ρ √d_off`` (triangle inequality), with
``d_off = l(l-1)/2`` off-diagonal entries of the one symmetric block that changes.
For ``l = 128``, ``f = 20`` that inflation is ``0.005 %``. The L1 sensitivity of an
integer difference vector is at most ``min(√d · Δ̃₂, Δ̃₂²)`` (every non-zero entry
has magnitude ``>= 1``), ``d`` the number of coordinates that can change.

A release computed any other way (plain float statistics) is **not** covered: its
float accumulation error is unbounded in this analysis.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.spherefed.stats import (
    CCVRStatistics,
    FFCStatistics,
    ccvr_layout_size,
    ffc_layout_size,
    triangle_size,
)

__all__ = [
    "DEFAULT_QUANT_BITS",
    "KINDS",
    "Sensitivity",
    "exact_ccvr_statistics",
    "exact_ffc_statistics",
    "l2_sensitivity",
    "quantize_unit_features",
    "release_length",
    "ring_sensitivity",
]

KINDS = ("ffc", "ccvr")
BLOCKS = {"ffc": 3, "ccvr": 3}
DEFAULT_QUANT_BITS = 10
_EXACT_LIMIT = 1 << 53


@dataclass(frozen=True)
class Sensitivity:
    """Sensitivities of one release (real units and ring units) and how they were bounded."""

    kind: str
    blocks: int
    l2: float
    """``√blocks`` in real units (the exact statistic, before fixed point)."""
    l2_ring: float
    """``2^f · l2 + ρ √d_off``: the bound the accountant uses."""
    l1_ring: float
    changed_coordinates: int
    rounded_coordinates: int
    scale_bits: int
    quant_bits: int
    max_examples: int
    rounding_inflation: float
    """``l2_ring / (2^f · l2) - 1``."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def release_length(kind: str, dim: int, num_classes: int) -> int:
    """Length of the packed release vector."""
    if kind == "ffc":
        return ffc_layout_size(dim, num_classes)
    if kind == "ccvr":
        return ccvr_layout_size(dim, num_classes)
    raise ValueError(f"release kind must be one of {KINDS}, got {kind!r}")


def l2_sensitivity(kind: str, blocks: int | None = None) -> float:
    """``√(number of blocks)`` — 3 for FFC and for CCVR (module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"release kind must be one of {KINDS}, got {kind!r}")
    return math.sqrt(BLOCKS[kind] if blocks is None else blocks)


def ring_sensitivity(
    kind: str,
    dim: int,
    num_classes: int,
    *,
    scale_bits: int,
    quant_bits: int = DEFAULT_QUANT_BITS,
    max_examples: int,
) -> Sensitivity:
    """L2/L1 sensitivity in ring units of an exact-statistics release (module docstring).

    ``max_examples`` bounds any participant's number of examples (it bounds the
    magnitude of the entries whose ``√2`` product rounds).
    """
    if kind not in KINDS:
        raise ValueError(f"release kind must be one of {KINDS}, got {kind!r}")
    if dim < 1 or num_classes < 1 or max_examples < 1 or quant_bits < 1:
        raise ValueError("dim, num_classes, max_examples and quant_bits must be >= 1")
    if scale_bits < quant_bits:
        raise ValueError(
            f"scale_bits ({scale_bits}) must be >= quant_bits ({quant_bits}) so that counts and "
            "first moments encode exactly"
        )
    tri = triangle_size(dim)
    off = dim * (dim - 1) // 2
    changed = 1 + tri + dim  # count, one symmetric block, one first-moment column/row
    rounded = off if scale_bits >= 2 * quant_bits else tri  # diagonals exact iff f >= 2q
    rho = 1.0 + math.ldexp(float(max_examples), scale_bits - 49)
    l2 = l2_sensitivity(kind)
    exact_part = math.ldexp(l2, scale_bits)
    l2_ring = exact_part + rho * math.sqrt(rounded)
    l2_ring = math.nextafter(l2_ring, math.inf)  # round the bound up, never down
    l1_ring = min(math.sqrt(changed) * l2_ring, l2_ring * l2_ring)
    return Sensitivity(
        kind=kind,
        blocks=BLOCKS[kind],
        l2=l2,
        l2_ring=l2_ring,
        l1_ring=math.nextafter(l1_ring, math.inf),
        changed_coordinates=changed,
        rounded_coordinates=rounded,
        scale_bits=scale_bits,
        quant_bits=quant_bits,
        max_examples=max_examples,
        rounding_inflation=l2_ring / exact_part - 1.0,
    )


# ---------------------------------------------------------- exact statistics
def quantize_unit_features(features: npt.ArrayLike, quant_bits: int) -> npt.NDArray[np.int64]:
    """Integer features ``Z = trunc(2^q · z/‖z‖)`` with ``Σ_i Z_i² <= 2^{2q}`` proven exactly.

    Rows are renormalised in float64 first (a zero row stays zero); truncation toward
    zero can only shrink every entry. The integer check catches the float renormalisation
    landing a hair above 1; such a row has its largest entry reduced by one unit.
    """
    z = np.asarray(features, dtype=np.float64)
    if z.ndim != 2 or not np.isfinite(z).all():
        raise ValueError("features must be a finite 2-D array")
    if not 1 <= quant_bits <= 24:
        raise ValueError("quant_bits must be in 1..24")
    norms = np.linalg.norm(z, axis=1, keepdims=True)
    unit = np.divide(z, norms, out=np.zeros_like(z), where=norms > 0)
    q = np.trunc(np.ldexp(unit, quant_bits)).astype(np.int64)
    limit = 1 << (2 * quant_bits)
    while True:
        over = np.flatnonzero((q * q).sum(axis=1) > limit)
        if not over.size:
            return q
        rows = q[over]
        j = np.abs(rows).argmax(axis=1)
        rows[np.arange(over.size), j] -= np.sign(rows[np.arange(over.size), j])
        q[over] = rows


def _exact_gram(zq: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    zf = zq.astype(np.float64)
    return zf.T @ zf  # integers < 2^53 throughout: exact in any summation order


def _check_exact(n: int, quant_bits: int) -> None:
    if n * (1 << (2 * quant_bits)) >= _EXACT_LIMIT:
        raise ValueError(
            f"{n} examples at quant_bits={quant_bits} exceed exact float64 sums; lower quant_bits"
        )


def exact_ffc_statistics(
    features: npt.ArrayLike, labels: npt.ArrayLike, num_classes: int, *, quant_bits: int
) -> FFCStatistics:
    """FFC statistics of quantised unit features, computed exactly (module docstring)."""
    zq = quantize_unit_features(features, quant_bits)
    y = np.asarray(labels, dtype=np.int64)
    if y.shape != (zq.shape[0],) or (y.size and (y.min() < 0 or y.max() >= num_classes)):
        raise ValueError("labels must be one integer in [0, num_classes) per feature row")
    _check_exact(zq.shape[0], quant_bits)
    onehot = np.zeros((zq.shape[0], num_classes), dtype=np.float64)
    onehot[np.arange(zq.shape[0]), y] = 1.0
    V = np.ldexp(_exact_gram(zq), -2 * quant_bits)
    U = np.ldexp(zq.astype(np.float64).T @ onehot, -quant_bits)
    return FFCStatistics(V=V, U=U, count=float(zq.shape[0]))


def exact_ccvr_statistics(
    features: npt.ArrayLike, labels: npt.ArrayLike, num_classes: int, *, quant_bits: int
) -> CCVRStatistics:
    """CCVR per-class statistics of quantised unit features, computed exactly."""
    zq = quantize_unit_features(features, quant_bits)
    y = np.asarray(labels, dtype=np.int64)
    if y.shape != (zq.shape[0],) or (y.size and (y.min() < 0 or y.max() >= num_classes)):
        raise ValueError("labels must be one integer in [0, num_classes) per feature row")
    _check_exact(zq.shape[0], quant_bits)
    dim = zq.shape[1]
    counts = np.zeros(num_classes)
    sums = np.zeros((num_classes, dim))
    moments = np.zeros((num_classes, dim, dim))
    for c in np.unique(y).tolist():
        zc = zq[y == c]
        counts[c] = zc.shape[0]
        sums[c] = np.ldexp(zc.sum(axis=0).astype(np.float64), -quant_bits)
        moments[c] = np.ldexp(_exact_gram(zc), -2 * quant_bits)
    return CCVRStatistics(counts=counts, sums=sums, second_moments=moments)
