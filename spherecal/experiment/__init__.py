"""``spherecal experiment``: every method of the papers, side by side, on your data.

The grid
--------
A *table* (``methods``, ``ablation`` or ``calibration``) names a set of training
methods (:mod:`spherecal.spherefed.algorithms.methods`). Each method is trained for every
*column* (a data partition: Dirichlet ``α``, IID, or ``S`` shards per participant),
every seed and every point of its learning-rate grid (× temperature grid, where a
method has one). One such training run is a **cell**: it goes through
:func:`spherecal.spherefed.reference.run_federation` — the reference runner's data preparation,
statistics and FFC/CCVR code — and its result (test and validation accuracy for no
calibration, +CCVR and +FFC, accuracy per round) is written to
``DIR/cells/<hash>.json`` the moment it finishes. The hash covers everything that
defines the run (the full reference config, algorithm, objective), so a rerun skips
finished cells (resumable), and two tables that need the same run share it.

Selection (as the papers do it)
-------------------------------
For every table row (method × calibration), column and seed, the learning rate is
the one with the best **validation** accuracy for that row's calibration (ties → the
smaller learning rate); the **test** accuracy of that run is reported. Mean ± sample
standard deviation over seeds. The test split is never used to choose anything.
The ``calibration`` table instead fixes the trained model (lr chosen on validation
without calibration) and reports what each calibration adds to *that* model, plus
SphereFed's oracle (classifier fine-tuned on all pooled real features, best on test:
an optimistic upper bound, §5.4).

Outputs: ``DIR/table.md``, ``DIR/results.json`` (schema in ``docs/baselines.md``),
``DIR/accuracy_per_round.png``, ``DIR/calibration_gain.png``; progress on stderr.

The package, one idea per module (imports only point down this list):

- :mod:`.grid` — tables, columns, :class:`ExperimentSettings`, :class:`RunSpec` cells;
- :mod:`.cells` — run each cell once, store it, reuse it;
- :mod:`.service_engine` — ``--engine service``: one cell trained as a real federation;
- :mod:`.selection` — learning-rate selection on validation;
- :mod:`.markdown`, :mod:`.plots` — ``table.md`` and the PNGs from the report;
- :mod:`.report` — the ``results.json`` document and writing the outputs;
- :mod:`.run` — :func:`run_experiment`, start to finish;
- :mod:`.privacy` — ``--table privacy``: DP-SGD and DP calibration cells (issue #25);
- :mod:`.privacy_report` — that table's ``results.json``, ``table.md``, plots, run.

The command line is :mod:`spherecal.cli.experiment`.
"""

from __future__ import annotations

from spherecal.experiment.cells import execute_run, run_cells
from spherecal.experiment.grid import (
    TABLES,
    Column,
    ExperimentSettings,
    RunSpec,
    grid_runs,
    make_columns,
)
from spherecal.experiment.markdown import render_markdown
from spherecal.experiment.report import build_report
from spherecal.experiment.run import run_experiment
from spherecal.experiment.selection import select, select_runs

__all__ = [
    "TABLES",
    "Column",
    "ExperimentSettings",
    "RunSpec",
    "build_report",
    "execute_run",
    "grid_runs",
    "make_columns",
    "render_markdown",
    "run_cells",
    "run_experiment",
    "select",
    "select_runs",
]
