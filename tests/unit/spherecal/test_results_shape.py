"""The declared shapes of the result documents (``spherecal.results_schema``,
``spherecal.coordinator.summary_schema``) hold what real runs write, and the check
that holds them (``tests/json_shape.py``) fails on every kind of drift.

Real documents: the committed experiment tables (``docs/baselines/*/results.json``)
and a tiny experiment's cells and ``results.json`` here; ``summary.json`` of an
in-process federation in ``tests/unit/coordinator/test_federation.py``; the
``results.json``, ``summary.json`` and ``audit.json`` of real multi-process runs in
``tests/integration/test_service_federation.py`` (no DP) and
``tests/integration/test_privacy_service.py`` (DP).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spherecal.cli.app import main
from spherecal.coordinator.summary_schema import CoordinatorSummary, RoundMetrics
from spherecal.results_schema import CellRecord, ExperimentResults, calibration_stats
from tests.json_shape import shape_errors
from tests.unit.spherecal.test_experiment import TINY_ARGS

ROOT = Path(__file__).resolve().parents[3]


def _round() -> dict[str, Any]:
    return {
        "round": 1,
        "attempt": 1,
        "selected": ["p0", "p1"],
        "contributors": ["p0", "p1"],
        "dropped": {},
        "train_loss": 0.5,
        "weight": 10.0,
        "test_accuracy": None,
        "federated_accuracy": 0.75,
        "secure_job": "ab12",
        "seconds": 1,  # JSON has one number type: an integral float may be written as 1
    }


def test_a_conforming_record_passes() -> None:
    assert shape_errors(_round(), RoundMetrics) == []
    lost = {**_round(), "status": "lost"}
    del lost["weight"]  # optional keys may be absent
    assert shape_errors(lost, RoundMetrics) == []


@pytest.mark.parametrize(
    ("drift", "expected"),
    [
        (lambda d: d.pop("contributors"), "$.contributors: missing (RoundMetrics requires it)"),
        (lambda d: d.update(renamed=1), "$.renamed: not declared in RoundMetrics"),
        (lambda d: d.update(round="1"), "$.round: '1' is not int"),
        (lambda d: d.update(round=True), "$.round: True is not int"),
        (lambda d: d.update(status="done"), "$.status: 'done' not in ('lost',)"),
        (lambda d: d["selected"].append(3), "$.selected[2]: 3 is not str"),
        (lambda d: d.update(dropped={"p1": None}), "$.dropped.p1: None is not str"),
        (lambda d: d.update(train_loss="high"), "$.train_loss: 'high' matches none of"),
    ],
)
def test_every_kind_of_drift_is_named(drift: Any, expected: str) -> None:
    record = copy.deepcopy(_round())
    drift(record)
    errors = shape_errors(record, RoundMetrics)
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_nested_declarations_are_checked_too() -> None:
    summary: dict[str, Any] = {"per_round": [_round()]}
    summary["per_round"][0]["secure_job"] = 7
    errors = shape_errors(summary, CoordinatorSummary)
    assert "$.per_round[0].secure_job: 7 matches none of" in "\n".join(errors)
    assert "$.schema: missing (CoordinatorSummary requires it)" in errors


@pytest.mark.parametrize("table", ["methods", "ablation", "calibration"])
def test_the_committed_experiment_tables_match_their_shape(table: str) -> None:
    document = json.loads((ROOT / "docs" / "baselines" / table / "results.json").read_text())
    assert shape_errors(document, ExperimentResults) == []


def test_an_experiments_cells_and_results_match_their_shapes(tmp_path: Path) -> None:
    args = ["--table", "calibration", "--methods", "fedavg", "--alpha", "0.5"]
    assert main(["experiment", *args, *TINY_ARGS, "--out", str(tmp_path)]) == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert shape_errors(document, ExperimentResults) == []
    cells = sorted((tmp_path / "cells").glob("*.json"))
    assert len(cells) == 3  # two lrs and the oracle re-run
    for cell in cells:
        assert shape_errors(json.loads(cell.read_text()), CellRecord) == [], cell.name


def test_reading_a_document_imports_no_numerics() -> None:
    """The declarations are for readers too (``spherecal status``, ``report``): they
    must not pull torch or numpy in."""
    code = (
        "import sys, spherecal.results_schema, spherecal.coordinator.summary_schema\n"
        "heavy = sorted({'torch', 'numpy'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_calibration_numbers_are_read_as_stats_or_refused() -> None:
    cell: dict[str, Any] = {
        "none": {"mean": 0.5, "std": None, "n": 1},
        "ffc": {"mean": 1, "std": 0.0, "n": 3},
        "ffc_gain": {"mean": 0.1, "std": 0.0},  # n missing
        "per_seed": [],
    }
    assert calibration_stats(cell, "none") == {"mean": 0.5, "std": None, "n": 1}
    assert calibration_stats(cell, "ffc") == {"mean": 1.0, "std": 0.0, "n": 3}
    assert calibration_stats(cell, "ccvr") is None  # the cell has no CCVR
    with pytest.raises(ValueError, match="'ffc_gain' is not mean/std/n"):
        calibration_stats(cell, "ffc_gain")
    with pytest.raises(ValueError, match="'per_seed' is not mean/std/n"):
        calibration_stats(cell, "per_seed")
