"""A coordinator whose machine loses power mid-job comes back with only what was
synced to disk, and still continues the same job: no site spends a second release.

A process crash loses nothing SQLite committed; a power loss (or an OS crash) loses
every commit whose WAL frames were not yet *synced*. The coordinator's state is then
older than what the sites saw: they hold a job (and have released into it) that the
coordinator's database may no longer name. Four real participant processes (digits,
MLP, 2 rounds, secure updates and statistics, persistent release ledgers at default
``[policy]``); the coordinator runs under ``tests/fsync_snapshot.c`` (``LD_PRELOAD``),
which copies its database and WAL at every sync of them. It is halted at the first
unmask answer of round 2's update and, after its restart, of the CCVR job — every
site's masked input has left and every site signed the survivor set — and
SIGKILLed each time; then its database and WAL are put back as of their last sync
(:mod:`tests.power_loss`), the worst an OS crash may leave, and it is restarted on
that. It must continue both jobs (the sites answer from their held state) and end
``completed`` with FFC and CCVR over all four sites, no site refusing anything and
each site's ledger holding one update per round and one release of its moments.

With ``synchronous=NORMAL`` for every commit the job's rows were never synced: the
restarted coordinator made a new CCVR job, every site refused it
(``RULE_RELEASE_REPEATED``) and the federation ended ``degraded`` without
calibration — each site's moments released into a job that no longer existed.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig
from tests.coordinator_lines import Lines
from tests.power_loss import PowerLoss

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

WAIT_S = 240.0
HALTS = ("unmask@r2", "unmask@ccvr")
"""Round 2's update and the CCVR job, each at its first unmask answer: every site's
masked input has left and every site signed the survivor set."""


def _ledger(out: Path, pid: str) -> tuple[list[tuple[Any, ...]], int]:
    with sqlite3.connect(out / "state" / pid / "privacy.db") as conn:
        rows = conn.execute(
            "SELECT kind, family, round FROM site_releases WHERE state = 'released'"
        ).fetchall()
        refusals = conn.execute("SELECT COUNT(*) FROM site_refusals").fetchone()[0]
    return rows, int(refusals)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("power-loss")
    power = PowerLoss.prepare(tmp_path_factory.mktemp("shim"), out / "coordinator" / "state")
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=4, model="mlp", rounds=2, alpha=0.5),
        out=out,
        calibration=("ffc", "ccvr"),
        secure_updates=True,
        secure_statistics=True,
        timeout_s=WAIT_S,
        launcher="exec",  # LD_PRELOAD takes effect in a fresh interpreter only
    )
    lines = Lines()
    t0 = time.monotonic()
    with pytest.MonkeyPatch.context() as env:
        for name, value in power.env().items():
            env.setenv(name, value)
        with Simulation(settings, lines) as sim:
            port = sim.start_coordinator(halt=HALTS[0])
            sim.start_participants()
            synced_before = []
            mark = 0
            for k, point in enumerate(HALTS):
                lines.wait_for(f"SPHERECAL-HALT {point.split('@')[0]} ", mark, sim, WAIT_S)
                sim.kill_coordinator()
                mark = len(lines.lines)
                synced_before.append(power.synced())
                power.lose_power()
                following = HALTS[k + 1] if k + 1 < len(HALTS) else None
                sim.start_coordinator(listen=f"127.0.0.1:{port}", halt=following)
            sim.wait_coordinator(WAIT_S)
            results = dict[str, Any](
                sim.results(sim.wait_participants(timeout=60), time.monotonic() - t0)
            )
    results["lines"] = lines.lines
    results["out"] = out
    results["synced_before"] = synced_before
    return results


def test_the_halt_landed_and_the_database_went_back_to_its_last_sync(
    run: dict[str, Any],
) -> None:
    assert run["coordinator_starts"] == len(HALTS) + 1
    halts = [line for line in run["lines"] if "SPHERECAL-HALT unmask " in line]
    assert len(halts) == len(HALTS), halts
    # the model is real: the database was synced before each halt (at least when
    # it was created and at each completed round's checkpoint)
    for synced in run["synced_before"]:
        assert any(name == "state.db" for _op, name, _size in synced)


def test_both_jobs_were_continued_and_the_federation_completed(run: dict[str, Any]) -> None:
    assert run["status"] == "completed", (run["status_reasons"], run["errors"])
    assert run["status_reasons"] == []
    continued = [line for line in run["lines"] if "continued after a restart" in line]
    assert any("ccvr" in line for line in continued), continued
    assert any("update" in line and "round 2" in line for line in continued), continued
    assert run["statistics"]["ccvr"]["contributors"] == ["p0", "p1", "p2", "p3"]
    for name in ("none", "ffc", "ccvr"):
        assert run["central_accuracy"][name] is not None, name
    assert all(code == 0 for code in run["exit_codes"].values()), run["exit_codes"]


def test_no_site_refused_or_released_its_moments_twice(run: dict[str, Any]) -> None:
    for pid in ("p0", "p1", "p2", "p3"):
        rows, refusals = _ledger(run["out"], pid)
        assert refusals == 0, pid
        assert [row[0] for row in rows if row[1] == "moments"] == ["ccvr"], (pid, rows)
        assert sorted(row[2] for row in rows if row[1] == "training") == [0, 1], (pid, rows)
