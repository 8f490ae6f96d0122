"""The privacy table's outputs: ``results.json``, ``table.md`` and two plots
(``dpsgd_accuracy.png``, ``dp_calibration.png``), from the cells of
:mod:`.privacy`; and :func:`run_privacy_table`, start to finish.

Every figure is a mean ± sample standard deviation over seeds of test accuracy; a
calibration cell's figure is itself the mean over its noise draws.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from spherecal.experiment.privacy import (
    DPSGD_METHODS,
    PrivacyCell,
    PrivacySettings,
    privacy_cells,
    run_privacy_cells,
)

__all__ = ["build_privacy_report", "render_privacy_markdown", "run_privacy_table"]

SCHEMA = "spherecal.experiment.privacy/1"
DPSGD_LABELS = {
    "nonprivate": "non-private (the same steps, no noise)",
    "local": "local DP-SGD (each site its own ε, FedAvg)",
    "distributed": "distributed DP-SGD (the service; noise in the ring)",
    "central": "central DP-SGD on the pooled data (Opacus)",
}
FFC_VARIANTS = ("service", "val_ridge", "psd", "psd_val", "psd_fine", "cutoff", "alloc_val")
CCVR_VARIANTS = ("service", "trace", "min3σ", "trace_min3σ")


def _stats(values: list[float]) -> dict[str, Any]:
    arr = np.asarray(values, dtype=float)
    finite = arr[np.isfinite(arr)]
    mean = float(finite.mean()) if finite.size else math.nan
    sd = float(finite.std(ddof=1)) if finite.size > 1 else 0.0
    return {"mean": mean, "sd": sd, "values": [float(v) for v in arr]}


def build_privacy_report(
    settings: PrivacySettings,
    records: dict[str, dict[str, Any]],
    *,
    command: str | None = None,
    timings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``results.json`` document: per-seed and aggregated figures of every row,
    and the issue's comparisons (distributed − central, distributed − local, the best
    DP calibrator against its non-private accuracy, the gate's worst margin)."""

    def rec(cell: PrivacyCell) -> dict[str, Any]:
        return records[cell.key(settings)]

    seeds = list(range(settings.seeds))
    dpsgd: dict[str, dict[str, Any]] = {}
    nonprivate = _stats([rec(PrivacyCell("nonprivate", s))["accuracy"] for s in seeds])
    dpsgd["nonprivate"] = {"none": nonprivate}
    for method in DPSGD_METHODS[1:]:
        dpsgd[method] = {}
        for eps in settings.epsilons:
            rs = [rec(PrivacyCell(method, s, eps)) for s in seeds]
            entry = _stats([r["accuracy"] for r in rs])
            if method != "local":
                entry["sigma"] = rs[0]["sigma"]
                entry["epsilon_charged"] = rs[0]["epsilon_charged"]
            if method == "central":
                entry["opacus_epsilon"] = [r["opacus_epsilon"] for r in rs]
            if method == "local":
                entry["local_sigmas"] = [r["local_sigmas"] for r in rs]
            dpsgd[method][f"{eps:g}"] = entry
    cal = [rec(PrivacyCell("calibration", s)) for s in seeds]
    calibration: dict[str, Any] = {
        "uncalibrated": _stats([c["uncalibrated"]["test"] for c in cal]),
        "uncalibrated_validation": [c["uncalibrated"]["validation"] for c in cal],
        "nonprivate": {
            m: _stats([c["nonprivate"][m]["test"] for c in cal]) for m in ("ffc", "ccvr")
        },
        "by_epsilon": {},
    }
    gate_margin = math.inf
    for eps in settings.release_epsilons:
        key = f"{eps:g}"
        row: dict[str, Any] = {"sigma": cal[0]["by_epsilon"][key]["sigma"]}
        for method, variants in (("ffc", FFC_VARIANTS), ("ccvr", CCVR_VARIANTS)):
            row[method] = {}
            for v in variants:
                cells = [c["by_epsilon"][key][method].get(v) for c in cal]
                if any(x is None for x in cells):
                    continue
                row[method][v] = {
                    "test": _stats([x["test"] for x in cells]),
                    "shipped": _stats([x["shipped"] for x in cells]),
                    "withheld": sum(x["withheld"] for x in cells),
                    "failed": sum(x["failed"] for x in cells),
                }
                for x, c in zip(cells, cal, strict=True):
                    margin = x["shipped_validation_min"] - c["uncalibrated"]["validation"]
                    gate_margin = min(gate_margin, margin)
        calibration["by_epsilon"][key] = row
    comparisons: dict[str, Any] = {}
    for eps in settings.epsilons:
        k = f"{eps:g}"
        d, c, lo = (dpsgd[m][k]["mean"] for m in ("distributed", "central", "local"))
        comparisons[f"epsilon_{k}"] = {
            "distributed_minus_central": d - c,
            "distributed_minus_local": d - lo,
        }
    best: dict[str, Any] = {}
    for key, release in calibration["by_epsilon"].items():
        cands = [
            (release[m][v]["shipped"]["mean"], m, v) for m in ("ffc", "ccvr") for v in release[m]
        ]
        acc, m, v = max(cands)
        best[key] = {
            "calibrator": m,
            "variant": v,
            "shipped": acc,
            "nonprivate": calibration["nonprivate"][m]["mean"],
            "distance": calibration["nonprivate"][m]["mean"] - acc,
            # what the service ships today, beside the best variant (chosen on test
            # means: a report, not a selection)
            "service": {
                c: {
                    "shipped": release[c]["service"]["shipped"]["mean"],
                    "distance": calibration["nonprivate"][c]["mean"]
                    - release[c]["service"]["shipped"]["mean"],
                }
                for c in ("ffc", "ccvr")
                if "service" in release[c]
            },
        }
    comparisons["best_dp_calibrator"] = best
    # the project's accountant against Opacus's own, for every central run
    comparisons["accounting_max_difference"] = max(
        abs(e - dpsgd["central"][f"{eps:g}"]["epsilon_charged"])
        for eps in settings.epsilons
        for e in dpsgd["central"][f"{eps:g}"]["opacus_epsilon"]
    )
    comparisons["gate_worst_validation_margin"] = gate_margin
    return {
        "schema": SCHEMA,
        "command": command,
        "settings": settings.to_json(),
        "dpsgd": dpsgd,
        "calibration": calibration,
        "comparisons": comparisons,
        "timings": timings or {},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_at_end": list(os.getloadavg()),
        },
    }


def _pm(stats: dict[str, Any]) -> str:
    if not math.isfinite(stats["mean"]):
        return "failed"
    return f"{100 * stats['mean']:.1f} ± {100 * stats['sd']:.1f}"


def _reduced(s: dict[str, Any]) -> list[str]:
    """The header line that says the DP-SGD rows ran shorter than the defaults."""
    d = PrivacySettings()
    if s["steps"] >= d.steps and s["local_rounds"] >= d.local_rounds:
        return []
    return [
        f"**Reduced uniformly:** T = {s['steps']} steps (default {d.steps}) and "
        f"{s['local_rounds']} local-DP-SGD rounds (default {d.local_rounds}) — every "
        "DP-SGD row shortened alike so that the grid fits the machine it ran on.",
        "",
    ]


def render_privacy_markdown(report: dict[str, Any]) -> str:
    """``table.md``: the DP-SGD table, the calibration tables, the comparisons."""
    s = report["settings"]
    eps = [f"{e:g}" for e in s["epsilons"]]
    rel = [f"{e:g}" for e in s["release_epsilons"]]
    n, q = s["participants"], 1.0 / s["rate_batches"]
    lines = [
        f"# spherecal experiment — privacy ({s['dataset']})",
        "",
        f"Command: `{report['command']}`" if report.get("command") else "",
        "",
        f"Test accuracy (%), mean ± sample std over {s['seeds']} seed(s). {n} sites, "
        f"Dirichlet α = {s['alpha']:g}, model `mlp`, the fixed orthonormal SphereFed "
        f"classifier, MSE. δ = {s['delta']:g}.",
        "",
        "## DP-SGD at record-level ε for the whole training",
        "",
        *_reduced(s),
        f"T = {s['steps']} steps at Poisson rate q = {q:g}, clipping C = {s['clip']:g}, "
        f"plain SGD at η = {s['lr']:g} on the noisy sum over the expected batch q·N. σ is the "
        "smallest the distributed plan accepts for ε at T steps; central DP-SGD uses the "
        "same σ, q, C, T, η. Local DP-SGD: each site Opacus with batch "
        f"{s['local_batch']}, η = {s['local_lr']:g}, one epoch per round, "
        f"{s['local_rounds']} FedAvg rounds, its σ the smallest that keeps its own ε "
        "(hyperparameters not tuned).",
        "",
        "| Training | " + " | ".join(f"ε = {e}" for e in eps) + " | no DP |",
        "|---|" + "---|" * (len(eps) + 1),
    ]
    dp = report["dpsgd"]
    lines.append(
        f"| {DPSGD_LABELS['nonprivate']} | "
        + " | ".join("—" for _ in eps)
        + f" | {_pm(dp['nonprivate']['none'])} |"
    )
    for m in ("local", "distributed", "central"):
        lines.append(f"| {DPSGD_LABELS[m]} | " + " | ".join(_pm(dp[m][e]) for e in eps) + " | — |")
    lines += [
        "| σ (distributed, central) | "
        + " | ".join(f"{dp['distributed'][e]['sigma']:.3f}" for e in eps)
        + " | — |",
        "",
    ]
    cal = report["calibration"]
    for title, method, variants in (
        ("FFC", "ffc", FFC_VARIANTS),
        ("CCVR", "ccvr", CCVR_VARIANTS),
    ):
        present = [v for v in variants if v in cal["by_epsilon"][rel[0]][method]]
        lines += [
            f"## DP {title} at ε per release (shipped head)",
            "",
            f"The model: FedAvg, {s['calibration_rounds']} rounds, η = "
            f"{s['calibration_lr']:g} (no DP in training). Each release planned as the "
            f"service plans it ({n} sites, t = {s['release_contributors']} guaranteed "
            f"contributors, Skellam), all sites contributing; {s['repeats']} noise draws per "
            "seed. Cells: accuracy of the head the validation gate ships (the calibrated "
            "head only when it beats the uncalibrated model on validation), and in "
            "brackets the calibrated head's own accuracy. Uncalibrated: "
            f"{_pm(cal['uncalibrated'])}; non-private {title}: "
            f"{_pm(cal['nonprivate'][method])}.",
            "",
            "| Variant | " + " | ".join(f"ε = {e}" for e in rel) + " |",
            "|---|" + "---|" * len(rel),
        ]
        for v in present:
            cells = []
            for e in rel:
                c = cal["by_epsilon"][e][method][v]
                cells.append(f"{_pm(c['shipped'])} ({_pm(c['test'])})")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        lines.append("")
    comp = report["comparisons"]
    lines += ["## Comparisons", ""]
    for e in eps:
        c = comp[f"epsilon_{e}"]
        lines.append(
            f"- ε = {e}: distributed − central {100 * c['distributed_minus_central']:+.2f} "
            f"points; distributed − local {100 * c['distributed_minus_local']:+.2f} points."
        )
    for e, b in comp["best_dp_calibrator"].items():
        service = "; ".join(
            f"{c.upper()} service {100 * v['shipped']:.1f} % (distance "
            f"{100 * v['distance']:.2f})"
            for c, v in b["service"].items()
        )
        lines.append(
            f"- ε = {e} per release: best shipped variant (by test mean) "
            f"{b['calibrator'].upper()} {b['variant']} {100 * b['shipped']:.1f} %, its "
            f"non-private {100 * b['nonprivate']:.1f} % (distance {100 * b['distance']:.2f} "
            f"points); {service}."
        )
    lines.append(
        "- Accounting: the project's ε of each central run against Opacus's own accountant "
        f"for the same (σ, q, T): largest difference {comp['accounting_max_difference']:.1e}."
    )
    lines.append(
        "- The shipped head's validation accuracy minus the uncalibrated model's, worst "
        f"over every seed, ε, variant and draw: {100 * comp['gate_worst_validation_margin']:+.2f}"
        " points (never below)."
        if comp["gate_worst_validation_margin"] >= 0
        else "- The shipped head fell below the uncalibrated model on validation: "
        f"{100 * comp['gate_worst_validation_margin']:+.2f} points."
    )
    t = report.get("timings") or {}
    if t:
        lines += [
            "",
            f"Cells: {t.get('cells_run', 0)} run now, {t.get('cells_cached', 0)} reused from "
            f"the cells directory; {t.get('cells_compute_s', 0):.0f} s of cell compute in all "
            f"(this call's wall {t.get('wall_s', 0):.0f} s, {t.get('workers', 1)} worker(s)); "
            "load average when written "
            f"{', '.join(f'{x:.1f}' for x in report['machine']['load_average_at_end'])} on "
            f"{report['machine']['cpus']} CPUs.",
        ]
    return "\n".join(line for line in lines) + "\n"


def _write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return []
    from spherecal.experiment.plots import method_colors

    s = report["settings"]
    written = []
    eps = s["epsilons"]
    colors = method_colors(4)
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, m in enumerate(("local", "distributed", "central")):
        rows = [report["dpsgd"][m][f"{e:g}"] for e in eps]
        ax.errorbar(
            eps,
            [100 * r["mean"] for r in rows],
            yerr=[100 * r["sd"] for r in rows],
            label=m,
            color=colors[i],
            marker="o",
            capsize=3,
        )
    npv = report["dpsgd"]["nonprivate"]["none"]["mean"]
    ax.axhline(100 * npv, color=colors[3], linestyle="--", label="non-private")
    ax.set_xscale("log")
    ax.set_xticks(eps, [f"{e:g}" for e in eps])
    ax.minorticks_off()
    ax.set_xlabel("record-level ε (whole training)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"DP-SGD, {s['dataset']}, {s['participants']} sites, α = {s['alpha']:g}")
    ax.legend()
    fig.tight_layout()
    path = out_dir / "dpsgd_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    rel = s["release_epsilons"]
    cal = report["calibration"]
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = method_colors(6)
    for i, (m, v) in enumerate(
        (("ffc", "service"), ("ffc", "psd_val"), ("ccvr", "service"), ("ccvr", "trace"))
    ):
        rows = [cal["by_epsilon"][f"{e:g}"][m].get(v) for e in rel]
        if any(r is None for r in rows):
            continue
        ax.errorbar(
            rel,
            [100 * r["shipped"]["mean"] for r in rows],
            yerr=[100 * r["shipped"]["sd"] for r in rows],
            label=f"{m.upper()} {v} (shipped)",
            color=colors[i],
            marker="o",
            capsize=3,
        )
    for j, m in enumerate(("ffc", "ccvr")):
        ax.axhline(
            100 * cal["nonprivate"][m]["mean"],
            color=colors[j * 2],
            linestyle=":",
            label=f"{m.upper()} non-private",
        )
    ax.axhline(
        100 * cal["uncalibrated"]["mean"], color="grey", linestyle="--", label="uncalibrated"
    )
    ax.set_xscale("log")
    ax.set_xticks(rel, [f"{e:g}" for e in rel])
    ax.minorticks_off()
    ax.set_xlabel("ε per release")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("DP calibration (the head the gate ships)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "dp_calibration.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def run_privacy_table(
    settings: PrivacySettings,
    out_dir: Path,
    *,
    workers: int = 1,
    threads: int = 1,
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
    plots: bool = True,
    cells_dir: Path | None = None,
) -> dict[str, Any]:
    """Run (or resume) the privacy grid, then write ``table.md``, ``results.json`` and
    the plots into ``out_dir``; the report."""
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = cells_dir if cells_dir is not None else out_dir / "cells"
    records, ran, cached = run_privacy_cells(
        settings, cells, workers=workers, threads=threads, progress=say
    )
    wall = time.perf_counter() - t0
    keys = {c.key(settings) for c in privacy_cells(settings)}
    report = build_privacy_report(
        settings,
        records,
        command=command,
        timings={
            "wall_s": wall,
            "cells_run": ran,
            "cells_cached": cached,
            "cells_compute_s": sum(float(records[k]["seconds"]) for k in keys),
            "workers": workers,
            "threads": threads,
        },
    )
    (out_dir / "results.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    (out_dir / "table.md").write_text(render_privacy_markdown(report))
    written = [out_dir / "results.json", out_dir / "table.md"]
    if plots:
        written += _write_plots(report, out_dir)
    for path in written:
        say(f"wrote {path}")
    return report
