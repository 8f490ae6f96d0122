"""The coordinator process exits after a stop even when its driver never returns
(issue #20: never a hang). A child process whose main thread is stuck gets a storage
fault, or two SIGTERMs: it must exit 1 by itself, with the one FATAL line and a
best-effort summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHILD = r"""
import sys, threading
from pathlib import Path
from tests.unit.coordinator.service_harness import Harness, settings_for
from spherecal.coordinator import main as coordinator_main
from spherecal.coordinator.errors import StorageFailed

tmp, mode = Path(sys.argv[1]), sys.argv[2]
harness = Harness(settings_for(tmp, secure=False))
say = lambda m: print(f"[coordinator] {m}", file=sys.stderr, flush=True)
stopper = coordinator_main._Stopper(harness.federation, say, tmp / "out" / "summary.json")
stopper.grace_s = 1.0
if mode == "fault":
    threading.Timer(0.2, stopper.storage_failed,
                    (StorageFailed(str(tmp / "state" / "state.db"), "disk I/O error"),)).start()
else:
    import signal
    signal.signal(signal.SIGTERM, stopper.on_signal)
    stopper.grace_s = 600.0  # only the second SIGTERM may end it
print("ready", flush=True)
if mode == "sigterm":
    board = harness.federation.board
    with board.cond:
        while board.suspended is None:
            board.cond.wait(1.0)
    print("suspended", flush=True)  # the first SIGTERM took effect
threading.Event().wait()  # the driver, stuck: nothing else ends this process
"""


def _child(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_storage_fault_ends_a_stuck_process_with_one_line_and_a_summary(
    tmp_path: Path,
) -> None:
    proc = _child(tmp_path, "fault")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    fatal = [ln for ln in err.splitlines() if "FATAL: state storage failed" in ln]
    assert len(fatal) == 1 and "state.db: disk I/O error" in fatal[0]
    assert "did not stop within 1s" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert summary["status_reasons"] == [
        f"stopped: state storage failed: cannot write "
        f"{tmp_path / 'state' / 'state.db'}: disk I/O error"
    ]


def test_a_second_sigterm_ends_a_stuck_process_at_once(tmp_path: Path) -> None:
    proc = _child(tmp_path, "sigterm")
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "suspended"
    assert proc.poll() is None  # the first one stops the federation, not the process
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "second SIGTERM: exiting now" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert summary["status_reasons"] == ["stopped: terminated by a second SIGTERM"]
