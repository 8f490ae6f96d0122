"""``spherecal experiment --engine service``: every cell a real federation (coordinator
process and participants on loopback, secure aggregation on), the same numbers as
the in-process engine whether the participants are threads of the cell's process
(the default) or processes of their own, methods the service cannot run skipped with
a reason, cells reused across both hostings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import spherecal.experiment.cells as cells_module
from spherecal.cli.app import main

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

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
    processes_out = tmp_path / "service-processes"
    assert (
        main([*ARGS, "--engine", "service", "--hosting", "processes", "--out", str(processes_out)])
        == 0
    )
    inprocess = json.loads((tmp_path / "inprocess" / "results.json").read_text())
    service = json.loads((tmp_path / "service" / "results.json").read_text())
    processes = json.loads((processes_out / "results.json").read_text())

    # participants as threads of one process or as processes: the same numbers, the
    # same cells (the hosting is recorded, not part of the identity)
    assert service["hosting"] == {"threads": 1} and processes["hosting"] == {"processes": 1}
    assert processes["rows"] == service["rows"]
    assert "--hosting processes" in processes["command"]
    assert "1 cell one OS process per participant" in (processes_out / "table.md").read_text()

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
    assert "1 cell as virtual participants, threads of the cell's process" in table
    assert "| FedAvg | +FFC |" in table and "| FedUV |" not in table
    (cell,) = (tmp_path / "service" / "cells").glob("*.json")
    record = json.loads(cell.read_text())
    assert record["engine"] == "service" and record["service"]["bytes"]
    assert record["service"]["hosting"] == "threads"
    capsys.readouterr()

    # a rerun reuses the finished cell, whatever the hosting: no federation is started
    def boom(*_a: Any, **_k: Any) -> dict[str, Any]:
        raise AssertionError("a finished service cell was run again")

    monkeypatch.setattr(cells_module, "train_cell_as_service", boom)
    rerun = [*ARGS, "--engine", "service", "--hosting", "processes"]
    assert main([*rerun, "--out", str(tmp_path / "service")]) == 0
    again = json.loads((tmp_path / "service" / "results.json").read_text())
    assert again["rows"] == service["rows"] and again["timings"]["cells_cached"] == 1
    assert again["hosting"] == {"threads": 1}  # what made the reused cell


def test_service_engine_refuses_what_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["experiment", "--table", "methods", "--engine", "service", "--dataset", "synthetic",
         "--synthetic-dim", "6", "--out", "x"]
    )  # fmt: skip
    assert code == 2 and "default synthetic" in capsys.readouterr().err
