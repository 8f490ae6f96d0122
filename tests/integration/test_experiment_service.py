"""``spherecal experiment --engine service``: every cell a real federation (coordinator
and participant processes on loopback, secure aggregation on), the same numbers as
the in-process engine, methods the service cannot run skipped with a reason, cells
reused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import spherecal.experiment.cells as cells_module
from spherecal.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARGS = [
    "experiment", "--table", "methods", "--methods", "fedavg", "feduv",
    "--participants", "3", "--rounds", "1", "--local-epochs", "1", "--seeds", "1",
    "--lr-grid", "0.1", "--alpha", "0.5", "--no-plots", "--quiet",
]  # fmt: skip


def test_service_engine_matches_inprocess_and_reuses_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*ARGS, "--out", str(tmp_path / "inprocess")]) == 0
    assert main([*ARGS, "--engine", "service", "--out", str(tmp_path / "service")]) == 0
    inprocess = json.loads((tmp_path / "inprocess" / "results.json").read_text())
    service = json.loads((tmp_path / "service" / "results.json").read_text())

    assert service["engine"] == "service" and inprocess["engine"] == "inprocess"
    assert [m["key"] for m in service["methods"]] == ["fedavg"]
    (skipped,) = service["skipped_methods"]
    assert skipped["key"] == "feduv" and "custom local objective" in skipped["reason"]
    assert inprocess["skipped_methods"] == [] and len(inprocess["methods"]) == 2

    # the real federation reproduces the reference runner: test and validation
    for svc, ref in zip(service["rows"], inprocess["rows"], strict=False):
        a, b = svc["columns"]["a0.5"]["per_seed"][0], ref["columns"]["a0.5"]["per_seed"][0]
        assert (svc["method"], svc["calibration"]) == (ref["method"], ref["calibration"])
        assert a["test"] == pytest.approx(b["test"], abs=1e-6)
        assert a["validation"] == pytest.approx(b["validation"], abs=1e-6)
        assert a["cell"] != b["cell"]  # the engine is part of a cell's identity
    table = (tmp_path / "service" / "table.md").read_text()
    assert "Engine: **service**" in table and "FedUV (`feduv`)" in table
    assert "| FedAvg | +FFC |" in table and "| FedUV |" not in table
    (cell,) = (tmp_path / "service" / "cells").glob("*.json")
    record = json.loads(cell.read_text())
    assert record["engine"] == "service" and record["service"]["bytes"]
    capsys.readouterr()

    # a rerun reuses the finished cell: no federation is started
    def boom(*_a: Any, **_k: Any) -> dict[str, Any]:
        raise AssertionError("a finished service cell was run again")

    monkeypatch.setattr(cells_module, "train_cell_as_service", boom)
    assert main([*ARGS, "--engine", "service", "--out", str(tmp_path / "service")]) == 0
    again = json.loads((tmp_path / "service" / "results.json").read_text())
    assert again["rows"] == service["rows"] and again["timings"]["cells_cached"] == 1


def test_service_engine_refuses_what_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["experiment", "--table", "methods", "--engine", "service", "--dataset", "synthetic",
         "--synthetic-dim", "6", "--out", "x"]
    )  # fmt: skip
    assert code == 2 and "default synthetic" in capsys.readouterr().err
