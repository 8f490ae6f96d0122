"""``spherecal experiment --table privacy`` end to end on a tiny grid (issue #25): every
cell runs, the outputs are written, a rerun reuses every cell, σ is the smallest the
accountant allows and equals Opacus's accounting, the gate never ships below the
uncalibrated model, and bad settings are refused before anything runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spherecal.cli.app import build_parser
from spherecal.cli.experiment import privacy_settings_from_args
from spherecal.experiment.privacy import PrivacyCell, PrivacySettings, privacy_cells
from spherecal.experiment.privacy_report import run_privacy_table
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan

TINY = PrivacySettings(
    samples=700,
    participants=3,
    seeds=1,
    epsilons=(4.0,),
    release_epsilons=(4.0,),
    steps=2,
    local_rounds=1,
    calibration_rounds=1,
    repeats=1,
)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    out = tmp_path_factory.mktemp("privacy-table")
    report = run_privacy_table(TINY, out, plots=True)
    return out, report


@pytest.mark.long  # the tiny grid trains five cells (tens of seconds)
def test_every_cell_runs_and_the_outputs_are_written(
    table: tuple[Path, dict[str, object]],
) -> None:
    out, report = table
    assert {p.name for p in out.iterdir()} >= {
        "table.md",
        "results.json",
        "dpsgd_accuracy.png",
        "dp_calibration.png",
        "cells",
    }
    cells = privacy_cells(TINY)
    assert len(cells) == 1 + 3 + 1  # non-private, three private methods at one ε, calibration
    assert sorted(p.name for p in (out / "cells").iterdir()) == sorted(
        f"{c.key(TINY)}.json" for c in cells
    )
    doc = json.loads((out / "results.json").read_text())
    assert doc["settings"]["steps"] == 2 and doc["dpsgd"]["distributed"]["4"]["values"]
    text = (out / "table.md").read_text()
    for row in ("local DP-SGD", "distributed DP-SGD", "central DP-SGD", "non-private"):
        assert row in text
    assert "| service |" in text and "## DP CCVR" in text and "## Comparisons" in text
    assert report["timings"]["cells_run"] == len(cells)  # type: ignore[index]


@pytest.mark.long  # the tiny grid trains five cells (tens of seconds)
def test_a_rerun_reuses_every_cell(table: tuple[Path, dict[str, object]]) -> None:
    out, report = table
    again = run_privacy_table(TINY, out, plots=False)
    assert again["timings"]["cells_run"] == 0
    assert again["timings"]["cells_cached"] == len(privacy_cells(TINY))
    assert again["dpsgd"] == report["dpsgd"] and again["calibration"] == report["calibration"]


@pytest.mark.long  # the tiny grid trains five cells (tens of seconds)
def test_sigma_is_the_smallest_within_epsilon_and_matches_opacus(
    table: tuple[Path, dict[str, object]],
) -> None:
    out, _ = table
    record = json.loads(
        (out / "cells" / f"{PrivacyCell('central', 0, 4.0).key(TINY)}.json").read_text()
    )
    sigma = record["sigma"]

    def charged(s: float) -> float:
        return DistributedDpsgdPlan(s, 0.1, 1.0, TINY.participants).charge(2, 1e-5).epsilon

    assert charged(sigma) <= 4.0 < charged(sigma / 1.003)
    # the project's accountant and Opacus's own, for the same (σ, q, steps)
    assert record["opacus_epsilon"] == pytest.approx(record["epsilon_charged"], abs=1e-6)


@pytest.mark.long  # the tiny grid trains five cells (tens of seconds)
def test_the_shipped_head_is_never_below_the_uncalibrated_model(
    table: tuple[Path, dict[str, object]],
) -> None:
    _, report = table
    comparisons = report["comparisons"]
    assert comparisons["gate_worst_validation_margin"] >= 0  # type: ignore[index]
    assert comparisons["accounting_max_difference"] <= 1e-6  # type: ignore[index]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        replace(TINY, epsilons=(0.0,))
    with pytest.raises(ValueError, match="min_contributors"):
        replace(TINY, min_contributors=4)
    args = build_parser().parse_args(
        ["experiment", "--table", "privacy", "--alpha", "iid", "--out", "/nonexistent"]
    )
    with pytest.raises(ValueError, match="Dirichlet"):
        privacy_settings_from_args(args)


def test_the_command_line_reaches_the_settings() -> None:
    args = build_parser().parse_args(
        [
            "experiment",
            "--table",
            "privacy",
            "--quick",
            "--seeds",
            "2",
            "--dpsgd-steps",
            "7",
            "--epsilons",
            "2",
            "3",
            "--out",
            "/nonexistent",
        ]
    )
    s = privacy_settings_from_args(args)
    assert (s.dataset, s.seeds, s.steps, s.epsilons) == ("mnist1d", 2, 7, (2.0, 3.0))
    assert s.local_rounds == 1 and s.release_epsilons == (1.0, 4.0, 16.0)
    args.local_rounds = 4
    assert privacy_settings_from_args(args).local_rounds == 4
