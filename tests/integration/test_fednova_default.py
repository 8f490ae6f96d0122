"""The issue's own command (issue #23, item 11): ``spherecal simulate --participants 3
--rounds 2 --algorithm fednova --calibration ffc`` — every site withdrew with ``1 of
158563 entries are outside the declared bound`` and the run failed. FedNova's ``tau``
now travels at a power-of-two scale that follows ``max_examples_per_site``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spherecal.cli.app import main as cli_main

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]


def test_fednova_with_three_sites_completes_by_default(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["simulate", "--participants", "3", "--rounds", "2", "--algorithm", "fednova"]
    code = cli_main([*argv, "--calibration", "ffc", "--out", str(out), "--quiet"])
    results = json.loads((out / "results.json").read_text())
    assert code == 0 and results["status"] == "completed", results["status_reasons"]
    assert [m["contributors"] for m in results["per_round"]] == [["p0", "p1", "p2"]] * 2
    logs = "".join(p.read_text() for p in (out / "logs").glob("*.log"))
    assert "outside the declared bound" not in logs
    assert results["accuracy"]["ffc"] is not None


def test_a_round_lost_to_refusals_names_the_refusal_not_the_quorum(tmp_path: Path) -> None:
    """Issue #23: the reason named ``TooFewSurvivors … only 0 remained`` (the symptom);
    it now names each site's own refusal (the first cause). Every site's update is
    outside the bound, a refusal that depends on its data: each answers at the job's
    masked step and that counts as its update for the round, so the retries meet
    ``RULE_RELEASE_REPEATED``, the round is lost and the run ``degraded`` — its reason
    naming the first attempt's cause, not the repeated refusals."""
    out = tmp_path / "run"
    argv = ["simulate", "--participants", "3", "--rounds", "1", "--update-bound", "1"]
    cli_main([*argv, "--calibration", "ffc", "--out", str(out), "--quiet"])
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "degraded"
    assert [m["status"] for m in results["per_round"]] == ["lost"]
    (lost,) = [r for r in results["status_reasons"] if r.startswith("round 1 lost")]
    assert "RULE_RELEASE_REPEATED" in lost
    _, _, first = lost.partition("first attempt: ")
    symptom, _, cause = first.partition(" — first cause: ")
    assert "TooFewSurvivors" in symptom
    # sites giving the same reason are named together ("p0, p2 withdrew at ...")
    groups = re.findall(
        r"((?:p\d+, )*p\d+) withdrew at masked: BAD_INPUT: this site withholds its input", cause
    )
    assert sorted(p for g in groups for p in g.split(", ")) == ["p0", "p1", "p2"], cause
    # the site's own numbers stay in its log; the coordinator gets the fixed sentence
    assert "outside the job's declared bound or not finite" in cause
    logs = "".join(p.read_text() for p in (out / "logs").glob("p*.log"))
    assert "outside the declared bound |x| <= 1.0" in logs
    # every site is told the end, never its reasons: they name the other sites and
    # what they withheld (a bit of each one's data, charged to the coordinator alone)
    for log in sorted((out / "logs").glob("p*.log")):
        (told,) = [line for line in log.read_text().splitlines() if "coordinator says done" in line]
        assert told.endswith(
            "coordinator says done (degraded): federation degraded; its reasons are in the "
            "coordinator's status and summary (its operator's view)"
        ), told


def test_rounds_lost_in_a_row_fail_the_run(tmp_path: Path) -> None:
    """The model does not move in a lost round, so the next meets the same cause:
    ``[training] max_lost_rounds_in_a_row`` (3) lost rounds end the run ``failed``,
    naming the first attempt's cause, instead of spending every remaining round."""
    out = tmp_path / "run"
    argv = ["simulate", "--participants", "3", "--rounds", "5", "--update-bound", "1"]
    assert cli_main([*argv, "--calibration", "ffc", "--out", str(out), "--quiet"]) == 1
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "failed"
    (reason,) = results["status_reasons"]
    assert reason.startswith("3 rounds lost in a row"), reason
    assert "the model has not moved since round 1" in reason
    assert "withdrew at masked: BAD_INPUT: this site withholds its input" in reason
