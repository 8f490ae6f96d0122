"""``spherecal experiment``: grid, selection on validation, outputs, resumability."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, cast

import pytest

import spherecal.experiment.cells as cells_module
from spherecal.cli.app import main
from spherecal.cli.experiment import settings_from_args
from spherecal.experiment import RunSpec, grid_runs, make_columns
from spherecal.experiment.markdown import render_markdown
from spherecal.experiment.plots import gain_panels, method_colors
from spherecal.experiment.selection import select
from spherecal.results_schema import CellRecord, ExperimentResults
from spherecal.spherefed.algorithms import get_method
from tests.fresh_process import in_fresh_process

TINY_ARGS = [
    "--dataset",
    "synthetic",
    "--synthetic-classes",
    "3",
    "--synthetic-dim",
    "6",
    "--synthetic-per-class",
    "16",
    "--participants",
    "2",
    "--rounds",
    "2",
    "--local-epochs",
    "1",
    "--seeds",
    "1",
    "--lr-grid",
    "0.03",
    "0.1",
    "--quiet",
    "--no-plots",
]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _run(tmp: Path, *extra: str) -> int:
    return main(["experiment", *extra, *TINY_ARGS, "--out", str(tmp)])


def test_methods_table_outputs_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--table", "methods", "--methods", "fedavg", "spherefed", "--alpha", "0.5", "iid")
    assert _run(tmp_path, *args) == 0
    cells = sorted((tmp_path / "cells").glob("*.json"))
    assert len(cells) == 2 * 2 * 2  # methods × lrs × columns
    table = (tmp_path / "table.md").read_text()
    for label in (
        "| FedAvg | none |",
        "| FedAvg | +CCVR |",
        "| SphereFed | +FFC |",
        "α=0.5",
        "IID",
    ):
        assert label in table
    assert "**" in table  # a best value per column is bold
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["schema"] == "spherecal.experiment/1" and results["table"] == "methods"
    assert [c["key"] for c in results["settings"]["columns"]] == ["a0.5", "iid"]
    assert len(results["rows"]) == 2 * 3
    row = results["rows"][0]
    assert row["method"] == "fedavg" and row["calibration"] == "none"
    seed0 = row["columns"]["a0.5"]["per_seed"][0]
    assert seed0["lr"] in (0.03, 0.1) and 0.0 <= seed0["test"] <= 1.0
    assert set(results["calibration"]["spherefed"]["iid"]) >= {"none", "ccvr_gain", "ffc_gain"}
    assert len(results["curves"]["fedavg"]["a0.5"]["mean"]) == 2
    assert len(results["lr_sweep"]["fedavg"]["iid"]) == 2
    assert "--lr-grid 0.03 0.1" in results["command"]
    capsys.readouterr()

    # rerun: every cell is reused, nothing trains
    def boom(*_a: Any, **_k: Any) -> dict[str, Any]:
        raise AssertionError("a finished cell was run again")

    monkeypatch.setattr(cells_module, "execute_run", boom)
    assert _run(tmp_path, *args) == 0
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["rows"] == results["rows"]
    assert again["timings"]["cells_run"] == 0 and again["timings"]["cells_cached"] == 8

    # a lost cell (e.g. the run was killed) is the only one rerun
    calls: list[str] = []
    monkeypatch.undo()
    real = cells_module.execute_run

    def counting(spec: RunSpec, base: Any) -> CellRecord:
        calls.append(spec.label())
        return real(spec, base)

    monkeypatch.setattr(cells_module, "execute_run", counting)
    cells[3].unlink()
    (tmp_path / "cells" / cells[5].name).write_text("{truncated")
    assert _run(tmp_path, *args) == 0
    assert len(calls) == 2
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == results["rows"]


def test_calibration_table_adds_oracle_reruns(tmp_path: Path) -> None:
    assert _run(tmp_path, "--table", "calibration", "--methods", "fedavg", "--alpha", "0.5") == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [m["key"] for m in results["methods"]] == ["fedavg"]
    g = results["calibration"]["fedavg"]["a0.5"]
    assert "oracle_gain" in g and g["per_seed"][0].get("oracle_cell")
    assert gain_panels(results) == ["ccvr", "ffc", "oracle"]  # the oracle is plotted too
    assert len(list((tmp_path / "cells").glob("*.json"))) == 2 + 1  # grid + one oracle re-run
    assert "| FedAvg |" in (tmp_path / "table.md").read_text()


def test_ablation_table_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    args = [a for a in TINY_ARGS if a != "--no-plots"]
    code = main(
        ["experiment", "--table", "ablation", "--methods", "mse_fix_ou_norm", "ce_fix_r",
         "--alpha", "0.5", *args, "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    table = (tmp_path / "table.md").read_text()
    assert "MSE + Fix (OU) + Norm" in table and "α=0.5 +FFC" in table
    for png in ("accuracy_per_round.png", "calibration_gain.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_selection_uses_validation_and_skips_divergence() -> None:
    m = get_method("fedavg")
    col = make_columns([0.5])[0]

    def rec(val: float | None, test: float) -> CellRecord:
        if val is None:
            return cast(CellRecord, {"diverged": True})
        return cast(CellRecord, {"validation_accuracy": {"none": val}, "accuracy": {"none": test}})

    cands = [
        (RunSpec(m, col, 0, 0.01, 1.0), rec(0.8, 0.99)),
        (RunSpec(m, col, 0, 0.1, 1.0), rec(0.9, 0.5)),
        (RunSpec(m, col, 0, 0.3, 1.0), rec(0.9, 0.7)),
        (RunSpec(m, col, 0, 1.0, 1.0), rec(None, 0.0)),
    ]
    pick = select(cands, "none")
    assert pick is not None and pick[0].lr == 0.1  # best validation, tie → smaller lr
    assert select(cands[3:], "none") is None


def test_grid_and_quick_settings() -> None:
    parser = __import__("spherecal.cli.app").cli.app.build_parser()
    args = parser.parse_args(["experiment", "--table", "methods", "--quick", "--out", "x"])
    s = settings_from_args(args)
    assert s.seeds == 1 and s.rounds == 15 and s.lr_grid == (0.01, 0.1, 1.0)
    assert [c.label for c in s.columns] == ["α=0.1", "α=0.5", "IID"]
    runs = grid_runs(s)
    assert len(runs) == 11 * 3 * 3  # methods × lrs × columns (one seed)
    keys = {r.key(s.base_config()) for r in runs}
    assert len(keys) == len(runs)
    full = settings_from_args(
        parser.parse_args(["experiment", "--table", "ablation", "--out", "x"])
    )
    assert full.seeds == 3 and full.rounds == 30 and full.lr_grid is None
    shards = settings_from_args(
        parser.parse_args(["experiment", "--table", "methods", "--shards", "2", "--out", "x"])
    )
    assert [c.key for c in shards.columns] == ["s2"]


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["experiment", "--table", "nope", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert main(["experiment", "--table", "methods", "--methods", "fedsgd", "--out", "x"]) == 2
    assert "fedsgd" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["experiment", "--table", "methods", "--alpha", "0", "--out", "x"])


def test_markdown_marks_divergence() -> None:
    report = {
        "table": "methods",
        "command": "c",
        "settings": {
            "dataset": "digits",
            "seeds": [0, 1],
            "columns": [{"key": "a1", "label": "α=1"}],
            "base_config": {
                "participants": 2,
                "rounds": 1,
                "local_epochs": 1,
                "batch_size": 8,
                "momentum": 0.9,
                "model": "mlp",
            },
            "lr_grids": {"fedavg": [0.1]},
            "temperature_grids": {"fedavg": [1.0]},
        },
        "methods": [{"key": "fedavg", "label": "FedAvg"}],
        "rows": [
            {
                "method": "fedavg",
                "label": "FedAvg",
                "calibration": "none",
                "columns": {
                    "a1": {
                        "mean": 0.5,
                        "std": 0.0,
                        "n": 1,
                        "diverged_seeds": 1,
                        "lr_grid": [0.1],
                        "per_seed": [{"seed": 0, "lr": 0.1}, {"seed": 1, "diverged": True}],
                    }
                },
            }
        ],
        "environment": {"workers": 1, "threads": 1},
    }
    md = render_markdown(cast(ExperimentResults, report))  # the parts the table reads
    assert "**50.0 (†1)**" in md and "0.1, ×" in md


@pytest.mark.long
def test_parallel_workers_give_the_serial_numbers(tmp_path: Path) -> None:
    args = ("--table", "methods", "--methods", "fedavg", "--alpha", "0.5")
    assert _run(tmp_path / "serial", *args) == 0
    code = main(["experiment", *args, *TINY_ARGS, "--workers", "2", "--out", str(tmp_path / "par")])
    assert code == 0
    serial = json.loads((tmp_path / "serial" / "results.json").read_text())
    parallel = json.loads((tmp_path / "par" / "results.json").read_text())
    assert parallel["rows"] == serial["rows"]
    assert parallel["environment"]["workers"] == 2


def test_calibration_table_with_one_lr_has_every_calibrator_and_no_reruns(tmp_path: Path) -> None:
    args = [a for a in TINY_ARGS if a not in ("0.03",)]  # --lr-grid 0.1 only
    code = main(
        ["experiment", "--table", "calibration", "--methods", "fedavg_spherefed", "--alpha",
         "0.5", *args, "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    assert len(list((tmp_path / "cells").glob("*.json"))) == 1  # the oracle ran in the grid run
    results = json.loads((tmp_path / "results.json").read_text())
    g = results["calibration"]["fedavg_spherefed"]["a0.5"]
    for cal in ("ffc", "ffc_bias", "ccvr", "lda", "qda"):
        assert f"{cal}_gain" in g and f"{cal}_gap" in g
        gap = g["oracle"]["mean"] - g[cal]["mean"]
        assert g[f"{cal}_gap"]["mean"] == pytest.approx(gap, abs=2e-6)  # JSON keeps 6 decimals
    assert set(g["per_seed"][0]["chosen"]) == {"ffc_bias", "lda", "qda"}
    table = (tmp_path / "table.md").read_text()
    for row in ("| +FFC+bias |", "| +LDA |", "| +QDA |", "| oracle |"):
        assert row in table


def test_methods_get_distinct_colours_and_help_shows_real_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("matplotlib")
    colours = method_colors(18)
    assert len(set(colours)) == 18  # the 11 methods of the methods table and more
    with pytest.raises(SystemExit):
        main(["experiment", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default 3)" in text
    assert "(default: 10)" in text  # --participants: a real default is still shown


@pytest.mark.slow
@pytest.mark.long
def test_ray_cells_give_the_serial_numbers_and_are_cached(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    args = ("--table", "methods", "--methods", "fedavg", "--alpha", "0.5")
    assert _run(tmp_path / "serial", *args) == 0
    cells = tmp_path / "ray-cells"
    # in a process of its own, not this worker: Ray's process starts (tests/fresh_process.py)
    code = in_fresh_process(
        main,
        [
            "experiment",
            *args,
            *TINY_ARGS,
            "--ray",
            "--cells",
            str(cells),
            "--out",
            str(tmp_path / "ray"),
        ],
    )
    assert code == 0
    serial = json.loads((tmp_path / "serial" / "results.json").read_text())
    on_ray = json.loads((tmp_path / "ray" / "results.json").read_text())
    assert on_ray["rows"] == serial["rows"]
    assert len(list(cells.glob("*.json"))) == on_ray["timings"]["cells_run"] > 0


def test_service_hosting_setting_and_identity() -> None:
    """``--hosting`` picks where a service cell's participants run; it is checked,
    reaches every cell, and leaves the cell's identity alone (same numbers)."""
    from dataclasses import replace

    from spherecal.experiment.grid import ExperimentSettings

    parser = __import__("spherecal.cli.app").cli.app.build_parser()
    base = ["experiment", "--table", "methods", "--engine", "service", "--out", "x"]
    s = settings_from_args(parser.parse_args(base))
    assert s.hosting == "threads"
    p = settings_from_args(parser.parse_args([*base, "--hosting", "processes"]))
    assert p.hosting == "processes" and p.to_json()["hosting"] == "processes"
    assert {r.hosting for r in grid_runs(p)} == {"processes"}
    threads, processes = grid_runs(s), grid_runs(p)
    assert [r.key(s.base_config()) for r in threads] == [r.key(p.base_config()) for r in processes]
    assert "hosting" not in replace(s, engine="inprocess").to_json()
    with pytest.raises(ValueError, match="unknown hosting"):
        ExperimentSettings(engine="service", hosting="fibres")
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--hosting", "fibres"])


def test_hosting_counts_and_engine_line() -> None:
    """The table says how many cells ran their participants which way; a cell made
    before the hosting was recorded ran one process per participant."""
    from spherecal.experiment.grid import ExperimentSettings
    from spherecal.experiment.markdown import engine_line
    from spherecal.experiment.report import _hosting_counts

    s = ExperimentSettings(
        engine="service", methods=("fedavg",), alphas=(0.1,), seeds=1, lr_grid=(0.01, 0.1, 1.0)
    )
    specs = grid_runs(s)
    base = s.base_config()
    keys = [r.key(base) for r in specs]
    assert len(set(keys)) == 3
    records: dict[str, Any] = {
        keys[0]: {"engine": "service", "service": {"hosting": "threads"}},
        keys[1]: {"engine": "service", "diverged": True, "service": {"hosting": "threads"}},
        keys[2]: {"engine": "service"},  # made before hostings were recorded
        "stray": {"engine": "service", "service": {"hosting": "threads"}},
    }
    counts = _hosting_counts(  # duplicates count once
        [*specs, specs[0]], cast(dict[str, CellRecord], records), base
    )
    assert counts == {"threads": 2, "processes": 1}
    line = engine_line("service", counts)
    assert line.startswith("Engine: **service**")
    assert "1 cell one OS process per participant" in line
    assert "2 cells as virtual participants, threads of the cell's process" in line
    assert "hosted" not in engine_line("inprocess")


def test_a_secure_sum_cell_names_its_bound_rule() -> None:
    """The secure sum's fixed-point scale follows its bound's rule (since 2026-11-26 the
    data's, before a fixed 1e6): it is part of a ``--secure-sum`` cell's identity, so a
    cell summed under another rule is recomputed, never reused; float cells keep their
    keys."""
    from spherecal.experiment.grid import ExperimentSettings
    from spherecal.spherefed.privacy.secure_sum import BOUND_RULE

    def first(secure_sum: bool) -> tuple[dict[str, Any], str]:
        s = ExperimentSettings(methods=("fedavg",), alphas=(0.1,), seeds=1, secure_sum=secure_sum)
        spec, base = grid_runs(s)[0], s.base_config()
        return dict(spec.identity(base)), spec.key(base)

    (secure, key), (plain, _) = first(True), first(False)
    assert secure["secure_sum_bound"] == BOUND_RULE == "statistics_entry_bound"
    assert "secure_sum_bound" not in plain
    del secure["secure_sum_bound"]  # a cell made under the earlier rule had no such entry
    old_key = hashlib.sha256(json.dumps(secure, sort_keys=True, default=str).encode()).hexdigest()
    assert old_key[:20] != key


@pytest.mark.slow
def test_secure_sum_table_says_so_and_matches_the_float_sum(tmp_path: Path) -> None:
    args = [a for a in TINY_ARGS if a not in ("0.03",)]  # --lr-grid 0.1 only
    args[args.index("--participants") + 1] = "3"  # the secure sum's minimum
    base = ["experiment", "--table", "calibration", "--methods", "fedavg_spherefed",
            "--alpha", "0.5", *args]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "float")]) == 0
    assert main([*base, "--secure-sum", "--out", str(tmp_path / "secure")]) == 0
    plain = json.loads((tmp_path / "float" / "results.json").read_text())
    secure = json.loads((tmp_path / "secure" / "results.json").read_text())
    assert "secure_sum" not in plain["settings"] and secure["settings"]["secure_sum"] is True
    assert "--secure-sum" in secure["command"] and "--secure-sum" not in plain["command"]
    table = (tmp_path / "secure" / "table.md").read_text()
    assert "through secure aggregation" in table
    assert "through secure aggregation" not in (tmp_path / "float" / "table.md").read_text()
    a = plain["calibration"]["fedavg_spherefed"]["a0.5"]["per_seed"][0]
    b = secure["calibration"]["fedavg_spherefed"]["a0.5"]["per_seed"][0]
    assert a["cell"] != b["cell"]  # a different computation: never reused for the other
    # the fixed-point ring moves no prediction of the well-posed calibrators ...
    for name in ("none", "ffc", "ccvr", "ffc_bias", "oracle"):
        assert a["test"][name] == b["test"][name], name
    assert a["chosen"] == b["chosen"]
    # ... but LDA/QDA at shrinkage 0 invert this tiny run's singular covariance (about
    # 40 training samples, l = 128: 88 eigenvalues are 0 in float64 and ±3e-10 after
    # the ring's rounding, both above the 1e-12 relative floor): there the two sums
    # may disagree, and only validity is asserted.
    for name in ("lda", "qda"):
        assert 0.0 <= b["test"][name] <= 1.0
    assert main(["experiment", "--table", "methods", "--engine", "service", "--secure-sum",
                 "--out", str(tmp_path / "x")]) == 2  # fmt: skip
