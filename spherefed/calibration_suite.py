"""Every calibrator by name, with its hyper-parameter chosen on validation, never on test.

The closed forms of :mod:`spherefed.discriminant` each have one knob — FFC+bias a
ridge ``λ``, LDA and QDA a shrinkage ``γ`` — and the right value depends on the
features (unit-norm sphere features vs raw ones, ``l`` vs ``N``, DP noise). A small
grid is solved from the *same* summed statistics (one upload, every grid point is a
local solve) and each candidate head is scored on the **validation** split; the best
(ties → the earlier, i.e. smaller, value) is the calibrated head, and only that one
is scored on test. The chosen value and the whole validation grid are reported.

Upload each calibrator needs (``l`` = feature dim, ``C`` = classes; secure
aggregation carries these sums, see ``spherefed.stats``):

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

from spherefed.discriminant import CalibratedHead, ffc_bias_solve, lda_solve, qda_solve
from spherefed.stats import CCVRStatistics, triangle_size

__all__ = [
    "CALIBRATION_NAMES",
    "CLOSED_FORMS",
    "DEFAULT_RIDGE_GRID",
    "DEFAULT_SHRINKAGE_GRID",
    "Selection",
    "closed_form_head",
    "head_accuracy",
    "select_on_validation",
    "upload_size",
]

CALIBRATION_NAMES: tuple[str, ...] = ("ffc", "ccvr", "ffc_bias", "lda", "qda")
"""Every calibrator: ``ffc`` and ``ccvr`` (bias-free, :mod:`spherefed.calibrate`) and the
closed forms with a bias term (:data:`CLOSED_FORMS`)."""

CLOSED_FORMS: tuple[str, ...] = ("ffc_bias", "lda", "qda")
"""The calibrators whose hyper-parameter is chosen on validation here."""

DEFAULT_RIDGE_GRID: tuple[float, ...] = (0.0, 0.1, 1.0, 10.0, 100.0)
"""FFC+bias ridge ``λ`` candidates (absolute: ``V``'s eigenvalues scale with ``N``)."""

DEFAULT_SHRINKAGE_GRID: tuple[float, ...] = (0.0, 0.01, 0.03, 0.1, 0.3)
"""LDA/QDA shrinkage ``γ`` candidates (``0`` = the plain estimate, ``1`` = spherical)."""

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
