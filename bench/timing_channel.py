"""How much the timing of each secure-aggregation message says about a participant's
example count (issue #9, "no timing leak of example counts").

Runs ``spherecal simulate`` (real processes, real gRPC; Dirichlet α = 0.1 by default
so local training sets differ several-fold), then reads the coordinator's audit
table: for every update job, each participant's offset from the job's first
message of a stage — advertisement, share answer, first masked chunk — and the
Pearson correlation of those offsets with the participant's local example count
(read from its own log, ``trained … on N samples``). Prints JSON::

    python bench/timing_channel.py --runs 2
    python bench/timing_channel.py --participants 5 --rounds 3 --model mlp
    python bench/timing_channel.py --measure KEPT/run0 KEPT/run1   # re-analyse only

Expected with the current participant: advertisement and share offsets carry no
example count (they precede the local work); the masked upload follows the local
work by nature, so its offsets track the count unless ``[policy] min_local_work_s``
holds every input to the same delay (``docs/threat_model.md``, "Timing").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spherecal.timing_channel import MESSAGES, message_offsets

SAMPLES = re.compile(r"trained \d+ steps on (\d+) samples")


def sample_counts(out: Path) -> dict[str, int]:
    """Each participant's local example count, from its own log."""
    samples: dict[str, int] = {}
    for log in sorted((out / "logs").glob("p*.log")):
        found = SAMPLES.search(log.read_text())
        if found is not None:
            samples[log.stem] = int(found.group(1))
    return samples


def pairs(out: Path) -> dict[str, tuple[list[int], list[float]]]:
    """(example counts, offsets) of every measured message of the simulation in ``out``."""
    samples = sample_counts(out)
    db = out / "coordinator" / "state" / "state.db"
    out_pairs: dict[str, tuple[list[int], list[float]]] = {}
    for name, (stage, kind) in MESSAGES.items():
        xs: list[int] = []
        ys: list[float] = []
        for pid, values in message_offsets(db, stage, kind).items():
            if pid in samples:
                xs.extend([samples[pid]] * len(values))
                ys.extend(values)
        out_pairs[name] = (xs, ys)
    return out_pairs


def correlations(measured: dict[str, tuple[list[int], list[float]]]) -> dict[str, Any]:
    """Pearson correlation of offsets with example counts, and the largest offset."""
    return {
        "correlation_with_example_count": {
            name: float(np.corrcoef(xs, ys)[0, 1]) if np.std(ys) > 0 else 0.0
            for name, (xs, ys) in measured.items()
        },
        "max_offset_s": {name: float(max(ys, default=0.0)) for name, (_, ys) in measured.items()},
        "points": {name: len(ys) for name, (_, ys) in measured.items()},
    }


def measure(out: Path) -> dict[str, Any]:
    """Correlations and offset ranges of one finished simulation in ``out``."""
    return {**correlations(pairs(out)), "samples": sample_counts(out)}


def pooled(outs: Sequence[Path]) -> dict[str, Any]:
    """The correlation over every run's (example count, offset) pairs together: 5
    participants give 5 distinct counts per run, too few for one run's figure to be
    more than a rough sign."""
    together: dict[str, tuple[list[int], list[float]]] = {n: ([], []) for n in MESSAGES}
    for out in outs:
        for name, (xs, ys) in pairs(out).items():
            together[name][0].extend(xs)
            together[name][1].extend(ys)
    return correlations(together)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/timing_channel.py",
        description="Correlation of secure-aggregation message timing with example counts.",
    )
    parser.add_argument("--participants", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calibration", default="ffc")
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--alpha", default="0.1")
    parser.add_argument("--runs", type=int, default=1, help="independent simulations")
    parser.add_argument("--keep", type=Path, help="keep the simulation outputs here")
    parser.add_argument(
        "--measure", type=Path, nargs="+", help="only analyse these kept simulation outputs"
    )
    args = parser.parse_args(argv)
    if args.measure:
        done = [d for d in args.measure if (d / "results.json").exists()]
        analysed = [{"out": str(d), **measure(d)} for d in done]
        print(json.dumps({"runs": analysed, "pooled": pooled(done)}, indent=2))
        return 0
    from spherecal.cli.app import main as cli_main  # the CLI under test, imported late

    runs: list[dict[str, Any]] = []
    outs = []
    for k in range(args.runs):
        root = args.keep or Path(tempfile.mkdtemp(prefix="timing-channel-"))
        out = root / f"run{k}"
        t0 = time.monotonic()
        with contextlib.redirect_stdout(sys.stderr):  # its summary: not this JSON
            code = cli_main(
                ["simulate", "--participants", str(args.participants), "--rounds",
                 str(args.rounds), "--calibration", args.calibration, "--model", args.model,
                 "--alpha", args.alpha, "--secure", "--seed", str(k), "--out", str(out),
                 "--quiet"]
            )  # fmt: skip
        result = measure(out) if code == 0 else {}
        if code == 0:
            outs.append(out)
        runs.append({"exit": code, "wall_s": round(time.monotonic() - t0, 1), **result})
    report: dict[str, Any] = {
        "args": vars(args) | {"keep": str(args.keep) if args.keep else None},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "load_average": os.getloadavg(),
        "runs": runs,
        "pooled": pooled(outs),
    }
    print(json.dumps(report, indent=2))
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
