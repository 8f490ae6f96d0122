"""DP calibration mechanisms compared: accuracy versus ε per release (issue #25).

Trains SphereFed once per (dataset, seed) with the reference runner (10 sites,
Dirichlet α, FedAvg, mlp, the fixed orthonormal classifier, MSE) and compares every
DP calibration variant of :mod:`spherecal.spherefed.privacy.calibration_compare`
(its docstring lists them, the noise and the ``shipped`` rule) at each ε per release.
The same comparison, at 3 seeds and with the DP-SGD rows, is ``spherecal experiment
--table privacy`` (docs/baselines/privacy/).

    PYTHONPATH=. python bench/dp_calibration.py --seeds 0,1,2 --repeats 3 > out.json

Prints one JSON document (stdout); progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/dp_calibration.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

import spherecal.spherefed.reference as runner
from bench.privacy import train_once
from spherecal.spherefed.calibrate import CCVRConfig, ccvr_calibrate, ffc_solve
from spherecal.spherefed.fl import derive_seed
from spherecal.spherefed.network import compute_features
from spherecal.spherefed.privacy.calibration_compare import (
    Split,
    ccvr_variants,
    exact_sums,
    ffc_variants,
    release_sigma,
    shipped,
)


def run_one(dataset: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    kw: dict[str, Any] = {
        "dataset": dataset,
        "participants": args.participants,
        "alpha": args.alpha,
        "model": "mlp",
        "rounds": args.rounds[dataset],
        "seed": seed,
    }
    if dataset == "mnist1d":
        kw["lr"] = 1.0
    config = runner.ReferenceConfig(**kw)
    model, reference = train_once(config)
    data = runner.prepare_data(config)
    dim, classes = model.feature_dim, data.train.num_classes
    val = Split(compute_features(model, torch.from_numpy(data.validation.x)), data.validation.y)
    test = Split(compute_features(model, torch.from_numpy(data.test.x)), data.test.y)
    init = model.head.weight.detach().double().numpy()
    none = {"validation": val.acc(init), "test": test.acc(init)}
    ffc_exact, ccvr_exact = exact_sums(model, data, args.quant_bits)
    w_np = ffc_solve(ffc_exact.V, ffc_exact.U, ridge=0.0)
    cfg = replace(CCVRConfig(), seed=derive_seed(seed, "ccvr", 0))
    nonprivate = {
        "ffc": {"validation": val.acc(w_np), "test": test.acc(w_np)},
        "ccvr": {
            "validation": val.acc(ccvr_calibrate(ccvr_exact, init, cfg)),
            "test": test.acc(ccvr_calibrate(ccvr_exact, init, cfg)),
        },
    }
    rng = np.random.default_rng([seed, 25])
    rows = []
    for eps in args.epsilons:
        sigma = {}
        for kind in ("ffc", "ccvr"):
            sigma[kind] = release_sigma(
                kind,
                dim=dim,
                classes=classes,
                participants=args.participants,
                min_contributors=args.min_contributors,
                epsilon=eps,
                delta=args.delta,
                max_examples=args.max_examples,
                quant_bits=args.quant_bits,
            )
        repeats = []
        for _ in range(args.repeats):
            ffc = ffc_variants(ffc_exact, sigma["ffc"], rng, val, test)
            ccvr = ccvr_variants(ccvr_exact, sigma["ccvr"], rng, init, seed, val, test)
            repeats.append({"ffc": ffc, "ccvr": ccvr})
        summary: dict[str, Any] = {}
        for method in ("ffc", "ccvr"):
            summary[method] = {}
            for variant in repeats[0][method]:
                tests = [r[method][variant]["test"] for r in repeats]
                ships = [shipped(r[method][variant], none) for r in repeats]
                summary[method][variant] = {
                    "test_mean": float(np.nanmean(tests)),
                    "test": tests,
                    "shipped_mean": float(np.mean(ships)),
                    "withheld": sum(
                        1
                        for r in repeats
                        if not r[method][variant]["validation"] > none["validation"]
                    ),
                }
        rows.append({"epsilon": eps, "noise_sigma": sigma, "methods": summary})
        print(
            f"{dataset} seed {seed} ε={eps:g}: "
            + "; ".join(
                f"{m}/{v} {s['test_mean']:.4f}" for m, vs in summary.items() for v, s in vs.items()
            ),
            file=sys.stderr,
            flush=True,
        )
    return {
        "dataset": dataset,
        "seed": seed,
        "rounds": config.rounds,
        "uncalibrated": none,
        "nonprivate": nonprivate,
        "reference_accuracy": reference["accuracy"],
        "participant_sizes": [len(p) for p in data.parts],
        "rows": rows,
        "seconds": time.perf_counter() - t0,
    }


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds, per dataset, ε, method, variant (test and shipped accuracy),
    beside the uncalibrated and non-private means."""
    out: dict[str, Any] = {}
    for dataset in sorted({r["dataset"] for r in runs}):
        mine = [r for r in runs if r["dataset"] == dataset]
        entry: dict[str, Any] = {
            "seeds": [r["seed"] for r in mine],
            "uncalibrated": float(np.mean([r["uncalibrated"]["test"] for r in mine])),
            "nonprivate": {
                m: float(np.mean([r["nonprivate"][m]["test"] for r in mine]))
                for m in ("ffc", "ccvr")
            },
            "by_epsilon": {},
        }
        for i, row in enumerate(mine[0]["rows"]):
            cell: dict[str, Any] = {}
            for method, variants in row["methods"].items():
                cell[method] = {
                    v: {
                        "test": float(
                            np.nanmean(
                                [r["rows"][i]["methods"][method][v]["test_mean"] for r in mine]
                            )
                        ),
                        "shipped": float(
                            np.mean(
                                [r["rows"][i]["methods"][method][v]["shipped_mean"] for r in mine]
                            )
                        ),
                    }
                    for v in variants
                }
            entry["by_epsilon"][f"{row['epsilon']:g}"] = cell
        out[dataset] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--datasets", default="digits,mnist1d")
    p.add_argument("--seeds", default="0")
    p.add_argument("--epsilons", default="1,4,16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--participants", type=int, default=10)
    p.add_argument("--min-contributors", type=int, default=6)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--digits-rounds", type=int, default=10)
    p.add_argument("--mnist1d-rounds", type=int, default=30)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--quant-bits", type=int, default=10)
    p.add_argument("--max-examples", type=int, default=4000)
    args = p.parse_args(argv)
    args.epsilons = [float(x) for x in args.epsilons.split(",")]
    args.rounds = {"digits": args.digits_rounds, "mnist1d": args.mnist1d_rounds}
    torch.set_num_threads(1)
    started = time.perf_counter()
    runs = [
        run_one(dataset, int(seed), args)
        for dataset in args.datasets.split(",")
        for seed in args.seeds.split(",")
    ]
    doc = {
        "description": "DP calibration mechanisms: test accuracy vs ε per release",
        "command": "python bench/dp_calibration.py " + " ".join(argv),
        "settings": {k: v for k, v in vars(args).items()},
        "noise": "sum of the sites' Skellam noise drawn as a Gaussian of the planned variance",
        "summary": aggregate(runs),
        "runs": runs,
        "seconds": time.perf_counter() - started,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "load_average_at_end": list(os.getloadavg()),
        },
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
