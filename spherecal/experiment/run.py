"""``run_experiment``: run (or resume) a table's grid, then write its outputs."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from spherecal.experiment.cells import fmt_time, run_cells
from spherecal.experiment.grid import ExperimentSettings, Progress, grid_runs
from spherecal.experiment.report import build_report, write_outputs
from spherecal.experiment.selection import select_runs
from spherecal.results_schema import CellRecord, ExperimentResults

__all__ = ["run_experiment"]


def run_experiment(
    settings: ExperimentSettings,
    out_dir: Path,
    *,
    workers: int = 1,
    threads: int = 1,
    ray: bool = False,
    ray_address: str | None = None,
    command: str | None = None,
    progress: Progress | None = None,
    plots: bool = True,
    cells_dir: Path | None = None,
) -> ExperimentResults:
    """Run (or resume) the table's grid, then write ``table.md``, ``results.json``, plots.

    Cells go to ``cells_dir`` (default ``out_dir/cells``); several tables may share one
    cells directory, and then share the runs they have in common.
    """

    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    cells_dir = cells_dir if cells_dir is not None else out_dir / "cells"
    base = settings.base_config()
    specs = grid_runs(settings)
    single_lr = all(len(settings.grid_for(m)) == 1 for m in settings.table_methods())
    oracle_in_grid = settings.table == "calibration" and settings.engine == "inprocess"
    oracle_in_grid = oracle_in_grid and single_lr
    if oracle_in_grid:
        # One lr per method: the grid run *is* the selected model, so compute its oracle
        # in the same run instead of training the model a second time.
        specs = [replace(s, oracle=True) for s in specs]
    records, ran, cached = run_cells(
        specs,
        base,
        cells_dir,
        workers=workers,
        threads=threads,
        progress=say,
        phase="grid: ",
        ray=ray,
        ray_address=ray_address,
    )
    oracle_records: dict[str, CellRecord] = {}
    if oracle_in_grid:
        oracle_records = records
    elif settings.table == "calibration" and settings.engine == "inprocess":
        chosen = select_runs(settings, specs, records, base, criterion="none")
        oracle_specs = [replace(s, oracle=True) for s in chosen.values() if s is not None]
        oracle_records, ran2, cached2 = run_cells(
            oracle_specs,
            base,
            cells_dir,
            workers=workers,
            threads=threads,
            ray=ray,
            ray_address=ray_address,
            progress=say,
            phase="oracle re-runs of the selected models: ",
        )
        ran, cached = ran + ran2, cached + cached2
    wall = time.perf_counter() - t0
    report = build_report(
        settings,
        specs,
        records,
        base,
        oracle_records=oracle_records,
        command=command,
        timings={
            "wall_s": wall,
            "cells_run": ran,
            "cells_cached": cached,
            "cells_compute_s": sum(
                float(r.get("seconds", 0.0)) for r in [*records.values(), *oracle_records.values()]
            ),
        },
        threads=threads,
        workers=workers,
    )
    written = write_outputs(report, out_dir, plots=plots)
    for path in written:
        say(f"wrote {path}")
    say(f"done in {fmt_time(wall)} ({ran} cells run, {cached} reused)")
    return report
