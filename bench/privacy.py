"""Utility of differentially private FFC calibration: test accuracy versus ε on digits.

Trains SphereFed once with the deterministic reference runner
(:func:`spherecal.spherefed.reference.run_federation`, FedAvg, the fixed orthonormal classifier),
then, for each target ε, releases the participants' FFC statistics through the noisy
secure sum *in process* — exactly the participants' code path, minus the masks that
cancel: exact quantised statistics (:func:`spherecal.spherefed.privacy.exact_ffc_statistics`),
isometric packing, :func:`spherecal.crypto.ring.encode`, per-participant noise from
:func:`spherecal.crypto.dp.sample_noise` sized by
:func:`spherecal.spherefed.privacy.plan_calibration_release`
so that any ``t`` contributors reach the target, :func:`spherecal.crypto.ring.add_noise`, the
wrapping ring sum, :func:`spherecal.crypto.ring.decode` — and solves FFC on the noisy sums.

Reference lines: the uncalibrated model and non-private FFC on the same quantised
statistics. The noisy ``V`` can be indefinite; FFC is solved with a ridge
``λ = 2√l · σ`` (``σ`` the released noise's standard deviation in feature units:
about the spectral norm of a symmetric noise matrix), a data-independent
post-processing of the release. Each ε is repeated ``--repeats`` times with fresh
noise; the plot shows mean and min–max.

Regenerate the committed results (about half a minute on one core)::

    .venv/bin/python bench/privacy.py --out docs/privacy

Writes ``OUT/privacy_accuracy.json`` and ``OUT/privacy_accuracy.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import spherecal.spherefed.reference as runner
from spherecal.crypto.dp import sample_noise
from spherecal.crypto.ring import RING_DTYPE, add_noise, decode, encode
from spherecal.spherefed.calibrate import ffc_solve
from spherecal.spherefed.fl import evaluate
from spherecal.spherefed.network import Net, classifier_swapped, compute_features
from spherecal.spherefed.privacy.plan import CalibrationPlan, plan_calibration_release
from spherecal.spherefed.privacy.sensitivity import exact_ffc_statistics
from spherecal.spherefed.stats import FFCStatistics

DEFAULT_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def train_once(config: runner.ReferenceConfig) -> tuple[Net, dict[str, Any]]:
    """Run the reference federation and keep the trained model.

    ``run_federation`` builds its model through the module-level ``build_model``;
    wrapping that one name for the duration of the call captures the instance, which
    holds the final global weights (and the original fixed classifier) on return.
    """
    captured: list[Net] = []
    original = runner.build_model

    def capture(spec: Any) -> Net:
        model = original(spec)
        captured.append(model)
        return model

    runner.build_model = capture
    try:
        result = runner.run_federation(config, oracle=False)
    finally:
        runner.build_model = original
    return captured[0], result


def participant_statistics(
    model: Net, data: runner.FederationData, quant_bits: int
) -> list[FFCStatistics]:
    """Each participant's exact FFC statistics of its features (the participant's
    feature function, :func:`spherecal.spherefed.network.compute_features`)."""
    out = []
    c = data.train.num_classes
    for k in range(len(data.parts)):
        ds = data.participant(k)
        z = compute_features(model, torch.from_numpy(ds.x))
        out.append(exact_ffc_statistics(z, ds.y, c, quant_bits=quant_bits))
    return out


def accuracy_with(model: Net, weight: np.ndarray, x: torch.Tensor, y: torch.Tensor) -> float:
    with classifier_swapped(model, weight):
        return evaluate(model, x, y)


def noisy_release(stats: list[FFCStatistics], plan: CalibrationPlan) -> np.ndarray:
    """One noisy secure sum of the participants' packed statistics (real units)."""
    total = np.zeros(plan.length, dtype=RING_DTYPE)
    for s in stats:
        encoded = encode(s.pack(isometric=True), scale_bits=plan.scale_bits, bound=plan.value_bound)
        add_noise(encoded, sample_noise(plan.noise), noise_bound=plan.noise.noise_bound)
        np.add(total, encoded, out=total)
    return decode(total, scale_bits=plan.scale_bits)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.perf_counter()
    config = runner.ReferenceConfig(
        dataset="digits", participants=args.participants, alpha=args.alpha, rounds=args.rounds
    )
    model, reference = train_once(config)
    data = runner.prepare_data(config)
    x_test, y_test = torch.from_numpy(data.test.x), torch.from_numpy(data.test.y)
    dim, classes = model.feature_dim, data.train.num_classes
    stats = participant_statistics(model, data, args.quant_bits)
    sizes = [int(s.count) for s in stats]
    max_examples = args.max_examples  # public, fixed in advance: never read off the data
    if max(sizes) > max_examples:
        raise SystemExit(f"a participant has {max(sizes)} examples > --max-examples {max_examples}")
    total = stats[0]
    for s in stats[1:]:
        total = total + s
    nonprivate = accuracy_with(model, ffc_solve(total.V, total.U), x_test, y_test)
    uncalibrated = evaluate(model, x_test, y_test)

    rows = []
    for eps in args.epsilons:
        plan = plan_calibration_release(
            "ffc",
            dim=dim,
            num_classes=classes,
            participants=args.participants,
            min_contributors=args.min_contributors,
            epsilon_target=eps,
            delta=args.delta,
            max_examples=max_examples,
            mechanism=args.mechanism,
            quant_bits=args.quant_bits,
        )
        charge = plan.charge(args.participants)  # every participant contributed
        sigma = math.sqrt(plan.noise.total_variance(args.participants)) / 2.0**plan.scale_bits
        ridge = 2.0 * math.sqrt(dim) * sigma
        accs = []
        for _ in range(args.repeats):
            released = FFCStatistics.unpack(
                noisy_release(stats, plan), dim, classes, isometric=True
            )
            try:
                w = ffc_solve(released.V, released.U, ridge=ridge)
                accs.append(accuracy_with(model, w, x_test, y_test))
            except (ValueError, np.linalg.LinAlgError):
                accs.append(float("nan"))
        rows.append(
            {
                "epsilon_target": eps,
                "epsilon_planned": plan.planned_epsilon,
                "epsilon_realised": charge.epsilon,
                "noise_stddev_feature_units": sigma,
                "ridge": ridge,
                "accuracy_mean": float(np.nanmean(accs)),
                "accuracy_min": float(np.nanmin(accs)),
                "accuracy_max": float(np.nanmax(accs)),
                "accuracies": accs,
                "noise_parameter": plan.noise.parameter,
                "noise_bound": plan.noise.noise_bound,
                "scale_bits": plan.scale_bits,
            }
        )
        print(
            f"ε = {eps:g}: realised ε = {charge.epsilon:.3f}, σ = {sigma:.3g}, accuracy "
            f"{np.nanmean(accs):.4f} (min {np.nanmin(accs):.4f}, max {np.nanmax(accs):.4f})",
            file=sys.stderr,
        )
    return {
        "description": "test accuracy of FFC-calibrated SphereFed on digits versus ε",
        "command": "python bench/privacy.py " + " ".join(args.argv),
        "settings": {
            "reference_config": config.to_json(),
            "mechanism": args.mechanism,
            "delta": args.delta,
            "participants": args.participants,
            "min_contributors": args.min_contributors,
            "quant_bits": args.quant_bits,
            "max_examples": max_examples,
            "participant_sizes": sizes,
            "repeats": args.repeats,
            "neighbouring": "add/remove one example at one participant",
        },
        "reference_runner_accuracy": reference["accuracy"],
        "uncalibrated_accuracy": uncalibrated,
        "nonprivate_ffc_accuracy": nonprivate,
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
    eps = [r["epsilon_realised"] for r in rows]
    mean = [r["accuracy_mean"] for r in rows]
    lo = [r["accuracy_mean"] - r["accuracy_min"] for r in rows]
    hi = [r["accuracy_max"] - r["accuracy_mean"] for r in rows]
    s = result["settings"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    ax.errorbar(eps, mean, yerr=[lo, hi], marker="o", capsize=3, label="DP FFC (mean, min–max)")
    ax.axhline(result["nonprivate_ffc_accuracy"], color="tab:green", ls="--", label="FFC, no DP")
    ax.axhline(result["uncalibrated_accuracy"], color="tab:red", ls=":", label="uncalibrated")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(
        f"ε spent per FFC release (δ = {s['delta']:g}, {s['mechanism']} noise; all "
        f"{s['participants']} contribute, sized for {s['min_contributors']})",
        fontsize=9,
    )
    ax.set_ylabel("test accuracy")
    ax.set_title(
        f"SphereFed on digits, {s['participants']} participants, "
        f"α = {s['reference_config']['alpha']}, {s['reference_config']['rounds']} rounds",
        fontsize=10,
    )
    ax.set_ylim(0.5, 1.0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
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
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--participants", type=int, default=10)
    p.add_argument("--min-contributors", type=int, default=6)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--mechanism", default="skellam", choices=("skellam", "dgauss"))
    p.add_argument("--quant-bits", type=int, default=10)
    p.add_argument(
        "--max-examples", type=int, default=300, help="public bound on examples per participant"
    )
    args = p.parse_args(argv)
    args.argv = argv
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "privacy_accuracy.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "privacy_accuracy.png")
    print(json.dumps({k: v for k, v in result.items() if k != "results"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
