"""``bench/ffc_stage.py --summarise``: several invocations of the FFC-stage benchmark
read both ways issue #24's target can be read (every pair, or the ratio of medians),
and pooled (no federation runs here: the reports are written by hand)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from bench.ffc_stage import main, summarise


def report(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """An invocation's report: (secure s, plaintext s) per pair, in alternating order
    as :func:`bench.ffc_stage.measure` runs them."""
    runs = []
    for k, (secure, plain) in enumerate(pairs):
        both = [
            {"mode": "secure", "statistics_ffc_s": secure},
            {"mode": "plaintext", "statistics_ffc_s": plain},
        ]
        runs += both if k % 2 == 0 else both[::-1]
    return {"runs": runs}


A = [(1.2, 1.0), (1.1, 1.0), (1.3, 1.0)]  # pairs 1.2, 1.1, 1.3: one over the target
B = [(0.9, 0.8), (1.0, 0.9), (1.0, 1.0)]  # 1.125, 1.111, 1.0: all within


def test_both_readings_and_the_pooled_ratio() -> None:
    got = summarise([report(A), report(B)], resamples=500)
    assert got["invocations"] == 2 and got["pairs"] == 6
    assert got["pairs_within_target"] == 5
    assert got["invocations_every_pair_within_target"] == 1  # B only
    # A: median secure 1.2 / median plaintext 1.0; B: 1.0 / 0.9
    assert got["ratio_of_medians_per_invocation"] == [1.2, round(1.0 / 0.9, 4)]
    assert got["invocations_ratio_of_medians_within_target"] == 2
    ratios = [s / p for s, p in A + B]
    assert got["median_pair_ratio"] == round(statistics.median(ratios), 4)
    secure = [s for s, _ in A + B]
    plain = [p for _, p in A + B]
    pooled = statistics.median(secure) / statistics.median(plain)
    assert got["pooled_ratio_of_medians"] == round(pooled, 4)
    low, high = got["pooled_ratio_of_medians_95"]
    assert min(ratios) <= low <= pooled <= high <= max(s for s in secure) / min(plain)


def test_the_interval_is_seeded() -> None:
    reports = [report(A), report(B)]
    assert summarise(reports, seed=3) == summarise(reports, seed=3)


@pytest.mark.parametrize(
    ("reports", "message"),
    [
        ([], "no reports"),
        ([{"runs": report(A)["runs"][:-1]}], "do not come in pairs"),
        (
            [{"runs": [{"mode": "secure", "statistics_ffc_s": 1.0}] * 2}],
            "not one secure and one plaintext",
        ),
    ],
)
def test_reports_that_cannot_be_pooled_are_refused(
    reports: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        summarise(reports)


def test_the_option_reads_files_and_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for name, pairs in (("a.json", A), ("b.json", B)):
        files.append(tmp_path / name)
        files[-1].write_text(json.dumps(report(pairs)))
    out = tmp_path / "summary.json"
    assert main(["--summarise", *map(str, files), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["pairs"] == 6
    assert json.loads(capsys.readouterr().out)["invocations"] == 2
    with pytest.raises(SystemExit, match="--summarise: .*missing.json"):
        main(["--summarise", str(tmp_path / "missing.json")])
    (tmp_path / "summary.json").write_text('{"what": "a table", "invocations": 3}')
    with pytest.raises(SystemExit, match="summary.json is not a report of this benchmark"):
        main(["--summarise", str(tmp_path / "summary.json")])
    (tmp_path / "bad.json").write_text('{"runs": [{"mode": "secure"}, {"mode": "plaintext"}]}')
    with pytest.raises(SystemExit, match="runs cannot be read: KeyError"):
        main(["--summarise", str(tmp_path / "bad.json")])
