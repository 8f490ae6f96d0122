"""Cell by cell: does ``--engine service`` give what ``--engine inprocess`` gives?

Reads the finished cells of two ``spherecal experiment`` output directories (or
their ``cells/`` directories), pairs the cells that trained the same run (method,
column, seed, learning rate, temperature) and prints JSON: how many pairs, how many
diverged in both / in one only, and the largest absolute difference of test and
validation accuracy per calibration, with the worst pairs. Usage::

    python bench/compare_engines.py docs/baselines/methods-service /tmp/inprocess-quick

Nothing is trained here; run the two tables first (the same settings, one with
``--engine service``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

CALIBRATIONS = ("none", "ffc", "ccvr")

RunKey = tuple[str, str, int, float, float]


def _cells(folder: Path) -> dict[RunKey, dict[str, Any]]:
    cells = folder / "cells" if (folder / "cells").is_dir() else folder
    out: dict[RunKey, dict[str, Any]] = {}
    for path in sorted(cells.glob("*.json")):
        record = json.loads(path.read_text())
        run = record.get("run", {})
        if run.get("oracle"):
            continue
        key = (
            str(run["method"]),
            str(run["column"]),
            int(run["seed"]),
            float(run["lr"]),
            float(run["temperature"]),
        )
        out[key] = record
    return out


def _diff(a: dict[str, Any] | None, b: dict[str, Any] | None, name: str) -> float:
    x = (a or {}).get(name)
    y = (b or {}).get(name)
    if x is None or y is None:
        return math.nan
    return abs(float(x) - float(y))


def compare(service_dir: Path, inprocess_dir: Path, *, worst: int = 5) -> dict[str, Any]:
    service, inprocess = _cells(service_dir), _cells(inprocess_dir)
    pairs = sorted(set(service) & set(inprocess))
    both_diverged, service_only, inprocess_only = [], [], []
    diffs: dict[str, dict[str, list[tuple[float, RunKey]]]] = {
        split: {c: [] for c in CALIBRATIONS} for split in ("test", "validation")
    }
    for key in pairs:
        s, i = service[key], inprocess[key]
        if s.get("diverged") or i.get("diverged"):
            if s.get("diverged") and i.get("diverged"):
                both_diverged.append(key)
            elif s.get("diverged"):
                service_only.append(key)
            else:
                inprocess_only.append(key)
            continue
        for split, field in (("test", "accuracy"), ("validation", "validation_accuracy")):
            for c in CALIBRATIONS:
                d = _diff(s.get(field), i.get(field), c)
                if not math.isnan(d):
                    diffs[split][c].append((d, key))

    def label(key: RunKey) -> str:
        method, column, seed, lr, tau = key
        t = f" τ={tau:g}" if tau != 1.0 else ""
        return f"{method} {column} seed {seed} lr={lr:g}{t}"

    summary: dict[str, Any] = {}
    for split, per_cal in diffs.items():
        summary[split] = {}
        for c, values in per_cal.items():
            values.sort(reverse=True)
            summary[split][c] = {
                "pairs": len(values),
                "max_abs_diff": values[0][0] if values else None,
                "equal_to_1e-6": sum(1 for d, _ in values if d <= 1e-6),
                "worst": [{"run": label(k), "abs_diff": d} for d, k in values[:worst] if d > 0],
            }
    return {
        "service_cells": len(service),
        "inprocess_cells": len(inprocess),
        "paired": len(pairs),
        "diverged_in_both": len(both_diverged),
        "diverged_in_service_only": [label(k) for k in service_only],
        "diverged_in_inprocess_only": [label(k) for k in inprocess_only],
        "accuracy": summary,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("service", type=Path, help="the --engine service output (or cells) dir")
    parser.add_argument("inprocess", type=Path, help="the --engine inprocess output (or cells)")
    parser.add_argument("--worst", type=int, default=5, help="worst pairs listed per metric")
    args = parser.parse_args(argv)
    json.dump(compare(args.service, args.inprocess, worst=args.worst), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
