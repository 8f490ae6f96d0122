"""Every calibrator under DP noise: test accuracy versus ε on MNIST-1D (or digits).

Trains SphereFed once with the reference runner (FedAvg, fixed orthonormal classifier,
MSE), then for each target ε releases the participants' statistics through the noisy
secure sum *in process*, as ``bench/privacy.py`` does (exact quantised statistics,
isometric packing, ring encoding, per-participant noise sized by
:func:`spherecal.spherefed.privacy.plan_calibration_release` so that any ``t`` contributors
reach the target, the wrapping ring sum, decoding): one FFC release (for ``ffc``) and
one CCVR release (for ``ffc_bias``, ``lda``, ``qda`` and ``ccvr``, which all derive
from the CCVR sums). Each calibrator's ε is that of *its* release.

Hyper-parameters are chosen on the validation split (never test), on grids widened
for noise: FFC/FFC+bias ridge ∪ ``{½, 1, 2}·2√l·σ`` (``σ`` the released noise's
standard deviation in feature units, as ``bench/privacy.py``), LDA/QDA shrinkage up
to 0.9. Noisy class counts are clipped at 1 before they are used as priors / divisors
(post-processing of the release, no extra privacy cost).

    PYTHONPATH=. python bench/calibration_dp.py --out docs/baselines/mnist1d-calibration

Writes ``OUT/dp_calibration.json`` and ``OUT/dp_calibration.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/calibration_dp.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

import spherecal.spherefed.reference as runner
from bench.privacy import train_once
from spherecal.crypto.dp import sample_noise
from spherecal.crypto.ring import RING_DTYPE, add_noise, decode, encode
from spherecal.spherefed.calibrate import CCVRConfig, ccvr_calibrate, ffc_solve
from spherecal.spherefed.calibration_suite import (
    DEFAULT_RIDGE_GRID,
    head_accuracy,
    select_on_validation,
)
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.fl import derive_seed
from spherecal.spherefed.network import compute_features
from spherecal.spherefed.privacy.plan import CalibrationPlan, plan_calibration_release
from spherecal.spherefed.privacy.sensitivity import exact_ccvr_statistics, exact_ffc_statistics
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

DEFAULT_EPSILONS = (1.0, 4.0, 16.0)
DP_SHRINKAGE_GRID = (0.0, 0.01, 0.03, 0.1, 0.3, 0.6, 0.9)


def noisy_release(
    stats: list[FFCStatistics] | list[CCVRStatistics], plan: CalibrationPlan
) -> np.ndarray:
    """One noisy secure sum of packed statistics (``bench/privacy.py``'s, for either kind)."""
    total = np.zeros(plan.length, dtype=RING_DTYPE)
    for s in stats:
        encoded = encode(s.pack(isometric=True), scale_bits=plan.scale_bits, bound=plan.value_bound)
        add_noise(encoded, sample_noise(plan.noise), noise_bound=plan.noise.noise_bound)
        np.add(total, encoded, out=total)
    return decode(total, scale_bits=plan.scale_bits)


def _linear(weight: np.ndarray) -> CalibratedHead:
    return CalibratedHead(weight=weight, bias=np.zeros(weight.shape[0]))


def _calibrate_all(
    ffc: FFCStatistics,
    ccvr: CCVRStatistics,
    init: np.ndarray,
    ridges: tuple[float, ...],
    shrinkages: tuple[float, ...],
    z_val: np.ndarray,
    y_val: np.ndarray,
    z_test: np.ndarray,
    y_test: np.ndarray,
    seed: int,
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    # FFC (bias-free): ridge chosen on validation like the closed forms.
    best: tuple[float, float, np.ndarray] | None = None
    for lam in ridges:
        try:
            w = ffc_solve(ffc.V, ffc.U, ridge=lam)
        except (ValueError, np.linalg.LinAlgError):
            continue
        acc = head_accuracy(_linear(w), z_val, y_val)
        if best is None or acc > best[1]:
            best = (lam, acc, w)
    out["ffc"] = (
        {"test": math.nan, "chosen": None}
        if best is None
        else {"test": head_accuracy(_linear(best[2]), z_test, y_test), "chosen": best[0]}
    )
    clipped = CCVRStatistics(np.maximum(ccvr.counts, 1.0), ccvr.sums, ccvr.second_moments)
    for name in ("ffc_bias", "lda", "qda"):
        sel = select_on_validation(
            name, clipped, ridges if name == "ffc_bias" else shrinkages, z_val, y_val
        )
        out[name] = {
            "test": math.nan if sel.head is None else head_accuracy(sel.head, z_test, y_test),
            "chosen": sel.value,
        }
    cfg = replace(CCVRConfig(), seed=derive_seed(seed, "ccvr", 0))
    try:
        w = ccvr_calibrate(clipped, init, cfg)
        out["ccvr"] = {"test": head_accuracy(_linear(w), z_test, y_test), "chosen": None}
    except (ValueError, FloatingPointError, np.linalg.LinAlgError):
        out["ccvr"] = {"test": math.nan, "chosen": None}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.perf_counter()
    config = runner.ReferenceConfig(
        dataset=args.dataset,
        model="mlp",
        participants=args.participants,
        alpha=args.alpha,
        rounds=args.rounds,
        lr=args.lr,
        seed=args.seed,
    )
    model, reference = train_once(config)
    data = runner.prepare_data(config)
    dim, classes = model.feature_dim, data.train.num_classes
    z_val = compute_features(model, torch.from_numpy(data.validation.x))
    z_test = compute_features(model, torch.from_numpy(data.test.x))
    init = model.head.weight.detach().double().numpy()
    ffc_parts, ccvr_parts = [], []
    for k in range(len(data.parts)):
        ds = data.participant(k)
        z = compute_features(model, torch.from_numpy(ds.x))
        ffc_parts.append(exact_ffc_statistics(z, ds.y, classes, quant_bits=args.quant_bits))
        ccvr_parts.append(exact_ccvr_statistics(z, ds.y, classes, quant_bits=args.quant_bits))
    sizes = [int(s.count) for s in ffc_parts]
    if max(sizes) > args.max_examples:
        raise SystemExit(f"a participant has {max(sizes)} examples > --max-examples")
    ffc_total, ccvr_total = ffc_parts[0], ccvr_parts[0]
    for f, c in zip(ffc_parts[1:], ccvr_parts[1:], strict=True):
        ffc_total, ccvr_total = ffc_total + f, ccvr_total + c
    nonprivate = _calibrate_all(
        ffc_total,
        ccvr_total,
        init,
        DEFAULT_RIDGE_GRID,
        DP_SHRINKAGE_GRID,
        z_val,
        data.validation.y,
        z_test,
        data.test.y,
        args.seed,
    )
    print(f"no DP: {nonprivate}", file=sys.stderr, flush=True)

    rows = []
    for eps in args.epsilons:
        plans = {
            kind: plan_calibration_release(
                kind,
                dim=dim,
                num_classes=classes,
                participants=args.participants,
                min_contributors=args.min_contributors,
                epsilon_target=eps,
                delta=args.delta,
                max_examples=args.max_examples,
                mechanism=args.mechanism,
                quant_bits=args.quant_bits,
            )
            for kind in ("ffc", "ccvr")
        }
        sigma = {
            kind: math.sqrt(p.noise.total_variance(args.participants)) / 2.0**p.scale_bits
            for kind, p in plans.items()
        }
        base = 2.0 * math.sqrt(dim) * max(sigma.values())
        ridges = tuple(sorted({*DEFAULT_RIDGE_GRID, 0.5 * base, base, 2.0 * base}))
        repeats: list[dict[str, dict[str, Any]]] = []
        for _ in range(args.repeats):
            ffc_noisy = FFCStatistics.unpack(
                noisy_release(ffc_parts, plans["ffc"]), dim, classes, isometric=True
            )
            ccvr_noisy = CCVRStatistics.unpack(
                noisy_release(ccvr_parts, plans["ccvr"]), dim, classes, isometric=True
            )
            repeats.append(
                _calibrate_all(
                    ffc_noisy,
                    ccvr_noisy,
                    init,
                    ridges,
                    DP_SHRINKAGE_GRID,
                    z_val,
                    data.validation.y,
                    z_test,
                    data.test.y,
                    args.seed,
                )
            )
        summary = {
            name: {
                "mean": float(np.nanmean([r[name]["test"] for r in repeats])),
                "min": float(np.nanmin([r[name]["test"] for r in repeats])),
                "max": float(np.nanmax([r[name]["test"] for r in repeats])),
                "chosen": [r[name]["chosen"] for r in repeats],
            }
            for name in repeats[0]
        }
        rows.append(
            {
                "epsilon_target": eps,
                "epsilon_realised": {
                    k: p.charge(args.participants).epsilon for k, p in plans.items()
                },
                "noise_stddev_feature_units": sigma,
                "calibrators": summary,
            }
        )
        print(
            f"ε = {eps:g}: " + ", ".join(f"{k} {v['mean']:.4f}" for k, v in summary.items()),
            file=sys.stderr,
            flush=True,
        )
    return {
        "description": "test accuracy of every calibrator on noisy (DP) secure sums",
        "command": "python bench/calibration_dp.py " + " ".join(args.argv),
        "settings": {
            "reference_config": config.to_json(),
            "mechanism": args.mechanism,
            "delta": args.delta,
            "participants": args.participants,
            "min_contributors": args.min_contributors,
            "quant_bits": args.quant_bits,
            "max_examples": args.max_examples,
            "participant_sizes": sizes,
            "repeats": args.repeats,
            "neighbouring": "add/remove one example at one participant",
        },
        "uncalibrated_accuracy": reference["accuracy"]["none"],
        "reference_runner_accuracy": reference["accuracy"],
        "nonprivate": nonprivate,
        "results": rows,
        "seconds": time.perf_counter() - started,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    eps = [r["epsilon_target"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for i, name in enumerate(("ffc", "ffc_bias", "ccvr", "lda", "qda")):
        mean = [100 * r["calibrators"][name]["mean"] for r in rows]
        lo = [100 * (r["calibrators"][name]["mean"] - r["calibrators"][name]["min"]) for r in rows]
        hi = [100 * (r["calibrators"][name]["max"] - r["calibrators"][name]["mean"]) for r in rows]
        line = ax.errorbar(eps, mean, yerr=[lo, hi], marker="o", capsize=3, label=name)
        ax.axhline(
            100 * result["nonprivate"][name]["test"],
            color=line[0].get_color(),
            ls="--",
            lw=0.8,
            alpha=0.7 if i >= 0 else 1,
        )
    ax.axhline(100 * result["uncalibrated_accuracy"], color="black", ls=":", label="none")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ε per release (dashed: the same calibrator without DP)")
    ax.set_ylabel("test accuracy (%)")
    cfg = result["settings"]["reference_config"]
    ax.set_title(
        f"{cfg['dataset']}, α = {cfg['alpha']}, {cfg['rounds']} rounds, seed {cfg['seed']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--epsilons", type=lambda s: [float(x) for x in s.split(",")], default=DEFAULT_EPSILONS
    )
    p.add_argument("--dataset", default="mnist1d")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--participants", type=int, default=10)
    p.add_argument("--min-contributors", type=int, default=6)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--mechanism", default="skellam", choices=("skellam", "dgauss"))
    p.add_argument("--quant-bits", type=int, default=10)
    p.add_argument(
        "--max-examples", type=int, default=4000, help="public bound on examples per participant"
    )
    args = p.parse_args(argv)
    args.argv = argv
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dp_calibration.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "dp_calibration.png")
    print(json.dumps({k: v for k, v in result.items() if k != "results"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
