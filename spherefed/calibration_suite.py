"""Every calibrator by name, with its hyper-parameter chosen on validation, never on test.

The closed forms of :mod:`spherecal.spherefed.discriminant` each have one knob — FFC+bias a
ridge ``λ``, LDA and QDA a shrinkage ``γ`` — and the right value depends on the
features (unit-norm sphere features vs raw ones, ``l`` vs ``N``, DP noise). A small
grid is solved from the *same* summed statistics (one upload, every grid point is a
local solve) and each candidate head is scored on the **validation** split; the best
(ties → the earlier, i.e. smaller, value) is the calibrated head, and only that one
is scored on test. The chosen value and the whole validation grid are reported.

Upload each calibrator needs (``l`` = feature dim, ``C`` = classes; secure
aggregation carries these sums, see ``spherecal.spherefed.stats``):

=========  ==========================================  ==========================
name       sums                                        numbers uploaded
=========  ==========================================  ==========================
ffc        ``N``, ``V``, ``U``                         ``1 + l(l+1)/2 + lC``
ffc_bias   ``V``, ``U``, ``N_c``                       ``C + l(l+1)/2 + lC``
lda        ``N_c``, ``S_c``, ``Σ_c M_c``               ``C + lC + l(l+1)/2``
qda        ``N_c``, ``S_c``, every ``M_c``             ``C + lC + C·l(l+1)/2``
ccvr       ``N_c``, ``S_c``, every ``M_c``             ``C + lC + C·l(l+1)/2``
=========  ==========================================  ==========================

(``ffc_bias`` and ``lda`` need the same numbers: ``U``'s columns are the ``S_c`` and
``V = Σ_c M_c``.) In-process and through the service the CCVR sums are collected
once, and every calibrator is derived from them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spherecal.spherefed.discriminant import CalibratedHead, ffc_bias_solve, lda_solve, qda_solve
from spherecal.spherefed.stats import CCVRStatistics, triangle_size

__all__ = [
    "CALIBRATION_NAMES",
    "CLOSED_FORMS",
    "DEFAULT_RIDGE_GRID",
    "DEFAULT_VALUE",
    "DEFAULT_SHRINKAGE_GRID",
    "Selection",
    "DP_SHRINKAGE_EXTRA",
    "NoisyGuard",
    "closed_form_head",
    "dp_grid",
    "guard_noisy_statistics",
    "head_accuracy",
    "select_on_validation",
    "upload_size",
]

CALIBRATION_NAMES: tuple[str, ...] = ("ffc", "ccvr", "ffc_bias", "lda", "qda")
"""Every calibrator: ``ffc`` and ``ccvr`` (bias-free, :mod:`spherecal.spherefed.calibrate`) and the
closed forms with a bias term (:data:`CLOSED_FORMS`)."""

CLOSED_FORMS: tuple[str, ...] = ("ffc_bias", "lda", "qda")
"""The calibrators whose hyper-parameter is chosen on validation here."""

DEFAULT_RIDGE_GRID: tuple[float, ...] = (0.0, 0.1, 1.0, 10.0, 100.0)
"""FFC+bias ridge ``λ`` candidates (absolute: ``V``'s eigenvalues scale with ``N``)."""

DEFAULT_SHRINKAGE_GRID: tuple[float, ...] = (0.0, 0.01, 0.03, 0.1, 0.3)
"""LDA/QDA shrinkage ``γ`` candidates (``0`` = the plain estimate, ``1`` = spherical)."""

DEFAULT_VALUE: dict[str, float] = {"ffc_bias": 0.1, "lda": 0.01, "qda": 0.03}
"""The value used when no validation sample exists anywhere (every site set
``[data] validation_fraction = 0``): the values the MNIST-1D calibration table chose
most often (``docs/baselines/mnist1d-calibration``) — a fixed guess, reported as
``"selection": "default, no validation"``, never a value picked on test."""

DP_SHRINKAGE_EXTRA: tuple[float, ...] = (0.6, 0.9)
"""Shrinkage values added to the grid when the sums carry DP noise (noisy covariances
want more shrinkage; ``bench/calibration_dp.py`` uses the same widening)."""

PARAMETER: dict[str, str] = {"ffc_bias": "ridge", "lda": "shrinkage", "qda": "shrinkage"}


def upload_size(name: str, dim: int, num_classes: int) -> int:
    """Numbers each participant uploads for calibrator ``name`` (table above)."""
    t, lc, c = triangle_size(dim), dim * num_classes, num_classes
    sizes = {
        "ffc": 1 + t + lc,
        "ffc_bias": c + t + lc,
        "lda": c + lc + t,
        "qda": c + lc + c * t,
        "ccvr": c + lc + c * t,
    }
    if name not in sizes:
        raise ValueError(f"unknown calibration {name!r}; expected one of {CALIBRATION_NAMES}")
    return sizes[name]


def closed_form_head(name: str, stats: CCVRStatistics, value: float) -> CalibratedHead:
    """The calibrated head of closed form ``name`` at ridge / shrinkage ``value``."""
    if name == "ffc_bias":
        ffc = stats.to_ffc()
        return ffc_bias_solve(ffc.V, ffc.U, stats.counts, ridge=value)
    if name == "lda":
        return lda_solve(stats, shrinkage=value)
    if name == "qda":
        return qda_solve(stats, shrinkage=value)
    raise ValueError(f"unknown closed-form calibration {name!r}; expected one of {CLOSED_FORMS}")


def head_accuracy(head: CalibratedHead, features: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy of ``head`` on ``N×l`` features (NaN when there are none)."""
    y = np.asarray(labels)
    if y.shape[0] == 0:
        return float("nan")
    return float(np.mean(head.predict(features) == y))


@dataclass(frozen=True)
class Selection:
    """The head chosen for one calibrator, its parameter, and the validation grid."""

    name: str
    head: CalibratedHead | None
    parameter: str
    value: float | None
    grid: list[dict[str, Any]]
    warnings: list[str]
    validation: float = float("nan")
    """Validation accuracy of the chosen head (NaN when none was chosen)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "parameter": self.parameter,
            "chosen": self.value,
            "grid": self.grid,
            "warnings": self.warnings,
        }


def select_on_validation(
    name: str,
    stats: CCVRStatistics,
    grid: Sequence[float],
    features: np.ndarray,
    labels: np.ndarray,
) -> Selection:
    """Solve ``name`` at every grid value, keep the best on the validation features.

    A grid point whose solve fails (e.g. a covariance with no positive eigenvalue)
    is recorded with ``accuracy: null`` and an ``error``; if every point fails the
    selection's head is ``None`` (the caller reports NaN, it does not invent a head).
    """
    if not grid:
        raise ValueError(f"{name}: the hyper-parameter grid is empty")
    rows: list[dict[str, Any]] = []
    best: tuple[float, float, CalibratedHead] | None = None
    notes: set[str] = set()
    for value in grid:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                head = closed_form_head(name, stats, float(value))
            except (ValueError, np.linalg.LinAlgError) as exc:
                rows.append({"value": float(value), "validation": None, "error": str(exc)})
                continue
        notes.update(str(w.message)[:160] for w in caught)
        acc = head_accuracy(head, features, labels)
        rows.append({"value": float(value), "validation": acc})
        if best is None or (np.isfinite(acc) and acc > best[1]):
            best = (float(value), acc, head)
    return Selection(
        name=name,
        head=None if best is None else best[2],
        parameter=PARAMETER[name],
        value=None if best is None else best[0],
        grid=rows,
        warnings=sorted(notes),
        validation=float("nan") if best is None else best[1],
    )


@dataclass(frozen=True)
class NoisyGuard:
    """What :func:`guard_noisy_statistics` changed (for ``results.json``)."""

    clipped_counts: list[int]
    """Classes whose noisy count was below 1 (raised to 1)."""
    psd_projected: list[int]
    """Classes whose within-class scatter had a negative eigenvalue (clipped to 0)."""

    def to_json(self) -> dict[str, Any]:
        return {"clipped_counts": self.clipped_counts, "psd_projected": self.psd_projected}


def guard_noisy_statistics(stats: CCVRStatistics) -> tuple[CCVRStatistics, NoisyGuard]:
    """Make DP-noised CCVR sums fit for the closed forms (post-processing of the
    release: no privacy cost).

    Noise can push a small class's count ``N_c`` to or below zero (``μ_c = S_c/N_c``
    explodes or the solve refuses negative counts) and leave the within-class scatter
    ``M_c − N_c μ_c μ_cᵀ`` indefinite (a "covariance" with negative variances, whose
    inverse rewards distance). So counts are clipped at 1 (as ``bench/calibration_dp.py``)
    and each class's scatter is projected onto the positive semi-definite cone
    (negative eigenvalues set to 0), ``M_c`` rebuilt from it; ``V = Σ_c M_c`` then is
    PSD too. One ``l×l`` eigen-decomposition per class.
    """
    counts = np.asarray(stats.counts, dtype=np.float64)
    sums = np.asarray(stats.sums, dtype=np.float64)
    second = np.asarray(stats.second_moments, dtype=np.float64)
    low = counts < 1.0
    counts = np.maximum(counts, 1.0)
    means = sums / counts[:, None]
    outer = counts[:, None, None] * np.einsum("ci,cj->cij", means, means)
    scatter = second - outer
    scatter = (scatter + np.swapaxes(scatter, 1, 2)) / 2.0
    eigvals, eigvecs = np.linalg.eigh(scatter)  # batched over classes
    negative: np.ndarray = np.asarray((eigvals < 0).any(axis=1))
    fixed = np.einsum("cij,cj,ckj->cik", eigvecs, np.clip(eigvals, 0.0, None), eigvecs)
    scatter = np.where(negative[:, None, None], fixed, scatter)
    guarded = CCVRStatistics(counts, sums, scatter + outer)
    return guarded, NoisyGuard(
        clipped_counts=[int(c) for c in np.flatnonzero(low)],
        psd_projected=[int(c) for c in np.flatnonzero(negative)],
    )


def dp_grid(name: str, grid: Sequence[float], dp_ridge: float) -> tuple[float, ...]:
    """``grid`` moved to the DP noise's scale, *same length* (so a validation
    evaluation carries no more heads than without DP; the participants'
    ``max_validation_heads`` policy still holds).

    FFC+bias: ridges around ``dp_ridge ≈ 2√l·σ`` (the noise matrix's spectral norm),
    ``dp_ridge · 2^(k − (n−1)/2)`` for ``k = 0 … n−1`` (``n = 5``: ¼ … 4 × it) —
    a ridge far below the noise leaves ``V + λI`` indefinite. LDA/QDA: the ``n``
    largest of ``grid ∪`` :data:`DP_SHRINKAGE_EXTRA` (noisy covariances want more
    shrinkage; ``bench/calibration_dp.py`` widens the same way). Sorted ascending.
    """
    n = len(grid)
    if n == 0:
        raise ValueError(f"{name}: the hyper-parameter grid is empty")
    if name == "ffc_bias":
        if not (dp_ridge > 0 and np.isfinite(dp_ridge)):
            raise ValueError(f"dp_ridge must be a finite positive number, got {dp_ridge}")
        return tuple(float(dp_ridge * 2.0 ** (k - (n - 1) / 2)) for k in range(n))
    if name in ("lda", "qda"):
        values = sorted({float(v) for v in (*grid, *DP_SHRINKAGE_EXTRA)})
        return tuple(values[-n:])
    raise ValueError(f"unknown closed-form calibration {name!r}; expected one of {CLOSED_FORMS}")
