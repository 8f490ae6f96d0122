"""What the aggregate checks cost: the PSD rule by a Cholesky factorisation against the
eigenvalues it replaced (:mod:`spherecal.coordinator.driver.invariants`).

Every calibration aggregate is checked before it becomes a classifier; its largest
part is the positive-semi-definite rule on ``V`` and the augmented moment matrix (FFC)
or on each class's ``M_c`` and augmented matrix (CCVR). Both stages, secure and
plaintext, pay it once per aggregate, after the last upload. Per shape, interleaved
over ``--repeats`` rounds: ``check_ffc`` / ``check_ccvr`` as the coordinator calls them
(the factorisation shows the pass) and the same call with the factorisation disabled,
which decides by the eigenvalues alone — what every check did before. Inputs are
honest sums of random unit-norm features, so both pass. Shapes: FFC at l = 1280,
C = 100 (as ``bench/ffc_stage.py``) and CCVR at l = 512, C = 100 (``--quick``: l = 256,
C = 20 for both).

Usage::

    python bench/invariants.py [--repeats 5] [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as `python bench/invariants.py`: `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import emit_json
from spherecal.coordinator.driver import invariants
from spherecal.spherefed.stats import ccvr_statistics, ffc_statistics


def _features(n: int, dim: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(dim * 1000 + classes)
    z = rng.normal(size=(n, dim))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return z, rng.integers(0, classes, size=n)


def _timed(check: Callable[[], None], repeats: int) -> dict[str, list[float]]:
    """``check`` with the factorisation (``cholesky``) and without (``eigenvalues``),
    the order alternating per round."""
    fast = invariants._within_psd_slack
    times: dict[str, list[float]] = {"cholesky": [], "eigenvalues": []}
    try:
        for rep in range(repeats):
            order = ("cholesky", "eigenvalues") if rep % 2 == 0 else ("eigenvalues", "cholesky")
            for how in order:
                invariants._within_psd_slack = (
                    fast if how == "cholesky" else (lambda matrices, slack: False)
                )
                start = time.perf_counter()
                check()
                times[how].append(time.perf_counter() - start)
    finally:
        invariants._within_psd_slack = fast
    return times


def _summary(times: dict[str, list[float]]) -> dict[str, Any]:
    medians = {how: statistics.median(v) for how, v in times.items()}
    return {
        **{
            f"{how}_ms": {
                "median": round(1000 * medians[how], 1),
                "min": round(1000 * min(v), 1),
                "max": round(1000 * max(v), 1),
            }
            for how, v in times.items()
        },
        "cholesky_over_eigenvalues": round(medians["cholesky"] / medians["eigenvalues"], 3),
    }


def measure(kind: str, dim: int, classes: int, repeats: int) -> dict[str, Any]:
    """``kind`` (``ffc`` or ``ccvr``): that check on an honest aggregate of this shape."""
    z, y = _features(max(4 * dim, 2000), dim, classes)
    tol = invariants.Tolerance(quantum=10 * 2.0**-24)
    if kind == "ffc":
        ffc = ffc_statistics(z, y, classes)
        times = _timed(lambda: invariants.check_ffc(ffc, unit_norm=True, tol=tol), repeats)
    else:
        ccvr = ccvr_statistics(z, y, classes)
        times = _timed(lambda: invariants.check_ccvr(ccvr, unit_norm=True, tol=tol), repeats)
    return {"check": kind, "dim": dim, "classes": classes, **_summary(times)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="rounds, the order alternating")
    p.add_argument("--quick", action="store_true", help="l = 256, C = 20 only")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    shapes = (
        [("ffc", 256, 20), ("ccvr", 256, 20)]
        if args.quick
        else [("ffc", 1280, 100), ("ccvr", 512, 100)]
    )
    results = [measure(kind, dim, classes, args.repeats) for kind, dim, classes in shapes]
    emit_json(
        {
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or None},
            "repeats": args.repeats,
            "checks": results,
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
