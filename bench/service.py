"""Benchmark of the service: real processes, real gRPC on loopback.

Three measurements, each a ``spherecal simulate`` run (one coordinator process and N
participant processes) read back from its ``results.json``:

``digits_demo``
    The ``make demo`` federation (digits, 10 participants, Dirichlet α = 0.1, FFC and
    CCVR, secure aggregation on): wall time per stage, bytes per participant,
    coordinator peak RSS, and the accuracies next to the in-process reference
    runner's (same settings and seed) — the measured tolerance of secure aggregation.
``ffc_1280``
    FFC calibration at ``l = 1280, C = 100`` with 10 participants, once with secure
    aggregation and once without (``--no-secure``), on the same synthetic data and the
    same (untrained, ``rounds = 0``) model: statistics-stage wall time of each, their
    ratio, coordinator peak RSS and bytes per participant. The FFC vector has
    ``1 + l(l+1)/2 + l·C = 947,841`` entries.
``ccvr_512``
    CCVR statistics at ``l = 512, C = 100`` (``C + C·l + C·l(l+1)/2 = 13,184,100``
    ring entries, 105 MB per participant) through secure aggregation with 4
    participants: shows the coordinator's memory stays O(vector) — its peak RSS and
    the secure-aggregation vectors it held (accumulator + in-flight slots).

Times are wall-clock on whatever machine runs this (shared machines add noise:
compare ratios measured in the same run). Usage::

    python bench/service.py --json out/service.json [--demo-rounds 30] [--skip-demo]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as `python bench/service.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._rundir import RunDirectory, add_run_directory_option
from spherecal.simulate import SimulationSettings, run_simulation
from spherecal.spherefed.reference import ReferenceConfig

UNTRAINED_MODEL: dict[str, Any] = {"federation": {"validation_gate": False}}
"""The statistics benches calibrate an untrained model (``rounds = 0``) by design: the
validation gate's "trained model above chance" check would end every such run
``degraded`` (and the bench with it), so they switch the gate off."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _quiet(_message: str) -> None:
    pass


def _bytes_summary(results: dict[str, Any]) -> dict[str, Any]:
    per = {
        pid: stages["total"]
        for pid, stages in results["bytes"].items()
        if isinstance(stages, dict) and "total" in stages
    }
    sent = [v["received"] for v in per.values()]  # participant -> coordinator
    got = [v["sent"] for v in per.values()]  # coordinator -> participant
    return {
        "participant_upload_bytes_mean": statistics.mean(sent) if sent else 0,
        "participant_upload_bytes_max": max(sent) if sent else 0,
        "participant_download_bytes_mean": statistics.mean(got) if got else 0,
        "per_participant": per,
    }


def _run(settings: SimulationSettings, verbose: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    results: dict[str, Any] = dict[str, Any](run_simulation(settings, _say if verbose else _quiet))
    results["bench_wall_s"] = time.perf_counter() - t0
    if results["status"] != "completed" or results["errors"]:
        raise RuntimeError(f"run in {settings.out} failed: {results['errors']}")
    return results


def _resources(results: dict[str, Any]) -> dict[str, Any]:
    summary = json.loads(
        (Path(results["logs"]).parent / "coordinator" / "out" / "summary.json").read_text()
    )
    return dict(summary.get("resources", {}))


def digits_demo(root: Path, rounds: int, verbose: bool) -> dict[str, Any]:
    import torch

    from spherecal.spherefed.reference import run_reference

    reference = ReferenceConfig(participants=10, alpha=0.1, rounds=rounds)
    settings = SimulationSettings(
        reference=reference, out=root / "digits", calibration=("ffc", "ccvr"), timeout_s=3600
    )
    results = _run(settings, verbose)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ref = run_reference(reference)
    ref_s = time.perf_counter() - t0
    return {
        "settings": {"participants": 10, "alpha": 0.1, "rounds": rounds, "secure": True},
        "accuracy": results["accuracy"],
        "reference_accuracy": {k: ref["accuracy"][k] for k in ("none", "ffc", "ccvr")},
        "accuracy_minus_reference": {
            k: results["accuracy"][k] - ref["accuracy"][k] for k in ("none", "ffc", "ccvr")
        },
        "per_round_test_accuracy_max_abs_diff": max(
            abs(a["test_accuracy"] - b["test_accuracy"])
            for a, b in zip(results["per_round"], ref["per_round"], strict=True)
        ),
        "timings_s": results["timings"],
        "round_seconds": [r["seconds"] for r in results["per_round"]],
        "reference_runner_s": ref_s,
        "bytes": _bytes_summary(results),
        "coordinator": _resources(results),
        "wall_s": results["bench_wall_s"],
    }


def _synthetic_npz(path: Path, classes: int, per_class: int, dim: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim)) * 2.0
    y = np.repeat(np.arange(classes), per_class)
    x = centres[y] + rng.standard_normal((y.size, dim))
    np.savez(path, x=x.astype(np.float32), y=y.astype(np.int64))
    return path


def ffc_1280(root: Path, verbose: bool) -> dict[str, Any]:
    data = _synthetic_npz(root / "c100.npz", classes=100, per_class=40, dim=64, seed=0)
    reference = ReferenceConfig(
        dataset="npz",
        data_root=str(data),
        participants=10,
        partition="iid",
        model="mlp",
        rounds=0,
    )
    out: dict[str, Any] = {
        "settings": {
            "feature_dim": 1280,
            "classes": 100,
            "participants": 10,
            "rounds": 0,
            "vector_entries": 1 + 1280 * 1281 // 2 + 1280 * 100,
        },
    }
    for mode, secure in (("secure", True), ("plaintext", False)):
        settings = SimulationSettings(
            reference=reference,
            out=root / f"ffc1280-{mode}",
            calibration=("ffc",),
            secure_updates=secure,
            secure_statistics=secure,
            feature_dim=1280,
            timeout_s=1800,
            extra_coordinator=UNTRAINED_MODEL,
        )
        results = _run(settings, verbose)
        out[mode] = {
            "statistics_ffc_s": results["timings"]["statistics_ffc_s"],
            "secagg_stages_s": results["timings"].get("secagg_stages_s", {}),
            "ffc_solve_s": results["timings"].get("ffc_s"),
            "wall_s": results["bench_wall_s"],
            "bytes": _bytes_summary(results),
            "coordinator": _resources(results),
            "accuracy_ffc": results["accuracy"]["ffc"],
        }
    out["secure_over_plaintext_statistics_s"] = (
        out["secure"]["statistics_ffc_s"] / out["plaintext"]["statistics_ffc_s"]
    )
    out["secure_over_plaintext_upload_bytes"] = (
        out["secure"]["bytes"]["participant_upload_bytes_mean"]
        / out["plaintext"]["bytes"]["participant_upload_bytes_mean"]
    )
    return out


def ccvr_512(root: Path, participants: int, verbose: bool) -> dict[str, Any]:
    data = _synthetic_npz(root / "c100-512.npz", classes=100, per_class=12, dim=64, seed=1)
    reference = ReferenceConfig(
        dataset="npz",
        data_root=str(data),
        participants=participants,
        partition="iid",
        model="mlp",
        rounds=0,
    )
    settings = SimulationSettings(
        reference=reference,
        out=root / "ccvr512",
        calibration=("ccvr",),
        feature_dim=512,
        timeout_s=1800,
        extra_coordinator=UNTRAINED_MODEL,
    )
    results = _run(settings, verbose)
    entries = 100 * (1 + 512 + 512 * 513 // 2)
    resources = _resources(results)
    return {
        "settings": {
            "feature_dim": 512,
            "classes": 100,
            "participants": participants,
            "vector_entries": entries,
            "vector_mb": entries * 8 / 2**20,
        },
        "statistics_ccvr_s": results["timings"]["statistics_ccvr_s"],
        "secagg_stages_s": results["timings"].get("secagg_stages_s", {}),
        "ccvr_s": results["timings"].get("ccvr_s"),
        "coordinator": resources,
        "secagg_vectors_held_over_vector": resources.get("secagg_peak_vector_bytes", 0)
        / (entries * 8),
        "bytes": _bytes_summary(results),
        "wall_s": results["bench_wall_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write results here")
    parser.add_argument("--demo-rounds", type=int, default=30)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-ccvr", action="store_true")
    parser.add_argument("--ccvr-participants", type=int, default=4)
    add_run_directory_option(parser, "--workdir", kept_when="a run failed")
    parser.add_argument("--verbose", action="store_true", help="show the runs' progress")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
        },
    }
    t0 = time.perf_counter()
    run_dir = RunDirectory(args.workdir, prefix="spherecal-bench-")
    with run_dir as root:
        if not args.skip_demo:
            _say("[bench] digits demo ...")
            report["digits_demo"] = digits_demo(root, args.demo_rounds, args.verbose)
        _say("[bench] FFC l=1280 C=100, secure vs plaintext ...")
        report["ffc_1280"] = ffc_1280(root, args.verbose)
        if not args.skip_ccvr:
            _say("[bench] CCVR l=512 C=100 ...")
            report["ccvr_512"] = ccvr_512(root, args.ccvr_participants, args.verbose)
    report["workdir"] = run_dir.kept_path()
    report["machine"]["load_average_at_end"] = os.getloadavg()
    report["total_s"] = time.perf_counter() - t0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    _say(f"[bench] wrote {args.json}")
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=2)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
