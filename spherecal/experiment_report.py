"""Turn the cells of ``spherecal experiment`` into ``table.md``, ``results.json`` and plots.

Pure aggregation over the cell records (no training here): learning-rate selection on
the validation split, mean ± std over seeds, calibration gains, per-round curves.
The ``results.json`` schema is documented in ``docs/baselines.md``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spherecal.experiment import (
    CALIBRATIONS,
    SCHEMA,
    Column,
    ExperimentSettings,
    RunSpec,
    write_json,
)
from spherefed.algorithms.methods import MethodSpec
from spherefed.runner import ReferenceConfig

Slot = tuple[str, str, int]  # (method key, column key, seed)
Candidate = tuple[RunSpec, dict[str, Any]]

CALIBRATION_LABELS = {
    "none": "none",
    "ccvr": "+CCVR",
    "ffc": "+FFC",
    "ffc_bias": "+FFC+bias",
    "lda": "+LDA",
    "qda": "+QDA",
    "oracle": "oracle",
}
GAIN_ORDER: tuple[str, ...] = ("ffc", "ffc_bias", "ccvr", "lda", "qda")
"""Calibrations of the ``calibration`` table, in row order (those a cell has)."""


# ----------------------------------------------------------------------------- selection


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(float(x))


def candidates(
    specs: Sequence[RunSpec], records: dict[str, dict[str, Any]], base: ReferenceConfig
) -> dict[Slot, list[Candidate]]:
    """Grid runs grouped by (method, column, seed), in grid order."""
    out: dict[Slot, list[Candidate]] = {}
    for spec in specs:
        rec = records.get(spec.key(base))
        if rec is None:
            continue
        out.setdefault((spec.method.key, spec.column.key, spec.seed), []).append((spec, rec))
    return out


def select(cands: Sequence[Candidate], criterion: str) -> Candidate | None:
    """The run with the best validation accuracy for ``criterion`` (ties → earlier =
    smaller lr), among runs that did not diverge; ``None`` if all diverged."""
    best: Candidate | None = None
    best_val = -math.inf
    for spec, rec in cands:
        if rec.get("diverged"):
            continue
        val = rec["validation_accuracy"].get(criterion)
        if not _finite(val):
            continue
        if float(val) > best_val:
            best, best_val = (spec, rec), float(val)
    return best


def select_runs(
    settings: ExperimentSettings,
    specs: Sequence[RunSpec],
    records: dict[str, dict[str, Any]],
    base: ReferenceConfig,
    *,
    criterion: str,
) -> dict[Slot, RunSpec | None]:
    """For every (method, column, seed): the run chosen on validation ``criterion``."""
    chosen: dict[Slot, RunSpec | None] = {}
    for slot, cands in candidates(specs, records, base).items():
        pick = select(cands, criterion)
        chosen[slot] = None if pick is None else pick[0]
    return chosen


def _stats(values: list[float]) -> dict[str, Any]:
    finite = [v for v in values if _finite(v)]
    if not finite:
        return {"mean": None, "std": None, "n": 0}
    arr = np.asarray(finite, dtype=np.float64)
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std, "n": int(arr.size)}


# ----------------------------------------------------------------------------- report


def build_report(
    settings: ExperimentSettings,
    specs: Sequence[RunSpec],
    records: dict[str, dict[str, Any]],
    base: ReferenceConfig,
    *,
    oracle_records: dict[str, dict[str, Any]] | None = None,
    command: str | None = None,
    timings: dict[str, Any] | None = None,
    threads: int = 1,
    workers: int = 1,
) -> dict[str, Any]:
    """The ``results.json`` document (see ``docs/baselines.md`` for the schema)."""
    methods = settings.table_methods()
    columns = settings.columns
    seeds = list(range(settings.seeds))
    cands = candidates(specs, records, base)
    oracle_records = oracle_records or {}

    rows: list[dict[str, Any]] = []
    for m in methods:
        for cal in CALIBRATIONS:
            rows.append(_row(m, cal, columns, seeds, cands, selection="per-row"))

    # the same trained model for every calibration: selected without calibration
    gains: dict[str, dict[str, Any]] = {}
    curves: dict[str, dict[str, Any]] = {}
    for m in methods:
        gains[m.key], curves[m.key] = {}, {}
        for col in columns:
            seeds_out: list[dict[str, Any]] = []
            curve_runs = []
            for seed in seeds:
                pick = select(cands.get((m.key, col.key, seed), []), "none")
                if pick is None:
                    seeds_out.append({"seed": seed, "diverged": True})
                    continue
                spec, rec = pick
                entry = {
                    "seed": seed,
                    "lr": spec.lr,
                    "temperature": spec.temperature,
                    "test": dict(rec["accuracy"]),
                    "cell": rec["key"],
                }
                if "calibration" in rec:
                    entry["chosen"] = rec["calibration"]
                orec = oracle_records.get(replace(spec, oracle=True).key(base))
                if orec is not None and not orec.get("diverged"):
                    entry["test"]["oracle"] = orec["accuracy"].get("oracle")
                    entry["oracle_cell"] = orec["key"]
                seeds_out.append(entry)
                curve_runs.append(rec["per_round"])
            ok = [s for s in seeds_out if not s.get("diverged")]
            has_oracle = any("oracle" in s["test"] for s in ok)
            cal_keys = [c for c in GAIN_ORDER if any(c in s["test"] for s in ok)]
            cal_keys += ["oracle"] if has_oracle else []
            gaps = {
                f"{c}_gap": _stats(
                    [
                        s["test"]["oracle"] - s["test"][c]
                        for s in ok
                        if _finite(s["test"].get(c)) and _finite(s["test"].get("oracle"))
                    ]
                )
                for c in ["none", *cal_keys]
                if has_oracle and c != "oracle"
            }
            gains[m.key][col.key] = {
                **gaps,
                "none": _stats([s["test"]["none"] for s in ok]),
                **{
                    f"{c}_gain": _stats(
                        [s["test"][c] - s["test"]["none"] for s in ok if _finite(s["test"].get(c))]
                    )
                    for c in cal_keys
                },
                **{c: _stats([s["test"].get(c, math.nan) for s in ok]) for c in cal_keys},
                "per_seed": seeds_out,
            }
            if curve_runs:
                length = min(len(c) for c in curve_runs)
                arr = np.asarray([c[:length] for c in curve_runs], dtype=np.float64)
                curves[m.key][col.key] = {
                    "mean": arr.mean(axis=0).tolist(),
                    "std": (arr.std(axis=0, ddof=1) if len(arr) > 1 else np.zeros(length)).tolist(),
                }

    sweep: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (mkey, ckey, seed), cs in cands.items():
        for spec, rec in cs:
            sweep.setdefault(mkey, {}).setdefault(ckey, []).append(
                {
                    "seed": seed,
                    "lr": spec.lr,
                    "temperature": spec.temperature,
                    "diverged": bool(rec.get("diverged")),
                    "validation": rec.get("validation_accuracy"),
                    "test": rec.get("accuracy"),
                }
            )

    warnings_seen = _summarise_warnings(records.values())
    return {
        "schema": SCHEMA,
        "table": settings.table,
        "command": command or command_line(settings),
        "settings": {
            **settings.to_json(),
            "columns": [_column_json(c) for c in columns],
            "seeds": seeds,
            "base_config": {k: v for k, v in base.to_json().items() if k not in ("lr", "seed")},
            "lr_grids": {m.key: list(settings.grid_for(m)) for m in methods},
            "temperature_grids": {m.key: list(m.temperatures()) for m in methods},
            "selection": (
                "per row, column and seed: the lr (× temperature) with the best validation "
                "accuracy for the row's calibration; ties go to the smaller lr"
            ),
        },
        "methods": [
            {
                "key": m.key,
                "label": m.label,
                "family": m.family,
                "algorithm": m.algorithm,
                "head": m.head,
                "classifier": m.classifier,
                "loss": m.loss,
                "source": m.source,
            }
            for m in methods
        ],
        "rows": rows,
        "calibration": gains,
        "curves": curves,
        "lr_sweep": sweep,
        "warnings": warnings_seen,
        "timings": timings or {},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "threads": threads,
            "workers": workers,
            "cpus": os.cpu_count(),
        },
    }


def _summarise_warnings(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Distinct warnings (numbers masked) with the number of runs that raised them."""
    counts: dict[str, int] = {}
    example: dict[str, str] = {}
    for rec in records:
        for w in set(rec.get("warnings", [])):
            pattern = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", w)
            counts[pattern] = counts.get(pattern, 0) + 1
            example.setdefault(pattern, w)
    return [
        {"warning": p, "runs": n, "example": example[p]}
        for p, n in sorted(counts.items(), key=lambda kv: -kv[1])
    ]


def _column_json(c: Column) -> dict[str, Any]:
    return {
        "key": c.key,
        "label": c.label,
        "partition": c.partition,
        "alpha": c.alpha,
        "shards": c.shards,
    }


def _row(
    m: MethodSpec,
    cal: str,
    columns: Sequence[Column],
    seeds: Sequence[int],
    cands: dict[Slot, list[Candidate]],
    *,
    selection: str,
) -> dict[str, Any]:
    cols: dict[str, Any] = {}
    for col in columns:
        per_seed: list[dict[str, Any]] = []
        for seed in seeds:
            pick = select(cands.get((m.key, col.key, seed), []), cal)
            if pick is None:
                per_seed.append({"seed": seed, "diverged": True})
                continue
            spec, rec = pick
            per_seed.append(
                {
                    "seed": seed,
                    "lr": spec.lr,
                    "temperature": spec.temperature,
                    "test": rec["accuracy"][cal],
                    "validation": rec["validation_accuracy"][cal],
                    "cell": rec["key"],
                }
            )
        st = _stats([p["test"] for p in per_seed if not p.get("diverged")])
        grid = sorted({s.lr for s, _ in cands.get((m.key, col.key, seeds[0]), [])})
        cols[col.key] = {
            **st,
            "diverged_seeds": sum(1 for p in per_seed if p.get("diverged")),
            "per_seed": per_seed,
            "lr_grid": grid,
        }
    return {
        "method": m.key,
        "label": m.label,
        "family": m.family,
        "calibration": cal,
        "selection": selection,
        "columns": cols,
    }


def command_line(settings: ExperimentSettings, out: str = "DIR") -> str:
    """An equivalent ``spherecal experiment`` command for these settings."""
    parts = ["spherecal experiment", f"--table {settings.table}", f"--dataset {settings.dataset}"]
    if settings.samples is not None:
        parts.append(f"--samples {settings.samples}")
    if settings.alphas:
        parts.append("--alpha " + " ".join(str(a) for a in settings.alphas))
    if settings.shards:
        parts.append("--shards " + " ".join(map(str, settings.shards)))
    parts += [
        f"--seeds {settings.seeds}",
        f"--rounds {settings.rounds}",
        f"--participants {settings.participants}",
        f"--local-epochs {settings.local_epochs}",
        f"--model {settings.model}",
    ]
    if settings.lr_grid is not None:
        parts.append("--lr-grid " + " ".join(f"{lr:g}" for lr in settings.lr_grid))
    if settings.methods is not None:
        parts.append("--methods " + " ".join(settings.methods))
    parts.append(f"--out {out}")
    return " ".join(parts)


# ----------------------------------------------------------------------------- markdown


def _pct(stats: dict[str, Any], *, signed: bool = False) -> str:
    if stats.get("mean") is None:
        return "diverged"
    sign = "+" if signed and stats["mean"] >= 0 else ""
    text = f"{sign}{100 * stats['mean']:.1f}"
    if stats.get("n", 0) > 1:
        text += f" ± {100 * stats['std']:.1f}"
    return text


def _bold_best(cells: list[tuple[str, float | None]]) -> list[str]:
    means = [m for _, m in cells if m is not None]
    best = max(means) if means else None
    out = []
    for text, m in cells:
        if best is not None and m is not None and round(m, 6) == round(best, 6):
            out.append(f"**{text}**")
        else:
            out.append(text)
    return out


def _lr_text(col: dict[str, Any]) -> str:
    grid = col.get("lr_grid") or []
    parts = []
    for p in col["per_seed"]:
        if p.get("diverged"):
            parts.append("×")
            continue
        t = f"{p['lr']:g}"
        if grid and len(grid) > 1 and p["lr"] == max(grid):
            t += "↑"
        elif grid and len(grid) > 1 and p["lr"] == min(grid):
            t += "↓"
        if p.get("temperature", 1.0) != 1.0:
            t += f"/τ{p['temperature']:g}"
        parts.append(t)
    return ", ".join(parts)


def _header(report: dict[str, Any]) -> list[str]:
    s = report["settings"]
    cfg = s["base_config"]
    seeds = len(s["seeds"])
    lines = [
        f"# spherecal experiment — {report['table']} ({s['dataset']})",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Test accuracy (%) of the global model, mean ± sample std over {seeds} seed(s). "
        f"{cfg['participants']} participants, {cfg['rounds']} rounds × {cfg['local_epochs']} "
        f"local epochs, batch {cfg['batch_size']}, SGD momentum {cfg['momentum']}, model "
        f"`{cfg['model']}`. Learning rate chosen per row, column and seed on the validation "
        "split (never on test); **bold** = best mean in the column. "
        "CCVR and FFC calibrate the trained model's classifier from summed statistics.",
        "",
    ]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """``table.md`` for any of the three tables."""
    cols = report["settings"]["columns"]
    lines = _header(report)
    table = report["table"]
    labels = {m["key"]: m["label"] for m in report["methods"]}
    if table == "methods":
        lines += _methods_table(report, cols)
    elif table == "ablation":
        lines += _ablation_table(report, cols, labels)
    else:
        lines += _calibration_table(report, cols, labels)
    lines += ["", "## Selected learning rates", ""]
    lines += [
        "Per seed; ↑/↓ = the largest/smallest value of that method's grid (the optimum "
        "may lie outside it), × = every learning rate diverged, /τ = temperature.",
        "",
        "| Method | Calibration | " + " | ".join(c["label"] for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    shown = {"methods": CALIBRATIONS, "ablation": ("none", "ffc"), "calibration": ("none",)}
    for row in report["rows"]:
        if row["calibration"] not in shown[table]:
            continue
        lines.append(
            f"| {row['label']} | {CALIBRATION_LABELS[row['calibration']]} | "
            + " | ".join(_lr_text(row["columns"][c["key"]]) for c in cols)
            + " |"
        )
    lines += ["", "## Learning-rate grids", ""]
    for key, grid in report["settings"]["lr_grids"].items():
        taus = report["settings"]["temperature_grids"][key]
        t = f", τ ∈ {{{', '.join(f'{x:g}' for x in taus)}}}" if taus != [1.0] else ""
        lines.append(f"- {labels[key]}: {{{', '.join(f'{x:g}' for x in grid)}}}{t}")
    tm = report.get("timings") or {}
    if tm:
        lines += [
            "",
            f"This invocation: {tm.get('wall_s', 0) / 60:.1f} min wall "
            f"({tm.get('cells_run', 0)} runs, {tm.get('cells_cached', 0)} reused from the "
            f"cells directory), {report['environment']['workers']} worker(s) × "
            f"{report['environment']['threads']} thread(s). The table's "
            f"{tm.get('cells_run', 0) + tm.get('cells_cached', 0)} runs took "
            f"{tm.get('cells_compute_s', 0) / 60:.1f} min of (single-thread) run time in total.",
        ]
    return "\n".join(lines) + "\n"


def _methods_table(report: dict[str, Any], cols: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| Method | Calibration | " + " | ".join(c["label"] for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    cells_by_col: dict[str, list[tuple[str, float | None]]] = {c["key"]: [] for c in cols}
    for row in report["rows"]:
        for c in cols:
            st = row["columns"][c["key"]]
            text = _pct(st)
            if st["diverged_seeds"] and st.get("mean") is not None:
                text += f" (†{st['diverged_seeds']})"
            cells_by_col[c["key"]].append((text, st.get("mean")))
    bolded = {k: _bold_best(v) for k, v in cells_by_col.items()}
    for i, row in enumerate(report["rows"]):
        lines.append(
            f"| {row['label']} | {CALIBRATION_LABELS[row['calibration']]} | "
            + " | ".join(bolded[c["key"]][i] for c in cols)
            + " |"
        )
    if any(r["columns"][c["key"]]["diverged_seeds"] for r in report["rows"] for c in cols):
        lines += ["", "† = seeds on which every learning rate diverged (left out of the mean)."]
    return lines


def _ablation_table(
    report: dict[str, Any], cols: list[dict[str, Any]], labels: dict[str, str]
) -> list[str]:
    heads = []
    for c in cols:
        heads += [c["label"], f"{c['label']} +FFC"]
    lines = ["| Variant | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    by = {(r["method"], r["calibration"]): r for r in report["rows"]}
    keys = [m["key"] for m in report["methods"]]
    grid: dict[str, list[tuple[str, float | None]]] = {}
    for c in cols:
        for cal in ("none", "ffc"):
            grid[f"{c['key']}/{cal}"] = [
                (_pct(by[(k, cal)]["columns"][c["key"]]), by[(k, cal)]["columns"][c["key"]]["mean"])
                for k in keys
            ]
    bolded = {k: _bold_best(v) for k, v in grid.items()}
    for i, k in enumerate(keys):
        cells = []
        for c in cols:
            cells += [bolded[f"{c['key']}/none"][i], bolded[f"{c['key']}/ffc"][i]]
        lines.append(f"| {labels[k]} | " + " | ".join(cells) + " |")
    return lines


def _calibration_table(
    report: dict[str, Any], cols: list[dict[str, Any]], labels: dict[str, str]
) -> list[str]:
    lines = [
        "The same trained model in every row of a column (its lr chosen on validation "
        "*without* calibration); each row calibrates that model's classifier from the "
        "summed statistics. Cells: test accuracy, mean ± std over seeds, and in brackets "
        "the difference to the oracle in points (row − oracle, mean over seeds; negative "
        "= below the oracle). FFC+bias' ridge "
        "and LDA/QDA's shrinkage are chosen per seed on the validation split. The oracle "
        "fine-tunes the classifier on all pooled real features and picks the best of "
        "CE/MSE × 3 lrs **on test** — an optimistic upper bound (SphereFed §5.4).",
        "",
    ]
    for key, per_col in report["calibration"].items():
        lines += [
            f"### {labels[key]}",
            "",
            "| Calibration | " + " | ".join(c["label"] for c in cols) + " |",
            "|---|" + "---|" * len(cols),
        ]
        present = [
            cal
            for cal in ("none", *GAIN_ORDER, "oracle")
            if any(cal in per_col[c["key"]] for c in cols)
        ]
        for cal in present:
            cells = []
            for c in cols:
                g = per_col[c["key"]]
                if cal not in g:
                    cells.append("—")
                    continue
                text = _pct(g[cal])
                if f"{cal}_gap" in g and g[f"{cal}_gap"].get("mean") is not None:
                    text += f" ({-100 * g[f'{cal}_gap']['mean']:+.1f})"
                cells.append(text)
            lines.append(f"| {CALIBRATION_LABELS[cal]} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


# ----------------------------------------------------------------------------- plots


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """``accuracy_per_round.png`` and ``calibration_gain.png`` (matplotlib, Agg)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the dev extra
        return []
    cols = report["settings"]["columns"]
    labels = {m["key"]: m["label"] for m in report["methods"]}
    keys = [m["key"] for m in report["methods"]]
    cmap = plt.get_cmap("tab20")
    written = []

    fig, axes = plt.subplots(1, len(cols), figsize=(4.2 * len(cols), 3.6), squeeze=False)
    for ax, col in zip(axes[0], cols, strict=True):
        for i, key in enumerate(keys):
            curve = report["curves"].get(key, {}).get(col["key"])
            if not curve:
                continue
            mean = 100 * np.asarray(curve["mean"])
            ax.plot(
                np.arange(1, mean.size + 1), mean, label=labels[key], color=cmap(i % 20), lw=1.2
            )
        ax.set_title(col["label"])
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(6, max(1, len(names))), fontsize=7)
    fig.suptitle(
        "Accuracy per round (lr selected on validation, no calibration; mean over seeds)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    path = out_dir / "accuracy_per_round.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)

    gains = report["calibration"]
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 0.55 * len(keys) * 2), 3.8), squeeze=False)
    width = 0.8 / max(len(cols), 1)
    x = np.arange(len(keys))
    for ax, cal in zip(axes[0], ("ccvr", "ffc"), strict=True):
        for j, col in enumerate(cols):
            vals, errs = [], []
            for key in keys:
                st = gains[key][col["key"]].get(f"{cal}_gain", {})
                vals.append(100 * st["mean"] if st.get("mean") is not None else np.nan)
                errs.append(100 * st["std"] if st.get("std") is not None else 0.0)
            ax.bar(
                x + (j - (len(cols) - 1) / 2) * width,
                vals,
                width,
                yerr=errs,
                label=col["label"],
                capsize=2,
            )
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(x)
        ax.set_xticklabels([labels[k] for k in keys], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("gain over no calibration (points)")
        ax.set_title(f"+{cal.upper()} gain per partition")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "calibration_gain.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    if report["table"] == "calibration":
        written += _oracle_gap_plot(report, out_dir, plt)
    return written


def _oracle_gap_plot(report: dict[str, Any], out_dir: Path, plt: Any) -> list[Path]:
    """``calibration_accuracy.png``: every calibration's accuracy per column (one panel
    per method), the oracle as a bar too, error bars = std over seeds."""
    cols = report["settings"]["columns"]
    labels = {m["key"]: m["label"] for m in report["methods"]}
    keys = list(report["calibration"])
    fig, axes = plt.subplots(
        1, len(keys), figsize=(max(6.5, 1.6 * len(cols)) * len(keys), 3.8), squeeze=False
    )
    for ax, key in zip(axes[0], keys, strict=True):
        per_col = report["calibration"][key]
        cals = [
            c for c in ("none", *GAIN_ORDER, "oracle") if any(c in per_col[k["key"]] for k in cols)
        ]
        width = 0.8 / max(len(cals), 1)
        x = np.arange(len(cols))
        for j, cal in enumerate(cals):
            vals = [100 * (per_col[c["key"]].get(cal, {}).get("mean") or np.nan) for c in cols]
            errs = [100 * (per_col[c["key"]].get(cal, {}).get("std") or 0.0) for c in cols]
            ax.bar(
                x + (j - (len(cals) - 1) / 2) * width,
                vals,
                width,
                yerr=errs,
                capsize=2,
                label=CALIBRATION_LABELS[cal],
            )
        ax.set_xticks(x)
        ax.set_xticklabels([c["label"] for c in cols])
        ax.set_ylabel("test accuracy (%)")
        finite = [
            100 * per_col[c["key"]][cal]["mean"]
            for c in cols
            for cal in cals
            if isinstance(per_col[c["key"]].get(cal, {}).get("mean"), float)
        ]
        if finite:
            ax.set_ylim(max(0.0, min(finite) - 5), min(100.0, max(finite) + 3))
        ax.set_title(f"{labels[key]}: calibration vs oracle")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out_dir / "calibration_accuracy.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return [path]


def write_outputs(report: dict[str, Any], out_dir: Path, *, plots: bool = True) -> list[Path]:
    """Write ``table.md``, ``results.json`` and (optionally) the plots; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / "table.md"
    table.write_text(render_markdown(report))
    results = out_dir / "results.json"
    write_json(results, _clean(report), compact=True)
    written = [table, results]
    if plots:
        written += write_plots(report, out_dir)
    return written


def _clean(obj: Any) -> Any:
    """NaN/Inf → ``None`` (strict JSON); floats to 6 decimals (accuracies are counts
    out of a few hundred test samples, so nothing is lost) to keep the file small."""
    if isinstance(obj, float):
        return round(obj, 6) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def load_results(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} file")
    return data
