"""A coordinator process stopped mid-federation — by SIGTERM, by Ctrl-C, then by its
state directory filling up — ends by itself, tells the sites it is stopping, and three
restarts later the federation completes exactly as the reference runner (issue #20).
While it runs, a second coordinator on its state directory is refused before it writes
anything (``spherecal.spherefed.state_lock``).

The state directory is a 20 MB tmpfs (root only; skipped with the reason otherwise,
``tests/unit/coordinator/test_storage_faults.py`` injects the same faults in the
store without root). Plaintext aggregation, so "exactly" is checkable to the bit:
the resumed rounds use the same seeds, selection and sum order.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig, run_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REFERENCE = ReferenceConfig(participants=3, model="mlp", rounds=8)


def _completed_rounds(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute("SELECT count(*) FROM rounds WHERE status='completed'").fetchone()
        return int(row[0])
    except sqlite3.Error:
        return 0


def _until(what: str, check: Callable[[], bool], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte; returns the filler (delete it to free)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 65536, 512, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


@pytest.fixture(scope="module")
def tmpfs_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``OUT/coordinator/state`` on a fresh 20 MB tmpfs; yields OUT."""
    out = tmp_path_factory.mktemp("stop-and-storage")
    state = out / "coordinator" / "state"
    state.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip(
            "a tmpfs state directory needs root (mount); the store's unit tests "
            "inject the same faults without it"
        )
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(state)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield out
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def _events(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute("SELECT * FROM events ORDER BY rowid").fetchall()


def _meta(db: Path, key: str) -> str | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def _second_coordinator(out: Path) -> subprocess.CompletedProcess[str]:
    """The real CLI on the running federation's own config, on another port."""
    config = out / "second-coordinator.toml"
    text = (out / "coordinator.toml").read_text()
    listen = next(line for line in text.splitlines() if line.startswith("listen ="))
    config.write_text(text.replace(listen, 'listen = "127.0.0.1:0"'))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(
        [sys.executable, "-m", "spherecal.cli", "coordinator", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=out,
        env=env,
    )


def _alive(sim: Simulation) -> dict[str, bool]:
    return {pid: proc.popen.poll() is None for pid, proc in sim.participants.items()}


def _log(out: Path, name: str) -> str:
    path = out / "logs" / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def stopped_twice(tmpfs_state: Path) -> dict[str, Any]:
    out = tmpfs_state
    state = out / "coordinator" / "state"
    db = state / "state.db"
    settings = SimulationSettings(
        reference=REFERENCE,
        out=out,
        calibration=("ffc", "ccvr"),
        secure_updates=False,
        secure_statistics=False,
        timeout_s=300,
        # exact counts: two federations (or the reference) weight alike only without the
        # sites' once-per-federation noise on their training weights
        example_count_noise_sd=0,
    )
    facts: dict[str, Any] = {}
    t0 = time.monotonic()
    with Simulation(settings) as sim:
        port = sim.start_coordinator()
        sim.start_participants()
        _until("round 1 completed", lambda: _completed_rounds(db) >= 1)
        # 1. SIGTERM mid-federation.
        assert sim.coordinator is not None
        t = time.monotonic()
        os.kill(sim.coordinator.popen.pid, signal.SIGTERM)
        facts["sigterm_rc"] = sim.wait_coordinator(60)
        facts["sigterm_exit_s"] = time.monotonic() - t
        facts["after_sigterm"] = json.loads((out / "coordinator/out/summary.json").read_text())
        facts["alive_after_sigterm"] = _alive(sim)
        _until(
            "a participant heard 'stopping'",
            lambda: any("coordinator is stopping" in _log(out, p) for p in sim.participants),
            timeout=30,
        )
        stopped_after = _completed_rounds(db)
        # 2. Restart; a second coordinator on the same state directory (another port,
        # the way past "port in use") is refused while it runs; then Ctrl-C.
        sim.start_coordinator(listen=f"127.0.0.1:{port}")
        _until("a round after the restart", lambda: _completed_rounds(db) > stopped_after)
        # Paused meanwhile (its lock stays held), so the rounds left cannot all finish
        # while the second process starts; Ctrl-C lands as it resumes.
        assert sim.coordinator is not None
        first = sim.coordinator.popen.pid
        os.kill(first, signal.SIGSTOP)
        try:
            facts["events_before_second"] = _events(db)
            second = _second_coordinator(sim.out)
            facts["second_rc"], facts["second_stderr"] = second.returncode, second.stderr
            facts["events_after_second"] = _events(db)
            facts["listen_after_second"] = _meta(db, "listen")
            facts["first_pid"] = first
            os.kill(first, signal.SIGINT)
        finally:
            os.kill(first, signal.SIGCONT)
        facts["sigint_rc"] = sim.wait_coordinator(60)
        facts["after_sigint"] = json.loads((out / "coordinator/out/summary.json").read_text())
        facts["alive_after_sigint"] = _alive(sim)
        facts["sigint_log"] = _log(out, "coordinator")
        interrupted_after = _completed_rounds(db)
        # 3. Restart; then the state directory fills up mid-federation.
        sim.start_coordinator(listen=f"127.0.0.1:{port}")
        _until("a round after the restart", lambda: _completed_rounds(db) > interrupted_after)
        # Paused while the disk fills, so that the fault lands mid-federation however
        # fast the remaining rounds are (on a fast machine they could all complete, into
        # pages SQLite already held, before the filler had filled the disk).
        assert sim.coordinator is not None
        os.kill(sim.coordinator.popen.pid, signal.SIGSTOP)
        try:
            facts["rounds_at_fill"] = _completed_rounds(db)
            filler = _fill(state)
        finally:
            os.kill(sim.coordinator.popen.pid, signal.SIGCONT)
        t = time.monotonic()
        facts["filled_at"] = time.strftime("%H:%M:%S")
        facts["fault_rc"] = sim.wait_coordinator(120)  # by itself: nobody signals it
        facts["fault_exit_s"] = time.monotonic() - t
        facts["fault_log"] = _log(out, "coordinator")
        facts["after_fault"] = json.loads((out / "coordinator/out/summary.json").read_text())
        facts["alive_after_fault"] = _alive(sim)
        # 4. Space freed: the fourth start finishes the federation.
        filler.unlink()
        sim.start_coordinator(listen=f"127.0.0.1:{port}")
        sim.wait_coordinator(settings.timeout_s)
        results = dict[str, Any](sim.results(sim.wait_participants(), time.monotonic() - t0))
    results["facts"] = facts
    results["facts_port"] = port
    results["stopping_heard"] = {
        p: "coordinator is stopping" in _log(out, p) for p in settings.participant_ids
    }
    print(json.dumps({k: v for k, v in facts.items() if k.endswith(("_s", "_rc", "_at"))}))
    if os.environ.get("SPHERECAL_SHOW_LOGS"):
        print(facts["fault_log"][-6000:])
    return results


def test_sigterm_ends_the_process_and_the_sites_wait_for_its_restart(
    stopped_twice: dict[str, Any],
) -> None:
    facts = stopped_twice["facts"]
    assert facts["sigterm_rc"] == 1
    assert facts["after_sigterm"]["status"] == "stopped"  # not over (it said "failed")
    assert facts["after_sigterm"]["status_reasons"] == ["stopped: terminated by SIGTERM"]
    assert all(facts["alive_after_sigterm"].values()), facts["alive_after_sigterm"]
    assert any(stopped_twice["stopping_heard"].values())


def test_a_second_coordinator_on_the_running_federation_is_refused_and_writes_nothing(
    stopped_twice: dict[str, Any],
) -> None:
    facts = stopped_twice["facts"]
    assert facts["second_rc"] == 2, facts["second_stderr"][-2000:]
    lines = [line for line in facts["second_stderr"].splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert f"in use by coordinator (pid {facts['first_pid']}, since " in lines[0]
    # the running federation's log and recorded address are untouched ("resumed",
    # "stopped" and another listen address were written before the lock)
    assert facts["events_after_second"] == facts["events_before_second"]
    assert facts["listen_after_second"] is not None
    port = stopped_twice["facts_port"]
    assert facts["listen_after_second"].endswith(f":{port}")


def test_ctrl_c_stops_the_coordinator_like_sigterm_and_exits_130(
    stopped_twice: dict[str, Any],
) -> None:
    facts = stopped_twice["facts"]
    assert facts["sigint_rc"] == 130
    after = facts["after_sigint"]
    assert after["status"] == "stopped"  # never left at "running", nor "failed"
    assert after["status_reasons"] == ["stopped: interrupted by Ctrl-C (SIGINT)"]
    assert all(facts["alive_after_sigint"].values()), facts["alive_after_sigint"]
    assert "spherecal coordinator: interrupted" in facts["sigint_log"]
    assert "Traceback" not in facts["sigint_log"]


def test_a_full_state_directory_ends_the_coordinator_with_one_line(
    stopped_twice: dict[str, Any],
) -> None:
    facts = stopped_twice["facts"]
    assert facts["rounds_at_fill"] < REFERENCE.rounds  # the fault came mid-federation
    assert facts["fault_rc"] == 1
    fatal = [ln for ln in facts["fault_log"].splitlines() if "FATAL: state storage failed" in ln]
    assert len(fatal) == 1, fatal
    assert "/coordinator/state/" in fatal[0]
    assert "No space left on device" in fatal[0] or "disk is full" in fatal[0]
    assert "Traceback" not in facts["fault_log"]
    after = facts["after_fault"]
    assert after["status"] == "stopped"
    assert any("state storage failed: cannot write" in r for r in after["status_reasons"])
    assert all(facts["alive_after_fault"].values()), facts["alive_after_fault"]


def test_after_both_stops_the_federation_completes_exactly_as_the_reference(
    stopped_twice: dict[str, Any],
) -> None:
    assert stopped_twice["status"] == "completed", stopped_twice["errors"]
    assert stopped_twice["coordinator_starts"] == 4
    failed = {p: c for p, c in stopped_twice["exit_codes"].items() if c != 0}
    assert not failed, failed
    assert [r["round"] for r in stopped_twice["per_round"]] == list(range(1, REFERENCE.rounds + 1))
    torch.set_num_threads(1)
    reference = run_reference(REFERENCE)
    for name in ("none", "ffc", "ccvr"):
        assert stopped_twice["accuracy"][name] == reference["accuracy"][name]
    for ours, theirs in zip(stopped_twice["per_round"], reference["per_round"], strict=True):
        assert ours["train_loss"] == theirs["train_loss"]
        assert ours["test_accuracy"] == theirs["test_accuracy"]
