"""Invariants every honest calibration aggregate satisfies, checked before it becomes
a classifier.

Why: secure aggregation hides who contributed what, so a malicious participant can
upload a well-formed, in-bound vector that is not the statistics of any data
(negative counts, an indefinite "second moment", a class sum larger than the class
could produce). The range check (``spherecal.crypto.server``) bounds each entry; these checks
bound the *structure*. Each holds for any sum of honest inputs because each honest
input is ``Σ_i [1; z_i][1; z_i]ᵀ``-shaped:

* counts are non-negative integers (FFC's ``count``, CCVR's ``N_c``);
* ``V = Σ z zᵀ`` and every ``M_c = Σ_{y=c} z zᵀ`` are positive semi-definite
  (SphereFed Eq. 9, CCVR Eq. 2);
* the augmented moment matrices ``[[N_c, S_cᵀ], [S_c, M_c]]`` (and for FFC
  ``[[count, (U·1)ᵀ], [U·1, V]]``) are PSD — this is what ties the per-class sums
  ``S_c = U[:, c]`` to the counts (``‖S_c‖² ≤ N_c·tr M_c``; for unit-norm features
  ``‖S_c‖ ≤ N_c``);
* with unit-norm features (the ``sphere`` and ``fn`` heads) ``tr V = count`` and
  ``tr M_c = N_c``;
* when both kinds come from the same contributors, FFC's count equals ``Σ_c N_c``.

Tolerances: fixed-point rounding contributes at most ``contributors · 2^-scale_bits``
per entry (``quantum``), float32 feature normalisation a relative ``1e-4`` on the
traces; with DP noise of standard deviation ``σ`` per entry, a count may move by
``6σ``, a trace by ``6σ√l`` and an eigenvalue by ``6σ·2√(l+1)`` (the spectral norm of
a symmetric noise matrix is ``≈ 2√l·σ``), and integrality is not checked. A DP
release's exact statistics truncate each unit feature to the ``2^-q`` grid
(``spherefed.privacy.sensitivity.quantize_unit_features``), which shrinks ``‖z‖²`` by
up to ``2·2^-q·‖z‖₁ ≤ 2^{1−q}√l``: the traces may then fall that fraction below the
count (``truncation``), never above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

__all__ = [
    "AggregateInvariantViolated",
    "Tolerance",
    "check_ccvr",
    "check_ffc",
    "check_pair",
]


class AggregateInvariantViolated(ValueError):
    """The aggregate is not the sum of any honest statistics; ``invariant`` names
    which check failed (``counts``, ``psd``, ``moments``, ``trace``, ``pair``)."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """How far an honest aggregate may stray from the exact identities."""

    quantum: float = 0.0
    """Fixed-point rounding per entry: ``contributors · 2^-scale_bits``."""
    noise_sigma: float = 0.0
    """DP noise standard deviation per entry, in real units (0: no noise)."""
    relative: float = 1e-4
    """Relative slack of the trace identities (float32 normalisation)."""
    truncation: float = 0.0
    """How far below the count a trace may fall, relative (``2^{1−q}√l`` for a DP
    release's truncated features; 0 for float statistics)."""

    def trace_outside(self, dim: int, trace: float, count: float) -> bool:
        """``tr = count`` broken beyond the slack (one-sided for ``truncation``)."""
        slack = self.trace(dim, count)
        return trace > count + slack or trace < count * (1.0 - self.truncation) - slack

    def count(self) -> float:
        return self.quantum + 1e-9 + 6.0 * self.noise_sigma

    def trace(self, dim: int, value: float) -> float:
        return (
            dim * self.quantum
            + self.relative * max(1.0, abs(value))
            + 6.0 * self.noise_sigma * math.sqrt(dim)
        )

    def eigen(self, dim: int, scale: float) -> float:
        return (
            dim * self.quantum
            + 1e-9 * max(1.0, scale)
            + 6.0 * self.noise_sigma * 2.0 * math.sqrt(dim + 1)
        )


def _counts(values: npt.NDArray[np.float64], tol: Tolerance, what: str) -> None:
    if not np.all(np.isfinite(values)):
        raise AggregateInvariantViolated("counts", f"{what} are not finite")
    slack = tol.count()
    if np.any(values < -slack):
        raise AggregateInvariantViolated("counts", f"{what} has a negative entry")
    if tol.noise_sigma == 0.0 and np.any(np.abs(values - np.rint(values)) > slack):
        raise AggregateInvariantViolated("counts", f"{what} are not integers")


def _min_eigenvalue(matrices: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    sym = 0.5 * (matrices + np.swapaxes(matrices, -1, -2))
    return np.asarray(np.linalg.eigvalsh(sym)[..., 0], dtype=np.float64)


PSD_BATCH = 16
"""Matrices factorised at once by :func:`_within_psd_slack` (bounds its working copy:
16 × 513 × 513 doubles ≈ 34 MB for CCVR at l = 512)."""


def _within_psd_slack(matrices: npt.NDArray[np.float64], slack: npt.NDArray[np.float64]) -> bool:
    """Whether every ``matrices[i] + slack[i]·I`` has a Cholesky factor, i.e. every
    lowest eigenvalue is above ``-slack[i]`` — the PSD check's pass, without the
    eigenvalues.

    Why: a Cholesky factorisation is several times cheaper than a symmetric
    eigendecomposition (at l = 1281, ≈ 44 against ≈ 390 ms on the development
    machine, best of 5), and an honest aggregate always passes, so the eigenvalues
    are needed only to name a failure. ``False`` is not a verdict: the caller then
    computes the eigenvalues and applies the rule to them, so a factorisation that
    fails near the boundary never refuses an aggregate the rule accepts. A success
    can accept one the rule would refuse only by a rounding error: Cholesky's
    backward error and the computed lowest eigenvalue's are both of the order of
    ``l·2^-53·‖M‖`` — for unit-norm features ``‖M‖ ≤ count``, far below the rule's
    own ``1e-9·max(1, count)`` term (:meth:`Tolerance.eigen`)."""
    dim = matrices.shape[-1]
    stack = matrices.reshape(-1, dim, dim)
    shifts = np.broadcast_to(np.asarray(slack, dtype=np.float64).reshape(-1), (len(stack),))
    diagonal = np.arange(dim)
    for start in range(0, len(stack), PSD_BATCH):
        block = stack[start : start + PSD_BATCH]
        sym = block + np.swapaxes(block, -1, -2)
        sym *= 0.5
        sym[:, diagonal, diagonal] += shifts[start : start + PSD_BATCH, None]
        try:
            np.linalg.cholesky(sym)
        except np.linalg.LinAlgError:
            return False
    return True


def _augmented(
    counts: npt.NDArray[np.float64], sums: npt.NDArray[np.float64], moments: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``[[N, Sᵀ], [S, M]]`` per class (batched)."""
    c, dim = sums.shape
    out = np.empty((c, dim + 1, dim + 1), dtype=np.float64)
    out[:, 0, 0] = counts
    out[:, 0, 1:] = sums
    out[:, 1:, 0] = sums
    out[:, 1:, 1:] = moments
    return out


def _psd(
    matrices: npt.NDArray[np.float64], counts: npt.NDArray[np.float64], tol: Tolerance, what: str
) -> None:
    """Refuse unless every matrix's lowest eigenvalue is at least ``-tol.eigen``
    (SphereFed Eq. 9, CCVR Eq. 2: sums of ``z zᵀ`` are PSD); the eigenvalues are
    computed only when the cheap factorisation does not already show the pass."""
    dim = matrices.shape[-1]
    slack = np.array([tol.eigen(dim, float(n)) for n in np.atleast_1d(counts)])
    if _within_psd_slack(matrices, slack):
        return
    lowest = _min_eigenvalue(matrices)
    for index, (low, limit) in enumerate(zip(np.atleast_1d(lowest), slack, strict=True)):
        if low < -limit:
            label = what if lowest.ndim == 0 else f"{what}[{index}]"
            raise AggregateInvariantViolated(
                "psd" if "moment matrix" not in what else "moments",
                f"{label} is not positive semi-definite (lowest eigenvalue {low:.4g})",
            )


def check_ffc(stats: FFCStatistics, *, unit_norm: bool, tol: Tolerance) -> None:
    """Raise :class:`AggregateInvariantViolated` unless ``stats`` could be honest."""
    count = np.array([stats.count], dtype=np.float64)
    _counts(count, tol, "the FFC count")
    if not (np.all(np.isfinite(stats.V)) and np.all(np.isfinite(stats.U))):
        raise AggregateInvariantViolated("psd", "V or U is not finite")
    _psd(stats.V, count[0], tol, "V")
    total = stats.U.sum(axis=1)
    _psd(_augmented(count, total[None, :], stats.V[None])[0], count[0], tol, "the moment matrix")
    if unit_norm:
        trace = float(np.trace(stats.V))
        if tol.trace_outside(stats.dim, trace, stats.count):
            raise AggregateInvariantViolated(
                "trace", f"tr V = {trace:.6g} but count = {stats.count:.6g} (unit-norm features)"
            )


def check_ccvr(stats: CCVRStatistics, *, unit_norm: bool, tol: Tolerance) -> None:
    """Raise :class:`AggregateInvariantViolated` unless ``stats`` could be honest."""
    counts = np.asarray(stats.counts, dtype=np.float64)
    _counts(counts, tol, "the CCVR class counts")
    if not (np.all(np.isfinite(stats.sums)) and np.all(np.isfinite(stats.second_moments))):
        raise AggregateInvariantViolated("psd", "class sums or second moments are not finite")
    _psd(stats.second_moments, counts, tol, "M_c")
    augmented = _augmented(counts, stats.sums, stats.second_moments)
    _psd(augmented, counts, tol, "the moment matrix [[N_c, S_cᵀ], [S_c, M_c]]")
    if unit_norm:
        traces = np.trace(stats.second_moments, axis1=1, axis2=2)
        for c, (trace, n) in enumerate(zip(traces, counts, strict=True)):
            if tol.trace_outside(stats.dim, float(trace), float(n)):
                raise AggregateInvariantViolated(
                    "trace", f"tr M_{c} = {trace:.6g} but N_{c} = {n:.6g} (unit-norm features)"
                )


def check_pair(ffc: FFCStatistics, ccvr: CCVRStatistics, *, tol: Tolerance) -> None:
    """FFC and CCVR over the same contributors: ``count = Σ_c N_c``."""
    total = float(np.sum(ccvr.counts))
    slack = tol.count() * (1 + ccvr.num_classes)
    if abs(ffc.count - total) > slack:
        raise AggregateInvariantViolated(
            "pair", f"FFC count {ffc.count:.6g} differs from Σ_c N_c = {total:.6g}"
        )
