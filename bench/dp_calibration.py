"""DP calibration mechanisms compared: accuracy versus ε per release (issue #25).

Trains SphereFed once per (dataset, seed) with the reference runner (10 sites,
Dirichlet α, FedAvg, mlp, the fixed orthonormal classifier, MSE), computes the sites'
exact quantised statistics (``exact_ffc_statistics`` / ``exact_ccvr_statistics``, as
the participants do for a DP release), and for each ε per release plans the release
exactly as the service does (``plan_calibration_release``: n sites, t guaranteed
contributors, Skellam, δ). Then it adds the *sum* of the sites' noise to the summed
statistics and solves each variant below on the same noisy sums, so variants differ
only in the mechanism:

FFC  ``service``      ridge 2√l·σ on the raw noisy V (the coordinator's rule today)
     ``val_ridge``    ridge chosen on validation from {¼, ½, 1, 2, 4}·2√l·σ
     ``psd``          V projected onto the PSD cone first, then the service's ridge
     ``psd_val``      V projected onto the PSD cone first, then ``val_ridge``
     ``psd_fine``     the same on a finer grid reaching down to 2√l·σ/64
     ``cutoff``       V's eigen-directions with eigenvalue ≤ τ dropped (no ridge),
                      τ chosen on validation from {½, 1, 1½, 2, 3}·2√l·σ
     ``alloc_val``    the release's sensitivity spent on V and U only (the count,
                      which FFC does not use, scaled by 0.1 before the noise and
                      back after: V and U then carry √(3/2.99)·σ/√1.5 ≈ 0.82σ)
CCVR ``service``      projected (counts ≥ 1 kept, means in the unit ball, PSD
                      scatter; ``spherefed.privacy.projection``) — the service today
     ``trace``        the same, plus each class scatter rescaled to its known
                      trace N_c − ‖S_c‖²/N_c (unit-norm features)
     ``min3σ``        classes with a noisy count below 3σ treated as empty
     ``trace_min3σ``  both

Every row also gives ``shipped``: what the validation gate ships (the calibrated
head when its validation accuracy beats the uncalibrated model's, else the
uncalibrated model), i.e. the service's never-a-loss rule.

The noise: the sum of the sites' exact Skellam noise (each site's Poisson means
sized so any t of them reach ε) has the planned total variance; at these variances
(≥ 2^38 in ring units) it is Gaussian to any precision that matters for accuracy, so
the bench draws that sum as a Gaussian of exactly the planned variance (the exact
path through the ring encoding is ``bench/calibration_dp.py``'s, much slower).
Off-diagonal triangle entries are sent √2-scaled (isometric layout), as in the
service.

    PYTHONPATH=. python bench/dp_calibration.py --seeds 0,1,2 --repeats 3 > out.json

Prints one JSON document (stdout); progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

import spherecal.spherefed.reference as runner
from bench.privacy import train_once
from spherecal.spherefed.calibrate import CCVRConfig, ccvr_calibrate, ffc_solve
from spherecal.spherefed.calibration_suite import head_accuracy
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.fl import derive_seed
from spherecal.spherefed.network import compute_features
from spherecal.spherefed.privacy.plan import plan_calibration_release
from spherecal.spherefed.privacy.projection import project_ccvr, project_ffc
from spherecal.spherefed.privacy.sensitivity import exact_ccvr_statistics, exact_ffc_statistics
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

RIDGE_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
FINE_FACTORS = (1 / 64, 1 / 16, 1 / 8, 0.25, 0.5, 1.0, 2.0)
CUT_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0)
COUNT_WEIGHT = 0.1  # alloc_val: the count's share of the sensitivity


def _linear(weight: np.ndarray) -> CalibratedHead:
    return CalibratedHead(weight=weight, bias=np.zeros(weight.shape[0]))


class Split:
    """Features and labels of one evaluation split, and a head's accuracy on it."""

    def __init__(self, z: np.ndarray, y: np.ndarray) -> None:
        self.z, self.y = z, y

    def acc(self, weight: np.ndarray) -> float:
        return head_accuracy(_linear(weight), self.z, self.y)


def _noisy(vector: np.ndarray, sigma: np.ndarray | float, rng: np.random.Generator) -> np.ndarray:
    return vector + rng.normal(size=vector.shape) * sigma


def _ffc_variants(
    exact: FFCStatistics,
    sigma: float,
    rng: np.random.Generator,
    val: Split,
    test: Split,
) -> dict[str, dict[str, float]]:
    dim, classes = exact.dim, exact.num_classes
    packed = exact.pack(isometric=True)
    noisy = FFCStatistics.unpack(_noisy(packed, sigma, rng), dim, classes, isometric=True)
    base = 2.0 * math.sqrt(dim) * sigma
    out: dict[str, dict[str, float]] = {}

    def solve(stats: FFCStatistics, ridge: float) -> np.ndarray:
        return ffc_solve(stats.V, stats.U, ridge=ridge)

    def by_validation(
        stats: FFCStatistics, scale: float, factors: tuple[float, ...] = RIDGE_FACTORS
    ) -> dict[str, float]:
        best: tuple[float, np.ndarray] | None = None
        for f in factors:
            w = solve(stats, f * scale)
            a = val.acc(w)
            if best is None or a > best[0]:
                best = (a, w)
        assert best is not None
        return {"validation": best[0], "test": test.acc(best[1])}

    w = solve(noisy, base)
    out["service"] = {"validation": val.acc(w), "test": test.acc(w)}
    out["val_ridge"] = by_validation(noisy, base)
    projected, _ = project_ffc(noisy)
    w = solve(projected, base)
    out["psd"] = {"validation": val.acc(w), "test": test.acc(w)}
    out["psd_val"] = by_validation(projected, base)
    out["psd_fine"] = by_validation(projected, base, FINE_FACTORS)
    # spectral cut-off: directions of V whose eigenvalue is not above the noise's
    # spectral norm carry noise, not signal; solve on the others (τ on validation)
    eigvals, eigvecs = np.linalg.eigh(0.5 * (noisy.V + noisy.V.T))
    best: tuple[float, np.ndarray] | None = None
    for f in CUT_FACTORS:
        keep = eigvals > f * base
        if not keep.any():
            continue
        basis = eigvecs[:, keep]
        w = (basis @ ((basis.T @ noisy.U) / eigvals[keep][:, None])).T
        a = val.acc(w)
        if best is None or a > best[0]:
            best = (a, w)
    if best is not None:
        out["cutoff"] = {"validation": best[0], "test": test.acc(best[1])}
    # the count's weight 0.1, V and U share the rest of the squared sensitivity 3
    w_vu = math.sqrt((3.0 - COUNT_WEIGHT**2) / 2.0)
    t = dim * (dim + 1) // 2
    per_entry = np.concatenate(
        [np.full(1, sigma / COUNT_WEIGHT), np.full(t + dim * classes, sigma / w_vu)]
    )
    alloc = FFCStatistics.unpack(_noisy(packed, per_entry, rng), dim, classes, isometric=True)
    out["alloc_val"] = by_validation(alloc, base / w_vu)
    return out


def _ccvr_variants(
    exact: CCVRStatistics,
    sigma: float,
    rng: np.random.Generator,
    init: np.ndarray,
    seed: int,
    val: Split,
    test: Split,
) -> dict[str, dict[str, float]]:
    dim, classes = exact.dim, exact.num_classes
    noisy = CCVRStatistics.unpack(
        _noisy(exact.pack(isometric=True), sigma, rng), dim, classes, isometric=True
    )
    cfg = replace(CCVRConfig(), seed=derive_seed(seed, "ccvr", 0))
    out: dict[str, dict[str, float]] = {}
    for name, trace, min_count in (
        ("service", False, 1.0),
        ("trace", True, 1.0),
        ("min3σ", False, max(1.0, 3.0 * sigma)),
        ("trace_min3σ", True, max(1.0, 3.0 * sigma)),
    ):
        stats, _ = project_ccvr(noisy, unit_norm=True, min_count=min_count, match_trace=trace)
        try:
            w = ccvr_calibrate(stats, init, cfg)
            out[name] = {"validation": val.acc(w), "test": test.acc(w)}
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            out[name] = {"validation": math.nan, "test": math.nan}
    return out


def _shipped(result: dict[str, float], none: dict[str, float]) -> float:
    """The validation gate's DP rule: ship only a head that beats the uncalibrated one."""
    return result["test"] if result["validation"] > none["validation"] else none["test"]


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
    ffc_exact: FFCStatistics | None = None
    ccvr_exact: CCVRStatistics | None = None
    for k in range(len(data.parts)):
        ds = data.participant(k)
        z = compute_features(model, torch.from_numpy(ds.x))
        f = exact_ffc_statistics(z, ds.y, classes, quant_bits=args.quant_bits)
        c = exact_ccvr_statistics(z, ds.y, classes, quant_bits=args.quant_bits)
        ffc_exact = f if ffc_exact is None else ffc_exact + f
        ccvr_exact = c if ccvr_exact is None else ccvr_exact + c
    assert ffc_exact is not None and ccvr_exact is not None
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
            plan = plan_calibration_release(
                kind,
                dim=dim,
                num_classes=classes,
                participants=args.participants,
                min_contributors=args.min_contributors,
                epsilon_target=eps,
                delta=args.delta,
                max_examples=args.max_examples,
                mechanism="skellam",
                quant_bits=args.quant_bits,
            )
            sigma[kind] = (
                math.sqrt(plan.noise.total_variance(args.participants)) / 2.0**plan.scale_bits
            )
        repeats = []
        for _ in range(args.repeats):
            ffc = _ffc_variants(ffc_exact, sigma["ffc"], rng, val, test)
            ccvr = _ccvr_variants(ccvr_exact, sigma["ccvr"], rng, init, seed, val, test)
            repeats.append({"ffc": ffc, "ccvr": ccvr})
        summary: dict[str, Any] = {}
        for method in ("ffc", "ccvr"):
            summary[method] = {}
            for variant in repeats[0][method]:
                tests = [r[method][variant]["test"] for r in repeats]
                shipped = [_shipped(r[method][variant], none) for r in repeats]
                summary[method][variant] = {
                    "test_mean": float(np.nanmean(tests)),
                    "test": tests,
                    "shipped_mean": float(np.mean(shipped)),
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
