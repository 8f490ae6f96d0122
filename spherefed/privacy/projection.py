"""Noisy calibration sums made consistent before they are solved (post-processing).

Why: a DP release adds independent noise to every entry of the summed statistics, so
the sum the coordinator decodes is no longer something any data set could produce —
a class count can be negative (3 contributors at ε = 1 on digits: σ ≈ 9 per count), a
class mean ``S_c / N_c`` can lie far outside the unit ball, a scatter matrix can be
indefinite. The solvers rightly refuse such input ("class counts must be
non-negative"); the fix is not to loosen them but to *project* the release onto the
set of statistics honest data can give. That is post-processing of a DP output, so
it costs no privacy (Dwork & Roth 2014, Prop. 2.1), and it only moves the estimate
towards the feasible set, where the truth lies.

For CCVR's per-class sums ``(N_c, S_c, M_c)`` (CCVR Eq. 2–4):

1. **counts**: ``N_c < min_count`` makes the class empty (``N_c = 0``, ``S_c = 0``,
   ``M_c = 0``): a class whose count is not above the noise carries no usable mean or
   covariance, and treating it as absent is what the solvers already do for a class
   no site has (no virtual features, never predicted by LDA/QDA);
2. **means**: with unit-norm features (SphereFed's normalised head) every sample lies
   on the unit sphere, so ``‖μ_c‖ = ‖S_c‖ / N_c ≤ 1``; a longer noisy ``S_c`` is
   scaled back onto that ball;
3. **scatter**: the within-class scatter ``M_c − S_c S_cᵀ / N_c`` is projected onto
   the positive semi-definite cone (negative eigenvalues set to 0: the nearest PSD
   matrix in Frobenius norm, Higham 1988), and ``M_c`` is rebuilt from it — so the
   moment matrix ``[[N_c, S_cᵀ], [S_c, M_c]]`` is PSD, the invariant
   ``coordinator.driver.invariants`` checks;
4. **trace** (``match_trace``, unit-norm features only): ``tr M_c = N_c`` for unit
   vectors, so the scatter's trace is known exactly, ``N_c − ‖S_c‖² / N_c``; the
   eigenvalue clip of step 3 inflates it by the positive half of the noise spectrum,
   and scaling the scatter back to the known trace removes that inflation.

FFC's ``V`` is left as is: the solver's ridge (``≥ 2√l·σ``) already makes
``V + λI`` positive definite. ``project_ffc`` offers the same PSD step for the
benchmark (``bench/dp_calibration.py``), which measures whether it helps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

__all__ = ["Projection", "project_ccvr", "project_ffc", "psd_part"]


@dataclass(frozen=True)
class Projection:
    """What the projection changed (for the results and the log; no statistic in it)."""

    emptied_classes: tuple[int, ...] = field(default=())
    """Classes whose noisy count was below ``min_count`` (treated as absent)."""
    negative_counts: tuple[int, ...] = field(default=())
    """Classes whose noisy count was negative (a subset of ``emptied_classes``)."""
    shrunk_means: tuple[int, ...] = field(default=())
    """Classes whose mean was outside the unit ball (unit-norm features)."""
    clipped_eigenvalues: int = 0
    """Negative scatter eigenvalues set to zero, over all classes."""

    def to_json(self) -> dict[str, object]:
        return {
            "emptied_classes": list(self.emptied_classes),
            "negative_counts": list(self.negative_counts),
            "shrunk_means": list(self.shrunk_means),
            "clipped_eigenvalues": self.clipped_eigenvalues,
        }

    def notes(self) -> list[str]:
        """One line per kind of change, for the coordinator's log."""
        out = []
        if self.negative_counts:
            out.append(f"noisy class counts below zero for classes {list(self.negative_counts)}")
        if self.emptied_classes:
            out.append(
                f"classes {list(self.emptied_classes)} treated as empty (count below the noise)"
            )
        if self.shrunk_means:
            out.append(f"class means of {list(self.shrunk_means)} scaled onto the unit ball")
        if self.clipped_eigenvalues:
            out.append(f"{self.clipped_eigenvalues} negative scatter eigenvalues set to zero")
        return out


def psd_part(matrices: np.ndarray) -> tuple[np.ndarray, int]:
    """The nearest PSD matrix (Frobenius) of each symmetric matrix in a stack, and how
    many eigenvalues were negative."""
    sym = 0.5 * (matrices + np.swapaxes(matrices, -1, -2))
    eigvals, eigvecs = np.linalg.eigh(sym)
    negative = int(np.count_nonzero(eigvals < 0))
    clipped = np.clip(eigvals, 0.0, None)
    out = np.einsum("...ij,...j,...kj->...ik", eigvecs, clipped, eigvecs)
    return 0.5 * (out + np.swapaxes(out, -1, -2)), negative


def project_ccvr(
    stats: CCVRStatistics,
    *,
    unit_norm: bool,
    min_count: float = 1.0,
    match_trace: bool = False,
) -> tuple[CCVRStatistics, Projection]:
    """``stats`` projected onto sums honest data can give (module docstring, steps
    1–4); ``min_count`` ≥ 1 so that every kept class has a finite mean."""
    if not min_count >= 1.0:
        raise ValueError(f"min_count must be at least 1, got {min_count}")
    counts = np.asarray(stats.counts, dtype=np.float64).copy()
    sums = np.asarray(stats.sums, dtype=np.float64).copy()
    second = np.asarray(stats.second_moments, dtype=np.float64).copy()
    if not (np.isfinite(counts).all() and np.isfinite(sums).all() and np.isfinite(second).all()):
        raise ValueError("noisy CCVR statistics contain NaN or Inf")
    negative = tuple(int(c) for c in np.flatnonzero(counts < 0))
    low = counts < min_count
    emptied = tuple(int(c) for c in np.flatnonzero(low & (stats.counts != 0)))
    counts[low] = 0.0
    sums[low] = 0.0
    second[low] = 0.0
    kept = np.flatnonzero(~low)
    shrunk: tuple[int, ...] = ()
    clipped_total = 0
    if kept.size:
        n = counts[kept]
        s = sums[kept]
        if unit_norm:
            norms = np.linalg.norm(s, axis=1)
            over = norms > n
            shrunk = tuple(int(c) for c in kept[over])
            s[over] *= (n[over] / norms[over])[:, None]
        outer = np.einsum("ci,cj->cij", s, s) / n[:, None, None]
        scatter, clipped_total = psd_part(second[kept] - outer)
        if unit_norm and match_trace:
            target = np.clip(n - np.einsum("ci,ci->c", s, s) / n, 0.0, None)
            trace = np.trace(scatter, axis1=1, axis2=2)
            factor = np.where(trace > 0, target / np.where(trace > 0, trace, 1.0), 0.0)
            scatter = scatter * factor[:, None, None]
        sums[kept] = s
        second[kept] = scatter + outer
    projection = Projection(
        emptied_classes=emptied,
        negative_counts=negative,
        shrunk_means=shrunk,
        clipped_eigenvalues=clipped_total,
    )
    return CCVRStatistics(counts, sums, second), projection


def project_ffc(stats: FFCStatistics) -> tuple[FFCStatistics, int]:
    """``V`` onto the PSD cone (and the count at least 0); how many eigenvalues of
    ``V`` were negative."""
    V, negative = psd_part(np.asarray(stats.V, dtype=np.float64))
    return FFCStatistics(V=V, U=np.asarray(stats.U).copy(), count=max(stats.count, 0.0)), negative
