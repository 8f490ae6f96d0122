"""Calibration from aggregated statistics: FFC's closed form and CCVR, exactly as
the reference runner computes them (same solver, same derived CCVR seed).

Inputs are the *sums* over participants — from secure aggregation (masked, rounded to
the job's fixed-point scale) or, with secure aggregation off, from the ordered
plaintext sum — in ``spherecal.spherefed.stats``'s flat layouts.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from spherecal.spherefed.calibrate import CCVRConfig, ccvr_calibrate, ffc_solve
from spherecal.spherefed.fl import derive_seed
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

__all__ = ["ccvr_classifier", "ffc_classifier", "unpack_statistics"]


def unpack_statistics(
    kind: str,
    vector: npt.NDArray[np.float64],
    dim: int,
    num_classes: int,
    *,
    isometric: bool = False,
) -> FFCStatistics | CCVRStatistics:
    """``isometric``: the DP layout (off-diagonal triangle entries scaled by √2)."""
    if kind == "ffc":
        return FFCStatistics.unpack(vector, dim, num_classes, isometric=isometric)
    if kind == "ccvr":
        return CCVRStatistics.unpack(vector, dim, num_classes, isometric=isometric)
    raise ValueError(f"unknown statistics kind {kind!r}")


def ffc_classifier(stats: FFCStatistics, ridge: float) -> tuple[npt.NDArray[np.float64], list[str]]:
    """``W* = (V + λI)⁻¹ U`` (C×l) and any solver warnings (as text)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weight = ffc_solve(stats.V, stats.U, ridge=ridge)
    return weight, [str(w.message) for w in caught]


def ccvr_classifier(
    stats: CCVRStatistics, init: npt.NDArray[np.float64], config: CCVRConfig, seed: int
) -> tuple[npt.NDArray[np.float64], list[str]]:
    """CCVR's retrained classifier with the reference runner's derived seed."""
    cfg = replace(config, seed=derive_seed(seed, "ccvr", config.seed))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weight = ccvr_calibrate(stats, np.asarray(init, dtype=np.float64), cfg)
    return weight, [str(w.message) for w in caught]
