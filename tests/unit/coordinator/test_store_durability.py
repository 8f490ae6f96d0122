"""The coordinator's database under power loss, on real SQLite in a real process.

A child process runs the store under ``tests/fsync_snapshot.c`` (``LD_PRELOAD``),
which copies the database and its WAL at every sync; the child SIGKILLs itself; the
copies put back in place are the worst an OS crash may leave (:mod:`tests.power_loss`).
Each test asserts what that image holds: every commit the coordinator acted on
(a journaled job before its instruction leaves, a message before its sender hears
"OK") — and, as the mutation, that ``durability = "process-crash"`` (the old
``synchronous=NORMAL`` throughout) loses exactly those.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spherecal.config import ConfigError, parse_coordinator_config
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.job_journal import MESSAGE, JobJournal
from spherecal.coordinator.state.store import (
    POWER_LOSS,
    PROCESS_CRASH,
    Store,
    durability_warning,
)
from tests.power_loss import PowerLoss

JOB = "ab" * 8

CHILD = """
import os, signal, sys
from pathlib import Path
from spherecal.coordinator.state.job_journal import JobJournal
from spherecal.coordinator.state.store import Store

store = Store(Path(sys.argv[1]) / "state.db", durability=sys.argv[2])
store.set_meta("federation_id", "f00d")
store.checkpoint_wal()  # as at a completed round: all of it in the main file, synced
journal = JobJournal(store)
for k in range(5):  # fire-and-forget rows queued before the job (audit, events)
    store.event("info", f"posted {k}")
journal.created(
    job_id=sys.argv[3], slot="ccvr", purpose="ccvr", round_index=None, job=b"spec",
    first_stage_s=30.0,
)
# here the job instruction would leave for the sites
journal.message(sys.argv[3], 0, "p0", b"advertisement of p0")
# here p0 would hear "OK"
os.kill(os.getpid(), signal.SIGKILL)
"""


def _crash(tmp_path: Path, durability: str) -> Store:
    """Run :data:`CHILD` under the shim, lose power, open what the disk kept."""
    state = tmp_path / "state"
    power = PowerLoss.prepare(tmp_path / "shim", state)
    env = {**os.environ, **power.env()}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(power.watched), durability, JOB],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, done.stderr.decode()[-2000:]  # killed, not closed
    assert power.synced(), "the shim recorded no sync at all"
    power.lose_power()
    return Store(state / "state.db")


def test_a_journaled_job_and_its_acknowledged_message_survive_a_power_loss(
    tmp_path: Path,
) -> None:
    store = _crash(tmp_path, POWER_LOSS)
    try:
        job = JobJournal(store).find("ccvr")
        assert job is not None and job.job_id == JOB and job.job == b"spec"
        assert [(e.kind, e.sender, e.data) for e in job.entries] == [
            (MESSAGE, "p0", b"advertisement of p0")
        ]
        # a prefix of the commits: the rows posted before the job are kept with it
        events = [m for (m,) in store.query("SELECT message FROM events ORDER BY id")]
        assert [m for m in events if m.startswith("posted")] == [f"posted {k}" for k in range(5)]
        assert store.get_meta("federation_id") == "f00d"
    finally:
        store.close()


def test_mutation_commits_synced_only_at_checkpoints_lose_the_job(tmp_path: Path) -> None:
    """``process-crash`` (``synchronous=NORMAL`` throughout, as before): the same
    power loss rolls the job back — the restarted coordinator would make a new one,
    which every site that released into the lost one refuses."""
    store = _crash(tmp_path, PROCESS_CRASH)
    try:
        assert store.get_meta("federation_id") == "f00d"  # synced by the checkpoint
        assert JobJournal(store).find("ccvr") is None
    finally:
        store.close()


def test_only_batches_with_a_waiter_are_synced(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    try:
        store.set_meta("a", "1")
        commits, synced = store.commits, store.synced_commits
        assert synced >= 1 and commits == synced
        store.event("info", "fire and forget")
        store.checkpoint_wal()  # flushes the queue; a checkpoint is nobody's waited work
        assert (store.commits, store.synced_commits) == (commits + 1, synced)
        store.get_meta("a")  # read-only: nothing to commit or sync
        assert (store.commits, store.synced_commits) == (commits + 1, synced)
        store.set_meta("b", "2")
        assert (store.commits, store.synced_commits) == (commits + 2, synced + 1)
        assert store.query("PRAGMA synchronous") == [(2,)]  # FULL, left by the last batch
    finally:
        store.close()
    weak = Store(tmp_path / "weak.db", durability=PROCESS_CRASH)
    try:
        weak.set_meta("a", "1")
        assert weak.commits >= 1 and weak.synced_commits == 0
        assert weak.query("PRAGMA synchronous") == [(1,)]  # NORMAL
    finally:
        weak.close()


def test_durability_is_a_checked_setting_and_its_weakening_is_named() -> None:
    roster = {"participants": ["a", "b"]}
    settings, _ = parse_coordinator_config({"federation": roster})
    assert settings.durability == POWER_LOSS
    assert durability_warning(settings.durability) is None
    weak, _ = parse_coordinator_config({"federation": {**roster, "durability": "process-crash"}})
    assert weak.durability == PROCESS_CRASH
    line = durability_warning(weak.durability)
    assert line is not None and "process-crash" in line and "power loss" in line
    with pytest.raises(ConfigError, match="durability"):
        parse_coordinator_config({"federation": {**roster, "durability": "none"}})
    with pytest.raises(ValueError, match="durability"):
        CoordinatorSettings(participants=("a",), durability="fsync")


def test_the_store_refuses_an_unknown_durability(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        Store(tmp_path / "state.db", durability="sometimes")
    assert not (tmp_path / "state.db").exists()


def test_the_end_is_recorded_before_any_site_is_told_done(tmp_path: Path) -> None:
    """``Done`` leaves through the board; the stored status must already say the
    federation ended (and be synced), or a coordinator that lost power between the
    two resumes a federation whose sites have gone. Mutation: ``board.finish`` first
    (as before) → the status read at that moment is not ``failed``."""
    from spherecal.coordinator.driver.federation import Federation
    from spherecal.coordinator.settings import ModelSettings
    from spherecal.coordinator.state.registry import Registry

    settings = CoordinatorSettings(
        participants=("p0", "p1"),
        model=ModelSettings(extractor="mlp"),
        state_dir=tmp_path / "state",
        out_dir=tmp_path / "out",
    )
    store = Store(settings.state_dir / "state.db")
    try:
        registry = Registry(
            settings.participants,
            store,
            require_certificates=False,
            heartbeat_timeout_s=5,
            clock_skew_s=60,
        )
        federation = Federation(settings, store, registry, say=lambda _m: None)
        seen: list[tuple[str | None, int]] = []
        finish = federation.board.finish

        def told(status: str, message: str) -> None:
            seen.append((store.get_meta("status"), store.synced_commits))
            finish(status, message)

        federation.board.finish = told  # type: ignore[method-assign]
        synced = store.synced_commits
        federation._failed("a reason")
        assert len(seen) == 1
        status, synced_then = seen[0]
        assert status == "failed" and synced_then > synced
        assert federation.board.done == ("failed", "a reason")
    finally:
        store.close()
