"""A sum over fewer sites than the calibration minimum is kept, not thrown away —
real processes, real secure aggregation, real release ledgers.

Found on 2026-11-27: with ``[calibration] min_participants = 4`` and one of four sites
killed in the middle of its FFC upload, the FFC job summed the other three. The
coordinator threw that sum away to retry for four — but each of the three had spent
its one release of these moments on it (``participant.release_ledger``) and refused
the retry (``RULE_RELEASE_REPEATED``), so the federation ended with *no* FFC head, and
the final evaluation, repeated the same way, with no accuracy at all. Now the short
sum is kept (the status says it is short), a retry is made only when the sites that
have not released could sum more, and the widest result stands.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from spherecal.coordinator.driver.ffc_ccvr_heads import ffc_classifier
from spherecal.coordinator.driver.halts import HALT_MARKER
from spherecal.participant.faults import HaltPoint
from spherecal.simulate import Drop, SimulationSettings, clear_statistics, run_simulation
from spherecal.spherefed.stats import FFCStatistics

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

SURVIVORS = ["p0", "p1", "p2"]


@pytest.fixture(scope="module")
def short_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], SimulationSettings]:
    from spherecal.spherefed.reference import ReferenceConfig

    settings = SimulationSettings(
        reference=ReferenceConfig(participants=4, model="mlp", rounds=1),
        out=tmp_path_factory.mktemp("short"),
        calibration=("ffc",),
        threshold=3,
        drops=(Drop("p3", HaltPoint("masked", "ffc")),),
        timeout_s=240,
        rejoin_grace_s=1.0,  # p3 never comes back: do not wait the default minute
        extra_coordinator={"calibration": {"min_participants": 4}},
    )
    return dict[str, Any](run_simulation(settings)), settings


def test_the_short_sum_becomes_the_head_and_the_status_says_it_is_short(
    short_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, settings = short_run
    assert results["drops_not_triggered"] == []
    assert results["status"] == "degraded", results["errors"]
    statistics, evaluation = results["status_reasons"]
    assert statistics == "ffc statistics summed 3 participants (minimum 4); missing ['p3']"
    assert evaluation.startswith("the final evaluation covered 3 participants")
    # one FFC job: the three that summed were not asked again, nor was anyone else
    ffc_jobs = [j for j in results["jobs"] if j["purpose"] == "ffc"]
    assert [j["contributors"] for j in ffc_jobs] == [SURVIVORS]
    assert results["retries"]["count"] == 0
    assert results["statistics"]["ffc"]["contributors"] == SURVIVORS
    # the head is the exact solve of the three sites' statistics
    heads = torch.load(results["models"]["classifiers"]["path"], weights_only=True)
    clear = clear_statistics(settings, SURVIVORS, "ffc")
    assert isinstance(clear, FFCStatistics)
    plain, _ = ffc_classifier(clear, 0.0)
    rel = np.linalg.norm(heads["ffc"].numpy() - plain) / np.linalg.norm(plain)
    assert rel < 1e-6, rel
    assert results["statistics"]["ffc"]["samples"] == clear.count


def test_the_final_evaluation_of_three_sites_stands(
    short_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, _ = short_run
    evaluation = results["federated_evaluation"]
    assert evaluation["participants"] == SURVIVORS and evaluation["error"] is None
    assert results["accuracy"]["none"] is not None and results["accuracy"]["ffc"] is not None
    (reason,) = [e for e in results["errors"] if e.startswith("final evaluation not retried")]
    assert "p0, p1, p2 released their input into the sum kept" in reason
    assert "1 of the 4 eligible participants could take part" in reason


def test_no_site_was_asked_for_a_release_it_had_made(
    short_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    """Each site's own ledger: one FFC release each, no refusal recorded."""
    _, settings = short_run
    for pid in SURVIVORS:
        db = sqlite3.connect(Path(settings.out) / "state" / pid / "privacy.db")
        try:
            kinds = [k for (k,) in db.execute("SELECT kind FROM site_releases")]
            refusals = db.execute("SELECT count(*) FROM site_refusals").fetchone()[0]
        finally:
            db.close()
        assert kinds.count("ffc") == 1, (pid, kinds)
        assert refusals == 0, pid


# ---------------------------------------------------------------- a retry adds the others
ALL_SEVEN = [f"p{k}" for k in range(7)]
AWAY = ["p4", "p5", "p6"]


def _three_back_late(
    out: Path,
    halted_in: str,
    back_when: Callable[[str], bool],
    *,
    kill_coordinator_on: str | None = None,
    halt: str | None = None,
    calibration: tuple[str, ...] = ("ffc",),
    epsilon: float | None = None,
    minimum: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], SimulationSettings, list[str]]:
    """Seven sites, calibration minimum 7 (or the coordinator tables ``minimum``): p4–p6
    die before they advertise in the first ``halted_in`` job and are restarted only
    once the coordinator logs a line ``back_when`` accepts (the short attempt's), so
    the retry can only ask them. With ``kill_coordinator_on``, the coordinator is
    SIGKILLed at the first line after that containing it, and restarted on its port;
    with ``halt`` (``POINT@WHEN``, ``coordinator.driver.halts``), when it halts there."""
    from spherecal.simulate import Simulation
    from spherecal.spherefed.reference import ReferenceConfig

    settings = SimulationSettings(
        reference=ReferenceConfig(participants=7, model="mlp", rounds=1),
        out=out,
        calibration=calibration,
        epsilon=epsilon,
        drops=tuple(Drop(pid, HaltPoint("advertise", halted_in)) for pid in AWAY),
        timeout_s=240,
        save_statistics=True,
        # the short attempt waits this long for the three in its advertise stage; the
        # retry waits up to as long for them to be back
        rejoin_grace_s=8.0,
        extra_coordinator=minimum or {"calibration": {"min_participants": 7}},
    )
    lines: list[str] = []
    seen, kill = threading.Event(), threading.Event()

    def watch(line: str) -> None:
        lines.append(line)
        if back_when(line):
            seen.set()
        if kill_coordinator_on is not None and seen.is_set() and kill_coordinator_on in line:
            kill.set()
        if halt is not None and line.startswith(HALT_MARKER):
            kill.set()

    t0 = time.monotonic()
    with Simulation(settings, watch) as sim:
        port = sim.start_coordinator(halt=halt)
        sim.start_participants()
        assert seen.wait(180), lines[-20:]
        sim.start_participants(only=AWAY)
        if kill_coordinator_on is not None or halt is not None:
            assert kill.wait(180), lines[-20:]
            sim.kill_coordinator()
            lines.append("TEST: coordinator killed")
            sim.start_coordinator(listen=f"127.0.0.1:{port}")
        sim.wait_coordinator(240)
        results = dict[str, Any](
            sim.results(sim.wait_participants(timeout=60), time.monotonic() - t0)
        )
    return results, settings, lines


def test_a_retry_of_the_others_is_added_to_the_sum_kept(
    restarted_run: tuple[dict[str, Any], SimulationSettings, list[str]],
) -> None:
    """(The run's coordinator is killed after the addition and restarted: what it
    solves from is the sum it continued from the journal, both parts.)"""
    results, settings, lines = restarted_run
    assert results["status"] == "completed", (results["status_reasons"], results["errors"])
    ffc_jobs = [j for j in results["jobs"] if j["purpose"] == "ffc" and j["status"] == "done"]
    assert [j["contributors"] for j in ffc_jobs] == [SURVIVORS + ["p3"], AWAY]
    statistics = results["statistics"]["ffc"]
    assert statistics["contributors"] == ALL_SEVEN
    assert [p["contributors"] for p in statistics["parts"]] == [SURVIVORS + ["p3"], AWAY]
    assert any("summed 3 more participants, added to the 4 kept" in line for line in lines)
    # exact: the two parts add to the sum over all seven, and the head is its solve
    clear = clear_statistics(settings, ALL_SEVEN, "ffc")
    assert isinstance(clear, FFCStatistics)
    with np.load(results["saved_statistics"]["ffc"], allow_pickle=False) as saved:
        aggregate = saved["vector"]
    scale = 2.0 ** -max(j["scale_bits"] for j in ffc_jobs)
    np.testing.assert_allclose(aggregate, clear.pack(), rtol=0, atol=8 * scale + 1e-12)
    heads = torch.load(results["models"]["classifiers"]["path"], weights_only=True)
    plain, _ = ffc_classifier(clear, 0.0)
    rel = np.linalg.norm(heads["ffc"].numpy() - plain) / np.linalg.norm(plain)
    assert rel < 1e-6, rel


def test_a_retry_of_the_others_adds_to_the_final_evaluation_kept(
    restarted_evaluation_run: tuple[dict[str, Any], SimulationSettings, list[str]],
) -> None:
    results, _, lines = restarted_evaluation_run
    assert results["status"] == "completed", (results["status_reasons"], results["errors"])
    evaluation = results["federated_evaluation"]
    assert evaluation["participants"] == ALL_SEVEN and evaluation["error"] is None
    assert evaluation["parts"] == [SURVIVORS + ["p3"], AWAY]
    assert any("3 more participants added to the 4 of the evaluation kept" in x for x in lines)
    # the headline is the ratio of the added counts, and one job asked the four, one the
    # three: no site answered the final evaluation twice
    counts = evaluation["counts"]
    assert results["accuracy"]["ffc"] == pytest.approx(
        min(1.0, counts["correct"]["ffc"] / counts["total"])
    )
    # (the kills land in the first evaluation job: the validation gate's, when it runs
    # one, or the final one's)
    done = [j["contributors"] for j in results["jobs"] if j["purpose"] == "evaluate"]
    assert done[-2:] == [SURVIVORS + ["p3"], AWAY], done


@pytest.fixture(scope="module")
def restarted_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], SimulationSettings, list[str]]:
    """The FFC job's first attempt sums p0–p3, its retry p4–p6; the coordinator is
    then killed, before anything was solved from the sum, and restarted."""
    return _three_back_late(
        tmp_path_factory.mktemp("restarted"),
        "ffc",
        lambda line: "statistics ffc: attempt 1 failed" in line,
        kill_coordinator_on="added to the 4 kept",
    )


def test_a_restarted_coordinator_continues_both_parts_and_asks_for_no_release(
    restarted_run: tuple[dict[str, Any], SimulationSettings, list[str]],
) -> None:
    """Issue #20's rule for the parts: each is its own journal slot (``ffc``,
    ``ffc+2``), so the restarted coordinator continues both from the journal — with
    only the later one, the first part's four sites would refuse a second release and
    the sum would lack them."""
    results, settings, lines = restarted_run
    assert "TEST: coordinator killed" in lines
    assert results["status"] == "completed", (results["status_reasons"], results["errors"])
    after = lines[lines.index("TEST: coordinator killed") :]
    continued = [x for x in after if "continued after a restart with its journaled result" in x]
    assert len([x for x in continued if "ffc job" in x]) == 2, continued
    ffc_jobs = [j for j in results["jobs"] if j["purpose"] == "ffc" and j["status"] == "done"]
    assert [j["contributors"] for j in ffc_jobs] == [SURVIVORS + ["p3"], AWAY]
    assert results["statistics"]["ffc"]["contributors"] == ALL_SEVEN
    clear = clear_statistics(settings, ALL_SEVEN, "ffc")
    assert isinstance(clear, FFCStatistics)
    assert results["statistics"]["ffc"]["samples"] == clear.count
    for pid in ALL_SEVEN:  # one FFC release per site, no refusal
        db = sqlite3.connect(Path(settings.out) / "state" / pid / "privacy.db")
        try:
            released = [
                k for (k,) in db.execute("SELECT kind FROM site_releases WHERE state = 'released'")
            ]
            refusals = db.execute("SELECT count(*) FROM site_refusals").fetchone()[0]
        finally:
            db.close()
        assert released.count("ffc") == 1 and refusals == 0, (pid, released, refusals)


@pytest.fixture(scope="module")
def restarted_evaluation_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], SimulationSettings, list[str]]:
    """The final evaluation's first attempt covers p0–p3, its retry p4–p6; the
    coordinator is then killed and restarted."""
    return _three_back_late(
        tmp_path_factory.mktemp("restarted-evaluation"),
        "evaluate",
        lambda line: "federated accuracy (" in line and "on 4 of 7 participants" in line,
        kill_coordinator_on="added to the 4 of the evaluation kept",
    )


def test_a_restarted_coordinator_continues_both_evaluation_parts(
    restarted_evaluation_run: tuple[dict[str, Any], SimulationSettings, list[str]],
) -> None:
    results, _, lines = restarted_evaluation_run
    assert "TEST: coordinator killed" in lines
    assert results["status"] == "completed", (results["status_reasons"], results["errors"])
    after = lines[lines.index("TEST: coordinator killed") :]
    continued = [x for x in after if "continued after a restart with its journaled result" in x]
    # both parts of the final evaluation (and the validation gate's, where it ran one)
    assert len([x for x in continued if "evaluate job" in x]) >= 2, continued
    evaluation = results["federated_evaluation"]
    assert evaluation["participants"] == ALL_SEVEN
    assert evaluation["parts"] == [SURVIVORS + ["p3"], AWAY]
    # no evaluation job after the restart: the final one's parts were continued
    done = [j["contributors"] for j in results["jobs"] if j["purpose"] == "evaluate"]
    assert done[-2:] == [SURVIVORS + ["p3"], AWAY], done


@pytest.fixture(scope="module")
def dp_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], SimulationSettings, list[str]]:
    """The CCVR job's first attempt sums p0–p3, its retry p4–p6, with distributed DP
    noise (ε = 8 per release)."""
    return _three_back_late(
        tmp_path_factory.mktemp("dp"),
        "ccvr",
        lambda line: "statistics ccvr: attempt 1 failed" in line,
        calibration=("ccvr",),
        epsilon=8.0,
    )


def test_dp_parts_add_their_noise_and_are_projected_once_on_the_sum(
    dp_run: tuple[dict[str, Any], SimulationSettings, list[str]],
) -> None:
    """Each part is its own DP release at the target ε over its sites; their noise adds
    in variance, and the sum — not each part — is projected onto what honest data can
    give (projecting each part would clip each part's noise on its own)."""
    results, _, lines = dp_run
    statistics = results["statistics"]["ccvr"]
    assert statistics["contributors"] == ALL_SEVEN
    parts = statistics["parts"]
    assert [p["contributors"] for p in parts] == [SURVIVORS + ["p3"], AWAY]
    sigmas = [p["noise_sigma"] for p in parts]
    assert all(sigma > 0 for sigma in sigmas)
    assert statistics["noise_sigma"] == pytest.approx(float(np.hypot(*sigmas)))
    assert "projection" in statistics and all("projection" not in p for p in parts)
    releases = [x for x in lines if "ccvr DP release: " in x]
    assert len(releases) == 2 and "with 4 contributors" in releases[0], releases
    assert "with 3 contributors" in releases[1]
    added = lines.index(next(x for x in lines if "added to the 4 kept" in x))
    projected = [k for k, x in enumerate(lines) if "ccvr DP release projected" in x]
    assert projected and min(projected) > added, "projected before the parts were added"


# ---------------------------------------------------------------- a training round
@pytest.fixture(scope="module")
def restarted_round(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], SimulationSettings, list[str]]:
    """``[training] min_participants = 7``: round 1's first job sums p0–p3, its retry
    p4–p6; the coordinator halts once the retry's sum is added, before the server step
    uses it, is SIGKILLed and restarted."""
    return _three_back_late(
        tmp_path_factory.mktemp("round"),
        "r1",
        lambda line: "round 1 attempt 1 failed" in line,
        halt="added@r1",
        minimum={"training": {"min_participants": 7}},
    )


def test_a_short_rounds_retry_of_the_others_is_added_and_both_parts_continue(
    restarted_round: tuple[dict[str, Any], SimulationSettings, list[str]],
) -> None:
    """Before 2026-11-28 the short sum was dropped, p0–p3 refused the retry (one update
    per round) and round 1 was lost. Now it is kept, the retry asks p4–p6 alone, and
    the two sums are added; each is its own journal slot (``update:r0``,
    ``update:r0+2``), so the restarted coordinator continues both and asks no site
    for a second update."""
    results, settings, lines = restarted_round
    assert "TEST: coordinator killed" in lines
    assert results["status"] == "completed", (results["status_reasons"], results["errors"])
    assert any("summed 3 more updates, added to the 4 kept" in line for line in lines)
    after = lines[lines.index("TEST: coordinator killed") :]
    continued = [x for x in after if "continued after a restart with its journaled result" in x]
    assert len([x for x in continued if "update round 1 job" in x]) == 2, continued
    (round_1,) = results["per_round"]
    assert round_1.get("status") != "lost"
    assert round_1["contributors"] == ALL_SEVEN
    assert round_1["parts"] == [SURVIVORS + ["p3"], AWAY]
    updates = [j for j in results["jobs"] if j["purpose"] == "update" and j["status"] == "done"]
    assert [j["contributors"] for j in updates] == [SURVIVORS + ["p3"], AWAY]
    # exact against the sites' own ledgers: the round's weight is the sum of the
    # seven example counts they released (integers, exact in the ring)
    weights = 0
    for pid in ALL_SEVEN:
        db = sqlite3.connect(Path(settings.out) / "state" / pid / "privacy.db")
        try:
            (weight,) = db.execute("SELECT released FROM site_example_counts").fetchone()
            updates_left = db.execute(
                "SELECT count(*) FROM site_releases WHERE kind = 'update' AND state = 'released'"
            ).fetchone()[0]
            refusals = db.execute("SELECT count(*) FROM site_refusals").fetchone()[0]
        finally:
            db.close()
        weights += int(weight)
        assert updates_left == 1 and refusals == 0, (pid, updates_left, refusals)
    assert round_1["weight"] == pytest.approx(weights, abs=1e-3)
