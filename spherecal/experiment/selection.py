"""Learning-rate selection as the papers do it: best **validation** accuracy.

For every table row (method × calibration), column and seed, the learning rate is the
one with the best validation accuracy for that row's calibration (ties → the smaller
learning rate); the test split is never used to choose anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from spherecal.experiment.grid import ExperimentSettings, RunSpec
from spherecal.results_schema import CellRecord, Stats
from spherecal.spherefed.reference import ReferenceConfig

__all__ = ["Candidate", "Slot", "candidates", "finite", "select", "select_runs", "stats"]

Slot = tuple[str, str, int]  # (method key, column key, seed)
Candidate = tuple[RunSpec, CellRecord]


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(float(x))


def candidates(
    specs: Sequence[RunSpec], records: dict[str, CellRecord], base: ReferenceConfig
) -> dict[Slot, list[Candidate]]:
    """Grid runs grouped by (method, column, seed), in grid order."""
    out: dict[Slot, list[Candidate]] = {}
    for spec in specs:
        rec = records.get(spec.key(base))
        if rec is None:
            continue
        out.setdefault((spec.method.key, spec.column.key, spec.seed), []).append((spec, rec))
    return out


def select(cands: Sequence[Candidate], criterion: str) -> Candidate | None:
    """The run with the best validation accuracy for ``criterion`` (ties → earlier =
    smaller lr), among runs that did not diverge; ``None`` if all diverged."""
    best: Candidate | None = None
    best_val = -math.inf
    for spec, rec in cands:
        if rec.get("diverged"):
            continue
        val = rec.get("validation_accuracy", {}).get(criterion)
        if val is None or not finite(val):
            continue
        if float(val) > best_val:
            best, best_val = (spec, rec), float(val)
    return best


def select_runs(
    settings: ExperimentSettings,
    specs: Sequence[RunSpec],
    records: dict[str, CellRecord],
    base: ReferenceConfig,
    *,
    criterion: str,
) -> dict[Slot, RunSpec | None]:
    """For every (method, column, seed): the run chosen on validation ``criterion``."""
    chosen: dict[Slot, RunSpec | None] = {}
    for slot, cands in candidates(specs, records, base).items():
        pick = select(cands, criterion)
        chosen[slot] = None if pick is None else pick[0]
    return chosen


def stats(values: Sequence[float | None]) -> Stats:
    kept = [v for v in values if v is not None and finite(v)]
    if not kept:
        return {"mean": None, "std": None, "n": 0}
    arr = np.asarray(kept, dtype=np.float64)
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std, "n": int(arr.size)}
