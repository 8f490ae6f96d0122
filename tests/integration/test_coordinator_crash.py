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
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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


class Lines:
    """The coordinator's stderr lines, and a wait for one."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, line: str) -> None:
        with self._cond:
            self.lines.append(line)
            self._cond.notify_all()

    def wait_for(self, needle: str, since: int, sim: Simulation) -> None:
        deadline = time.monotonic() + WAIT_S
        with self._cond:
            while not any(needle in line for line in self.lines[since:]):
                assert time.monotonic() < deadline, f"never saw {needle!r}: {self.lines[-10:]}"
                proc = sim.coordinator
                assert proc is None or proc.popen.poll() is None, (
                    f"the coordinator exited before {needle!r}: {self.lines[-10:]}"
                )
                self._cond.wait(0.5)


def _settings(out: Path) -> SimulationSettings:
    return SimulationSettings(
        reference=ReferenceConfig(participants=4, model="mlp", rounds=2, alpha=0.5),
        out=out,
        calibration=("ffc", "ccvr"),
        secure_updates=True,
        secure_statistics=True,
        timeout_s=WAIT_S,
    )


def _run(out: Path, halts: tuple[str, ...]) -> dict[str, Any]:
    lines = Lines()
    t0 = time.monotonic()
    with Simulation(_settings(out), lines) as sim:
        port = sim.start_coordinator(halt=halts[0] if halts else None)
        sim.start_participants()
        mark = 0
        for k, point in enumerate(halts):
            lines.wait_for(f"SPHERECAL-HALT {point.split('@')[0]} ", mark, sim)
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
    yield {
        "crashed": _run(crashed_out, HALTS),
        "more": _run(more_out, MORE_HALTS),
        "outs": (crashed_out, more_out),
        "clean": _run(clean_out, ()),
    }


RUNS = (("crashed", HALTS), ("more", MORE_HALTS))


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


@pytest.mark.parametrize("run", [name for name, _ in RUNS])
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
        # a few noise standard deviations of a ~1,800-sample total
        assert abs(r["accuracy"][name] - clean["accuracy"][name]) < 0.01, name
    assert [m["train_loss"] for m in r["per_round"]] == [
        m["train_loss"] for m in clean["per_round"]
    ]
    assert r["statistics"]["ccvr"]["contributors"] == ["p0", "p1", "p2", "p3"]
    assert all(code == 0 for code in r["exit_codes"].values()), r["exit_codes"]


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
