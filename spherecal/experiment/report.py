"""Turn the cells of ``spherecal experiment`` into the ``results.json`` document.

Pure aggregation over the cell records (no training here): selection on the
validation split (:mod:`.selection`), mean ± std over seeds, calibration gains,
per-round curves. The schema is documented in ``docs/baselines.md``.
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
from typing import Any, cast

import numpy as np
import torch

from spherecal.experiment.cells import write_json
from spherecal.experiment.grid import CALIBRATIONS, SCHEMA, Column, ExperimentSettings, RunSpec
from spherecal.experiment.markdown import GAIN_ORDER, render_markdown
from spherecal.experiment.plots import write_plots
from spherecal.experiment.selection import Candidate, Slot, candidates, finite, select, stats
from spherecal.results_schema import (
    CellRecord,
    Curve,
    ExperimentColumn,
    ExperimentResults,
    ExperimentRow,
    ExperimentSettingsDocument,
    ExperimentTimings,
    GainSeed,
    RowColumn,
    RowSeed,
    WarningCount,
)
from spherecal.spherefed.algorithms.methods import MethodSpec
from spherecal.spherefed.reference import ReferenceConfig

__all__ = ["build_report", "command_line", "load_results", "write_outputs"]


def build_report(
    settings: ExperimentSettings,
    specs: Sequence[RunSpec],
    records: dict[str, CellRecord],
    base: ReferenceConfig,
    *,
    oracle_records: dict[str, CellRecord] | None = None,
    command: str | None = None,
    timings: ExperimentTimings | None = None,
    threads: int = 1,
    workers: int = 1,
) -> ExperimentResults:
    """The ``results.json`` document (see ``docs/baselines.md`` for the schema)."""
    methods = settings.runnable_methods()
    skipped = settings.skipped_methods()
    columns = settings.columns
    seeds = list(range(settings.seeds))
    cands = candidates(specs, records, base)
    oracle_records = oracle_records or {}

    rows: list[ExperimentRow] = []
    for m in methods:
        for cal in CALIBRATIONS:
            rows.append(_row(m, cal, columns, seeds, cands, selection="per-row"))

    # the same trained model for every calibration: selected without calibration
    # calibration entries are keyed by data (``ffc``, ``ffc_gain``, ``oracle_gap``, …)
    gains: dict[str, dict[str, dict[str, Any]]] = {}
    curves: dict[str, dict[str, Curve]] = {}
    for m in methods:
        gains[m.key], curves[m.key] = {}, {}
        for col in columns:
            seeds_out: list[GainSeed] = []
            curve_runs = []
            for seed in seeds:
                pick = select(cands.get((m.key, col.key, seed), []), "none")
                if pick is None:
                    seeds_out.append({"seed": seed, "diverged": True})
                    continue
                spec, rec = pick
                entry: GainSeed = {
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
                f"{c}_gap": stats([_diff(s["test"], "oracle", c) for s in ok])
                for c in ["none", *cal_keys]
                if has_oracle and c != "oracle"
            }
            gains[m.key][col.key] = {
                **gaps,
                "none": stats([s["test"]["none"] for s in ok]),
                **{f"{c}_gain": stats([_diff(s["test"], c, "none") for s in ok]) for c in cal_keys},
                **{c: stats([s["test"].get(c, math.nan) for s in ok]) for c in cal_keys},
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
    # ``settings`` is declared JSON (the grid's own ``to_json`` plus what is added here)
    settings_json = cast(
        ExperimentSettingsDocument,
        {
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
    )
    document: ExperimentResults = {
        "schema": SCHEMA,
        "table": settings.table,
        "engine": settings.engine,
        "skipped_methods": [
            {"key": m.key, "label": m.label, "reason": skipped[m.key]}
            for m in settings.table_methods()
            if m.key in skipped
        ],
        "command": command or command_line(settings),
        "settings": settings_json,
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
    if settings.engine == "inprocess":
        return document
    # "hosting" follows "engine" in the file, where it has always been
    ordered: dict[str, object] = {}
    for key, value in document.items():
        ordered[key] = value
        if key == "engine":
            ordered["hosting"] = _hosting_counts(specs, records, base)
    return cast(ExperimentResults, ordered)


def _diff(test: dict[str, float | None], a: str, b: str) -> float | None:
    """``test[a] - test[b]`` where both are finite numbers, else None (left out of
    the statistics)."""
    x, y = test.get(a), test.get(b)
    return x - y if x is not None and y is not None and finite(x) and finite(y) else None


def _hosting_counts(
    specs: Sequence[RunSpec], records: dict[str, CellRecord], base: ReferenceConfig
) -> dict[str, int]:
    """How many of the table's service cells had their participants hosted which way
    (cells are reused across hostings; a cell made before the hosting was recorded
    ran one process per participant)."""
    counts: dict[str, int] = {}
    for key in dict.fromkeys(spec.key(base) for spec in specs):
        rec = records.get(key)
        if rec is None or rec.get("engine") != "service":
            continue
        hosting = str(rec.get("service", {}).get("hosting", "processes"))
        counts[hosting] = counts.get(hosting, 0) + 1
    return counts


def _summarise_warnings(records: Iterable[CellRecord]) -> list[WarningCount]:
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


def _column_json(c: Column) -> ExperimentColumn:
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
) -> ExperimentRow:
    cols: dict[str, RowColumn] = {}
    for col in columns:
        per_seed: list[RowSeed] = []
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
        st = stats([p["test"] for p in per_seed if not p.get("diverged")])
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
    if settings.engine != "inprocess":
        parts.append(f"--engine {settings.engine}")
        if settings.hosting != ExperimentSettings().hosting:
            parts.append(f"--hosting {settings.hosting}")
    if settings.secure_sum:
        parts.append("--secure-sum")
    parts.append(f"--out {out}")
    return " ".join(parts)


def write_outputs(report: ExperimentResults, out_dir: Path, *, plots: bool = True) -> list[Path]:
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


def load_results(path: Path) -> ExperimentResults:
    """A ``results.json`` of ``spherecal experiment``, as declared (its ``schema`` is
    checked; the committed tables lack the keys declared ``NotRequired``)."""
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} file")
    return cast(ExperimentResults, data)
