"""``spherecal report``: the run drawn from its results alone, self-contained (issue #23).

The charts are checked against the numbers they draw: every point and bar is placed
by an independent computation of the same axes here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import pytest

from spherecal.cli.app import main as cli_main
from spherecal.coordinator.driver.outputs import round_history
from spherecal.coordinator.summary_schema import RoundMetrics
from spherecal.run_report import (
    BOTTOM,
    HEIGHT,
    TOP,
    ReportError,
    RunDocument,
    load_run,
    render_run_report,
    site_contributions,
)


def _per_round() -> list[RoundMetrics]:
    return cast(
        list[RoundMetrics],
        [
            {
                "round": 1,
                "contributors": ["a", "b", "c"],
                "train_loss": 0.8,
                "federated_accuracy": 0.5,
                "test_accuracy": None,
                "seconds": 2.0,
            },
            {
                "round": 2,
                "contributors": ["a", "c"],
                "train_loss": 0.4,
                "federated_accuracy": None,  # not evaluated this round
                "test_accuracy": None,
                "seconds": 1.5,
            },
            {
                "round": 3,
                "contributors": ["a", "b", "c"],
                "train_loss": 0.2,
                "federated_accuracy": 0.75,
                "test_accuracy": None,
                "seconds": 1.0,
            },
        ],
    )


def _summary() -> RunDocument:
    """A coordinator's summary as an older version wrote it (no ``missing`` in
    ``accuracy_covers``), held to the reader's declared shape."""
    per_round = _per_round()
    document: dict[str, Any] = {
        "schema": "spherecal.coordinator-summary/1",
        "federation_id": "f00dfeed",
        "status": "completed",
        "status_reasons": [],
        "settings": {"name": "hospitals<&>", "participants": ["a", "b", "c"], "rounds": 3},
        "accuracy": {"none": 0.5, "ffc": 0.75, "ccvr": None},
        "accuracy_covers": {"participants": 3, "of": 3, "test_samples": 120},
        "per_round": per_round,
        "history": round_history(per_round),
        "bytes": {
            "a": {"total": {"sent": 10, "received": 3_000_000}},
            "b": {"total": {"sent": 10, "received": 2_000_000}},
            "c": {"total": {"sent": 10, "received": 3_000_000}},
        },
    }
    return cast(RunDocument, document)


def _y(value: float, lo: float, hi: float) -> float:
    plot_h = HEIGHT - TOP - BOTTOM
    return TOP + plot_h * (1 - (value - lo) / (hi - lo))


def test_history_rows_are_the_per_round_numbers() -> None:
    rows = round_history(_per_round())
    assert rows[1] == {
        "round": 2,
        "train_loss": 0.4,
        "federated_accuracy": None,
        "test_accuracy": None,
        "contributors": 2,
        "seconds": 1.5,
    }
    assert [r["contributors"] for r in rows] == [3, 2, 3]


def test_page_is_self_contained_and_escaped() -> None:
    page = render_run_report(_summary())
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", page)
    assert "hospitals&lt;&amp;&gt;" in page and "hospitals<&>" not in page
    assert 'id="status">completed<' in page


def test_accuracy_chart_skips_rounds_not_evaluated_and_places_points_exactly() -> None:
    page = render_run_report(_summary())
    figure = page[
        page.index('<figure id="accuracy">') : page.index(
            "</figure>", page.index('<figure id="accuracy">')
        )
    ]
    polylines = re.findall(
        r'<polyline class="series" data-series="([^"]+)" points="([^"]+)"', figure
    )
    assert [name for name, _ in polylines] == ["federated accuracy"]  # no central split
    points = [tuple(map(float, p.split(","))) for p in polylines[0][1].split()]
    assert len(points) == 2  # rounds 1 and 3; round 2 was not evaluated
    assert [round(y, 1) for _, y in points] == [round(_y(v, 0.0, 1.0), 1) for v in (0.5, 0.75)]
    assert points[0][0] < points[1][0]


def test_loss_chart_has_every_round() -> None:
    page = render_run_report(_summary())
    figure = page[page.index('<figure id="loss">') :]
    points = re.search(r'data-series="training loss" points="([^"]+)"', figure)
    assert points is not None and len(points.group(1).split()) == 3


def test_calibration_bars_before_and_after_per_method() -> None:
    page = render_run_report(_summary())
    bars = re.findall(
        r'<rect class="bar" data-group="([^"]+)" data-key="([^"]+)" x="[\d.]+" y="([\d.]+)"',
        page,
    )
    calibration = [(g, k, float(y)) for g, k, y in bars if g in ("ffc", "ccvr")]
    # ccvr measured nothing: no bars for it; ffc: before 0.5 and after 0.75
    assert [(g, k) for g, k, _ in calibration] == [("ffc", "before (none)"), ("ffc", "after")]
    assert [round(y, 1) for _, _, y in calibration] == [
        round(_y(v, 0.0, 1.0), 1) for v in (0.5, 0.75)
    ]


def test_site_contributions_count_rounds_and_uploads() -> None:
    sites = site_contributions(_summary())
    assert sites == [
        {"site": "a", "rounds": 3, "uploaded_bytes": 3_000_000},
        {"site": "b", "rounds": 2, "uploaded_bytes": 2_000_000},
        {"site": "c", "rounds": 3, "uploaded_bytes": 3_000_000},
    ]
    page = render_run_report(_summary())
    rounds = re.findall(
        r'data-group="([abc])" data-key="rounds" x="[\d.]+" y="[\d.]+" '
        r'width="[\d.]+" height="([\d.]+)"',
        page,
    )
    heights = {g: float(h) for g, h in rounds}
    assert heights["a"] == pytest.approx(heights["c"]) and heights["b"] == pytest.approx(
        heights["a"] * 2 / 3, rel=1e-2
    )


def test_a_run_without_history_is_drawn_from_per_round(tmp_path: Path) -> None:
    old = _summary()
    del old["history"]
    assert render_run_report(old) == render_run_report(_summary())


def test_cli_writes_the_page_and_refuses_a_directory_without_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(_summary()))
    assert cli_main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["report", str(empty)]) == 2
    assert "no results.json or summary.json" in capsys.readouterr().err
    (empty / "results.json").write_text("[1, 2]")
    with pytest.raises(ReportError):
        load_run(empty)
