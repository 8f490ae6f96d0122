"""What the sites' noised training weights cost in accuracy: the same federation with
``example_count_noise_sd`` 0 (exact counts) and 4 (the default), interleaved.

Each run is one ``spherecal simulate`` federation (virtual participants as threads of
one process, real gRPC on loopback, secure aggregation of updates and statistics),
with the coordinator's central evaluation of the uncalibrated model and the FFC and
CCVR heads on the reference's test split. The two settings differ only in the noise
on each site's weight (``spherecal.participant.example_weight``), drawn afresh per
federation, so a setting's spread over ``--runs`` is that noise's effect on the model
(training itself is deterministic given the seed). Runs alternate their order.

Reported (JSON): per run the central accuracies and the round losses; per setting the
mean and range of each accuracy; the mean difference (noised − exact). Usage::

    python bench/example_weight.py --dataset mnist1d --runs 3 --json OUT
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/example_weight.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import emit_json
from bench._rundir import RunDirectory, add_run_directory_option
from spherecal.simulate import SimulationSettings, run_simulation
from spherecal.spherefed.reference import ReferenceConfig

HEADS = ("none", "ffc", "ccvr")
SETTINGS = (0, 4)


def one_run(root: Path, sd: int, reference: ReferenceConfig, index: int) -> dict[str, Any]:
    from spherecal.engines.threads import ThreadSimulation

    settings = SimulationSettings(
        reference=reference,
        out=root / f"sd{sd}-{index}",
        calibration=("ffc", "ccvr"),
        timeout_s=3600,
        example_count_noise_sd=sd,
    )
    t0 = time.monotonic()
    results = run_simulation(settings, factory=ThreadSimulation)
    if results.get("status") != "completed":
        raise SystemExit(f"run sd={sd} #{index}: {results.get('status')}: {results.get('errors')}")
    central = results["central_accuracy"]
    if central is None:
        raise SystemExit(f"run sd={sd} #{index}: no central evaluation (no test split)")
    return {
        "sd": sd,
        "index": index,
        "wall_s": round(time.monotonic() - t0, 2),
        "accuracy": {h: central[h] for h in HEADS},
        "train_loss": [r["train_loss"] for r in results["per_round"]],
        "weights": [r["weight"] for r in results["per_round"]],
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sd in SETTINGS:
        mine = [r for r in runs if r["sd"] == sd]
        out[f"sd{sd}"] = {
            h: {
                "mean": statistics.fmean(r["accuracy"][h] for r in mine),
                "min": min(r["accuracy"][h] for r in mine),
                "max": max(r["accuracy"][h] for r in mine),
            }
            for h in HEADS
        }
    out["noised_minus_exact"] = {
        h: out[f"sd{SETTINGS[1]}"][h]["mean"] - out[f"sd{SETTINGS[0]}"][h]["mean"] for h in HEADS
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist1d", choices=("digits", "mnist1d"))
    parser.add_argument("--runs", type=int, default=3, help="runs per setting (default 3)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--participants", type=int, default=10)
    parser.add_argument("--alpha", type=float, default=0.1, help="Dirichlet α of the split")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    add_run_directory_option(parser, "--workdir", kept_when="a run fails")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    reference = ReferenceConfig(
        dataset=args.dataset,
        participants=args.participants,
        model="mlp",
        rounds=args.rounds,
        alpha=args.alpha,
    )
    runs: list[dict[str, Any]] = []
    with RunDirectory(args.workdir, prefix="spherecal-example-weight-") as root:
        for k in range(args.runs):
            order = SETTINGS if k % 2 == 0 else SETTINGS[::-1]
            for sd in order:
                print(f"[bench] run {k + 1}/{args.runs}, sd {sd}", file=sys.stderr, flush=True)
                runs.append(one_run(root, sd, reference, k))
    document = {
        "bench": "example_weight",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count()},
        "config": {
            "dataset": args.dataset,
            "participants": args.participants,
            "rounds": args.rounds,
            "alpha": args.alpha,
            "runs_per_setting": args.runs,
        },
        "runs": runs,
        "summary": summarise(runs),
    }
    emit_json(document, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
