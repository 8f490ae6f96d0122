"""Throughput of the exact integer DP-noise samplers (:func:`spherecal.crypto.dp.sample_noise`).

For each mechanism and per-participant standard deviation, draws one participant's
noise vector of ``--entries`` entries (default 13 M, the size of a small CNN's
update) with an OS-keyed :class:`spherecal.crypto.entropy.RandomSource`, exactly as a
participant does, and reports wall time and entries per second (best of
``--repeats``). Single process, single thread; the machine may be shared, so run on
an idle one when the numbers matter. Prints JSON::

    .venv/bin/python bench/dp_noise.py --entries 13000000
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

import numpy as np

from spherecal.crypto.dp import DGAUSS, SKELLAM, plan_noise, sample_noise


def measure(mechanism: str, stddev: float, entries: int, repeats: int) -> dict[str, object]:
    plan = plan_noise(
        stddev**2, min_contributors=1, participants=2, length=entries, mechanism=mechanism
    )
    best = math.inf
    sample = np.zeros(0, dtype=np.int64)
    for _ in range(repeats):
        t0 = time.perf_counter()
        sample = sample_noise(plan)
        best = min(best, time.perf_counter() - t0)
    return {
        "mechanism": mechanism,
        "stddev": stddev,
        "parameter": plan.parameter,
        "entries": entries,
        "seconds": best,
        "entries_per_second": entries / best,
        "empirical_stddev": float(sample.std()),
        "noise_bound": plan.noise_bound,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--entries", type=int, default=13_000_000)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--stddevs", type=lambda s: [float(x) for x in s.split(",")], default=[1e2, 1e6])
    args = p.parse_args()
    rows = [
        measure(m, sd, args.entries, args.repeats) for m in (SKELLAM, DGAUSS) for sd in args.stddevs
    ]
    print(
        json.dumps(
            {"python": platform.python_version(), "numpy": np.__version__, "results": rows},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
