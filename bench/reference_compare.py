"""SphereFed(+FFC) vs FedAvg-CE on digits with the reference runner.

Runs both methods at each partition (Dirichlet α = 0.1, 0.5 and IID) over a
learning-rate grid, selects the lr per method and partition on the *validation*
split (uncalibrated accuracy), and prints / writes JSON with every lr tried, plus a
Markdown table (``--markdown``) for docs/reference.md. Usage::

    python bench/reference_compare.py --seeds 0 --json out/compare.json --markdown out/compare.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/reference_compare.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from bench._report import emit_json
from spherecal.spherefed.reference import ReferenceConfig, run_reference_sweep

METHODS: dict[str, dict[str, Any]] = {
    "SphereFed (MSE, fixed orthonormal W)": {"head": "sphere", "loss": "mse"},
    "FedAvg-CE (learnable W)": {"head": "learnable", "loss": "ce"},
}
PARTITIONS: dict[str, dict[str, Any]] = {
    "α=0.1": {"partition": "dirichlet", "alpha": 0.1},
    "α=0.5": {"partition": "dirichlet", "alpha": 0.5},
    "IID": {"partition": "iid"},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.03, 0.1, 0.3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    cells: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for pname, pkw in PARTITIONS.items():
        for mname, mkw in METHODS.items():
            for seed in args.seeds:
                cfg = ReferenceConfig(rounds=args.rounds, seed=seed, **pkw, **mkw)
                print(f"[compare] {pname} {mname} seed {seed}", file=sys.stderr, flush=True)
                res = run_reference_sweep(cfg, args.lrs, select_by="none")
                cells.append(
                    {
                        "partition": pname,
                        "method": mname,
                        "seed": seed,
                        "selected_lr": res["selected"]["lr"],
                        "accuracy": res["accuracy"],
                        "lr_sweep": res["lr_sweep"],
                    }
                )
    out = {
        "lrs": args.lrs,
        "seeds": args.seeds,
        "rounds": args.rounds,
        "cells": cells,
        "seconds": time.perf_counter() - t0,
    }
    emit_json(out, args.json)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_table(cells))
    return 0


def markdown_table(cells: list[dict[str, Any]]) -> str:
    lines = [
        "| partition | method | lr (selected) | none | +CCVR | +FFC | oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for pname in PARTITIONS:
        for mname in METHODS:
            mine = [c for c in cells if c["partition"] == pname and c["method"] == mname]
            if not mine:
                continue

            def fmt(key: str, mine: list[dict[str, Any]] = mine) -> str:
                vals = np.array([c["accuracy"][key] for c in mine]) * 100
                return f"{vals.mean():.2f}" + (f" ± {vals.std():.2f}" if len(vals) > 1 else "")

            lrs = sorted({c["selected_lr"] for c in mine})
            lines.append(
                f"| {pname} | {mname} | {', '.join(map(str, lrs))} | {fmt('none')} | "
                f"{fmt('ccvr')} | {fmt('ffc')} | {fmt('oracle')} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
