"""A coordinator SIGKILLed at every stage of every secure job kind continues the same
jobs after its restart and never costs a release (issue #20, with #19's ledger).

Two federations of 4 real participant processes (digits, MLP, 2 rounds, secure
updates, statistics and evaluation), each site with its persistent release ledger
at default ``[policy]``. The coordinator is started with a test-only halt point
(``coordinator.driver.halts``): it stops dead *at* that point of a job — after the
first advertisement, in the middle of the masked uploads, right after the
aggregate exists — and the harness SIGKILLs it and restarts it on the same state
directory and port with the next point: 15 kills over the two federations, every
stage of a round's update, the CCVR job and the evaluation (each of the ten points
is also crashed at in ``tests/unit/coordinator/test_job_journal.py``). A third,
uninterrupted federation with the same settings is the yardstick: a crashed one must
end ``completed`` with FFC and CCVR and the *same* models (central accuracies and
per-round losses to the last bit), and no site's ledger may hold a second release of
anything (one update per round, one set of moments, one answer per evaluation) or a
refusal.

The site half (issue #20): in a fourth federation participant processes are
SIGKILLed ten times — *before* their masked upload, at the advertise stage (keys made,
the advertisement not sent) of round 1's update and of the CCVR job and at the share
stage of round 2's update and of the CCVR job; *during* the masked upload of round
1's update and of the CCVR job (the stream cut after its first chunk); and *after*
the masked input left, at the consistency stage of round 1's update, the unmask
stage of round 2's, and both stages of the CCVR job — each restarted with the same
state directory (every site dies two or three times). Each rebuilds the job from its
held-jobs folder (``participant.held_jobs``) and, for the same job id, goes on with
the keys it made (it is handed its task again, redoes its local work and masks that
input), sends its stored masked input again (bit for bit: the cut stream was never
summed) or answers the stage; the coordinator waits for it (``rejoin_grace_s``)
instead of counting it as a dropout.
The federation must end as the uninterrupted one did, every job with all four sites
and nobody dropped, one release per job in each site's ledger and no held job left
on disk.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spherecal.participant.faults import HaltPoint
from spherecal.participant.held_jobs import FOLDER as HELD_JOBS
from spherecal.simulate import Drop, Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig
from tests.coordinator_lines import Lines
from tests.evaluation_noise import SDS

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

WAIT_S = 240.0
HALTS = (
    "advertise@r1",  # a job's first stage, before any input left
    "masked@r1",  # one masked input in the (lost) in-memory sum, the others not yet
    "aggregated@r2",  # the round's sum journaled, not yet applied or checkpointed
    "share@ccvr",  # the statistics job, shares being routed
    "unmask@ccvr",  # the masked sum journaled, the first shares revealed
    "consistency@evaluate",  # the evaluation job's survivor-set signatures
)
MORE_HALTS = (  # the other stages, in a second federation
    "share-closed@r1",
    "masked-closed@r2",
    "advertise@ccvr",
    "masked@ccvr",
    "aggregated@ccvr",
    "advertise@evaluate",
    "masked@evaluate",
    "unmask@evaluate",
    "aggregated@evaluate",
)


SITE_KILLS = (  # before, during and after the site's masked upload
    Drop("p0", HaltPoint("consistency", "r1")),
    Drop("p0", HaltPoint("share", "r2")),
    Drop("p0", HaltPoint("advertise", "ccvr")),
    Drop("p1", HaltPoint("unmask", "r2")),
    Drop("p1", HaltPoint("masked", "ccvr")),
    Drop("p2", HaltPoint("masked", "r1")),
    Drop("p2", HaltPoint("consistency", "ccvr")),
    Drop("p3", HaltPoint("advertise", "r1")),
    Drop("p3", HaltPoint("share", "ccvr")),
    Drop("p3", HaltPoint("unmask", "ccvr")),
)
RESENT = ("p1", "p2")  # killed mid-upload: their stored masked input went again


def _settings(out: Path, drops: tuple[Drop, ...] = ()) -> SimulationSettings:
    return SimulationSettings(
        drops=drops,
        # site kills: several chunks per masked input, so a kill lands mid-stream
        # (the sums, exact in the ring, do not depend on the chunking)
        chunk_entries=1024 if drops else SimulationSettings.chunk_entries,
        reference=ReferenceConfig(participants=4, model="mlp", rounds=2, alpha=0.5),
        out=out,
        calibration=("ffc", "ccvr"),
        secure_updates=True,
        secure_statistics=True,
        timeout_s=WAIT_S,
        # Sites retry a restarted coordinator within half a second (the simulation's
        # back-off doubles to 2 s): 15 restarts and 10 site kills otherwise wait out
        # about 20 s of back-off in all. What the sites do once back is unchanged.
        extra_participant={"reconnect_max_s": 0.5},
        # exact counts: two federations (or the reference) weight alike only without the
        # sites' once-per-federation noise on their training weights
        example_count_noise_sd=0,
    )


def _run(out: Path, halts: tuple[str, ...]) -> dict[str, Any]:
    lines = Lines()
    t0 = time.monotonic()
    with Simulation(_settings(out), lines) as sim:
        port = sim.start_coordinator(halt=halts[0] if halts else None)
        sim.start_participants()
        mark = 0
        for k, point in enumerate(halts):
            lines.wait_for(f"SPHERECAL-HALT {point.split('@')[0]} ", mark, sim, WAIT_S)
            sim.kill_coordinator()
            mark = len(lines.lines)
            following = halts[k + 1] if k + 1 < len(halts) else None
            sim.start_coordinator(listen=f"127.0.0.1:{port}", halt=following)
        sim.wait_coordinator(WAIT_S)
        results: dict[str, Any] = dict[str, Any](
            sim.results(sim.wait_participants(timeout=60), time.monotonic() - t0)
        )
    results["lines"] = lines.lines
    return results


def _run_site_kills(out: Path) -> dict[str, Any]:
    """The federation with :data:`SITE_KILLS`: each killed site is restarted as soon
    as the harness has killed it (the line it prints then)."""
    lines = Lines()
    t0 = time.monotonic()
    with Simulation(_settings(out, SITE_KILLS), lines) as sim:
        sim.start_coordinator()
        sim.start_participants()
        mark = 0
        for _ in SITE_KILLS:
            lines.wait_for("[simulate] killed p", mark, sim, WAIT_S)
            index = next(
                k for k in range(mark, len(lines.lines)) if "[simulate] killed p" in lines.lines[k]
            )
            pid = lines.lines[index].split("killed ", 1)[1].split()[0]
            old = sim.participants[pid]
            old.popen.wait(timeout=30)
            old.close()
            sim.start_participants(only=[pid])
            mark = index + 1
        sim.wait_coordinator(WAIT_S)
        results = dict[str, Any](
            sim.results(sim.wait_participants(timeout=60), time.monotonic() - t0)
        )
    results["lines"] = lines.lines
    return results


def _ledger(out: Path, pid: str) -> tuple[list[tuple[Any, ...]], int]:
    with sqlite3.connect(out / "state" / pid / "privacy.db") as conn:
        rows = conn.execute(
            "SELECT kind, family, round, content, model, state FROM site_releases "
            "WHERE state = 'released'"
        ).fetchall()
        refusals = conn.execute("SELECT COUNT(*) FROM site_refusals").fetchone()[0]
    return rows, int(refusals)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    crashed_out = tmp_path_factory.mktemp("crashed")
    more_out = tmp_path_factory.mktemp("crashed-more")
    clean_out = tmp_path_factory.mktemp("clean")
    sites_out = tmp_path_factory.mktemp("site-kills")
    yield {
        "crashed": _run(crashed_out, HALTS),
        "more": _run(more_out, MORE_HALTS),
        "sites": _run_site_kills(sites_out),
        "outs": (crashed_out, more_out, sites_out),
        "sites_out": sites_out,
        "clean": _run(clean_out, ()),
    }


RUNS = (("crashed", HALTS), ("more", MORE_HALTS))
COMPARED = ("crashed", "more", "sites")


@pytest.mark.parametrize(("run", "halts"), RUNS)
def test_every_halt_landed_and_every_job_was_continued_not_asked_again(
    runs: dict[str, Any], run: str, halts: tuple[str, ...]
) -> None:
    r = runs[run]
    assert r["coordinator_starts"] == len(halts) + 1
    lines = r["lines"]
    for point in halts:
        stage = point.partition("@")[0]
        assert any(f"SPHERECAL-HALT {stage} " in line for line in lines), point
    continued = [line for line in lines if "continued after a restart" in line]
    assert len(continued) >= len(halts), continued


def test_a_journaled_result_is_used_as_it_is(runs: dict[str, Any]) -> None:
    continued = [line for line in runs["more"]["lines"] if "with its journaled result" in line]
    assert any("ccvr job" in line for line in continued), continued
    assert any("evaluate job" in line for line in continued), continued


@pytest.mark.parametrize("run", COMPARED)
def test_the_crashed_federation_completes_with_the_uninterrupted_result(
    runs: dict[str, Any], run: str
) -> None:
    r, clean = runs[run], runs["clean"]
    assert clean["status"] == "completed", (clean["status_reasons"], clean["errors"])
    assert r["status"] == "completed", (r["status_reasons"], r["errors"])
    assert r["status_reasons"] == []
    for name in ("none", "ffc", "ccvr"):
        # the models are the same to the last bit: the coordinator's own evaluation
        assert r["central_accuracy"][name] is not None, name
        assert r["central_accuracy"][name] == clean["central_accuracy"][name], name
        # the federated accuracy is from DP-noised counts (issue #19): equal within
        # SDS standard deviations of the difference of two such draws (a fixed 0.01
        # was 2.3 sd of it: a clean-clone run saw 0.0103 between two honest runs)
        sd = math.hypot(
            r["federated_evaluation"]["accuracy_sd"][name] or 0.0,
            clean["federated_evaluation"]["accuracy_sd"][name] or 0.0,
        )
        assert abs(r["accuracy"][name] - clean["accuracy"][name]) <= SDS * sd, (name, sd)
    assert [m["train_loss"] for m in r["per_round"]] == [
        m["train_loss"] for m in clean["per_round"]
    ]
    assert r["statistics"]["ccvr"]["contributors"] == ["p0", "p1", "p2", "p3"]
    assert all(code == 0 for code in r["exit_codes"].values()), r["exit_codes"]


def test_every_site_kill_landed(runs: dict[str, Any]) -> None:
    r = runs["sites"]
    landed = sorted((d["participant"], d["stage"], d["job"]) for d in r["dropped"])
    assert landed == [
        ("p0", "advertise", "ccvr"),
        ("p0", "consistency", "update"),
        ("p0", "share", "update"),
        ("p1", "masked", "ccvr"),
        ("p1", "unmask", "update"),
        ("p2", "consistency", "ccvr"),
        ("p2", "masked", "update"),
        ("p3", "advertise", "update"),
        ("p3", "share", "ccvr"),
        ("p3", "unmask", "ccvr"),
    ]
    assert r["drops_not_triggered"] == []


def test_each_restarted_site_answered_its_job_and_counted_as_a_survivor(
    runs: dict[str, Any],
) -> None:
    r, out = runs["sites"], runs["sites_out"]
    jobs = {(j["purpose"], j["round"]): j for j in r["jobs"]}
    for key in (("update", 1), ("update", 2), ("ccvr", None)):
        job = jobs[key]
        assert job["status"] == "done", job
        assert job["contributors"] == ["p0", "p1", "p2", "p3"], job
        assert job["dropped"] == {}, job  # waited for, not dropped
        assert job["dropouts"] == [], job
    waits = [line for line in r["lines"] if "for it to come back" in line]
    assert sum("in stage masked before its masked input was whole" in w for w in waits) == 2
    assert sum("after its masked input was summed" in w for w in waits) == 4
    # a site killed before its upload is waited for too, if the coordinator saw it
    # gone: one restarted faster than its disconnect is noticed (seen at the first
    # job, in well under a second) is simply back, handed its task again
    assert sum("in stage advertise before its keys were in" in w for w in waits) <= 2
    assert sum("in stage share before its shares were in" in w for w in waits) <= 2
    assert len(waits) >= 6, waits
    for drop in SITE_KILLS:
        log = (out / "logs" / f"{drop.participant}.log").read_text()
        assert "restored after this site's restart" in log, drop
        if drop.point.stage in ("advertise", "share"):  # the same keys, its task again
            assert "with the keys it advertised" in log, drop
        assert "never computed twice" not in log, drop  # no second masked input was asked
        assert "cannot be used" not in log, drop
        if drop.participant in RESENT:
            assert "sending its stored masked input again" in log, drop
        # the job ended for the site: its held state is gone from its state folder
        held = out / "state" / drop.participant / HELD_JOBS
        assert not held.exists() or list(held.iterdir()) == [], drop
    # the coordinator's audit: each cut upload's chunks were received, and all of them
    # again from the restarted site (the halt leaves its first chunk 1 s to leave: a
    # race under load, so at least one of the two kills must show it)
    cut = 0
    with sqlite3.connect(out / "coordinator" / "state" / "state.db") as conn:
        for d in r["dropped"]:
            if d["stage"] != "masked":
                continue
            kinds = [
                str(k)
                for (k,) in conn.execute(
                    "SELECT kind FROM audit WHERE sender = ? AND job = ? AND stage = 'masked' "
                    "AND status = 'accepted'",
                    (d["participant"], d["task_or_job_id"]),
                )
            ]
            first = kinds.count("MaskedChunk[0]")
            assert first in (1, 2) and len(set(kinds)) > 1, (d, kinds)
            cut += first == 2
    assert cut >= 1


def test_no_site_released_anything_twice_or_refused(runs: dict[str, Any]) -> None:
    for out in runs["outs"]:
        for pid in ("p0", "p1", "p2", "p3"):
            rows, refusals = _ledger(out, pid)
            assert refusals == 0, pid
            training = sorted(row[2] for row in rows if row[1] == "training")
            assert training == [0, 1], (pid, rows)  # one update per round, no more
            assert [row[0] for row in rows if row[1] == "moments"] == ["ccvr"], (pid, rows)
            evaluations = [
                (bytes(row[3]), bytes(row[4])) for row in rows if row[1] == "evaluation"
            ]
            assert len(evaluations) == len(set(evaluations)), (pid, rows)
