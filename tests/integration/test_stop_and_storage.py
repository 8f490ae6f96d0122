"""A coordinator process stopped mid-federation — by SIGTERM, then by its state
directory filling up — ends by itself, tells the sites it is stopping, and two
restarts later the federation completes exactly as the reference runner (issue #20).

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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig, run_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REFERENCE = ReferenceConfig(participants=3, model="mlp", rounds=6)


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
        # 2. Restart; then the state directory fills up mid-federation.
        sim.start_coordinator(listen=f"127.0.0.1:{port}")
        _until("a round after the restart", lambda: _completed_rounds(db) > stopped_after)
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
        # 3. Space freed: the third start finishes the federation.
        filler.unlink()
        sim.start_coordinator(listen=f"127.0.0.1:{port}")
        sim.wait_coordinator(settings.timeout_s)
        results = dict[str, Any](sim.results(sim.wait_participants(), time.monotonic() - t0))
    results["facts"] = facts
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
    assert facts["after_sigterm"]["status"] == "failed"
    assert facts["after_sigterm"]["status_reasons"] == ["stopped: terminated by SIGTERM"]
    assert all(facts["alive_after_sigterm"].values()), facts["alive_after_sigterm"]
    assert any(stopped_twice["stopping_heard"].values())


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
    assert after["status"] == "failed"
    assert any("state storage failed: cannot write" in r for r in after["status_reasons"])
    assert all(facts["alive_after_fault"].values()), facts["alive_after_fault"]


def test_after_both_stops_the_federation_completes_exactly_as_the_reference(
    stopped_twice: dict[str, Any],
) -> None:
    assert stopped_twice["status"] == "completed", stopped_twice["errors"]
    assert stopped_twice["coordinator_starts"] == 3
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
