"""One process per state directory (:mod:`spherecal.spherefed.state_lock`).

The holder is a real second process where it matters (``flock`` locks belong to open
files, so a process could never see its own lock as another's), and the refused
commands are the real CLI in processes of their own, as an operator runs them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spherecal.spherefed.state_lock import LOCK_NAME, StateDirInUse, StateDirLock

HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from spherecal.spherefed.state_lock import StateDirLock\n"
    "lock = StateDirLock(Path(sys.argv[1]), role=sys.argv[2]).acquire()\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


def _hold(state: Path, role: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state), role], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.fixture
def coordinator_holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    state = tmp_path / "state"
    holder = _hold(state, "coordinator")
    yield state, holder
    holder.kill()
    holder.wait()


def test_a_second_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path / "s", role="participant site-a").acquire()
    assert (tmp_path / "s" / LOCK_NAME).stat().st_mode & 0o777 == 0o600
    with pytest.raises(StateDirInUse) as refused:
        StateDirLock(tmp_path / "s", role="participant site-a").acquire()
    message = str(refused.value)
    assert f"in use by participant site-a (pid {os.getpid()}, since " in message
    assert str(tmp_path / "s") in message
    first.release()
    with StateDirLock(tmp_path / "s", role="coordinator") as again:  # free once released
        assert again.held
    assert not again.held


def test_the_lock_goes_with_its_process_even_when_killed(
    coordinator_holder: tuple[Path, subprocess.Popen[str]],
) -> None:
    state, holder = coordinator_holder
    with pytest.raises(StateDirInUse, match=rf"coordinator \(pid {holder.pid}, since "):
        StateDirLock(state, role="coordinator").acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with StateDirLock(state, role="coordinator"):  # no stale lock to clear by hand
        assert (state / LOCK_NAME).read_text().split()[0] == str(os.getpid())


def test_an_unreadable_holder_record_still_refuses(tmp_path: Path) -> None:
    state = tmp_path / "s"
    holder = _hold(state, "coordinator")
    try:
        (state / LOCK_NAME).write_text("garbage")  # e.g. written by something else
        with pytest.raises(StateDirInUse, match="in use by another process"):
            StateDirLock(state, role="coordinator").acquire()
    finally:
        holder.kill()
        holder.wait()


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    return subprocess.run(
        [sys.executable, "-m", "spherecal.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


def _coordinator_config(tmp_path: Path, state: Path) -> Path:
    config = tmp_path / "c.toml"
    config.write_text(
        f'[federation]\nparticipants = ["a", "b", "c"]\nstate_dir = "{state.as_posix()}"\n'
        f'[model]\nextractor = "mlp"\n'
        f'[server]\nlisten = "127.0.0.1:0"\ninsecure = true\n'
    )
    return config


def test_a_second_coordinator_on_a_held_state_dir_exits_2_writing_nothing(
    tmp_path: Path, coordinator_holder: tuple[Path, subprocess.Popen[str]]
) -> None:
    state, holder = coordinator_holder
    done = _cli(tmp_path, "coordinator", "--config", str(_coordinator_config(tmp_path, state)))
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert f"is in use by coordinator (pid {holder.pid}, since " in lines[0]
    assert "stop that process first" in lines[0]
    assert sorted(p.name for p in state.iterdir()) == [LOCK_NAME]  # no database, no marker


def test_unpin_needs_the_coordinator_stopped(
    tmp_path: Path, coordinator_holder: tuple[Path, subprocess.Popen[str]]
) -> None:
    state, holder = coordinator_holder
    config = _coordinator_config(tmp_path, state)
    import sqlite3

    sqlite3.connect(state / "state.db").close()  # a database exists: only the lock refuses
    done = _cli(tmp_path, "coordinator", "--config", str(config), "--unpin", "b")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"in use by coordinator (pid {holder.pid}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_second_site_process_on_a_held_state_dir_exits_2(tmp_path: Path) -> None:
    state = tmp_path / "site-state"
    holder = _hold(state, "participant site-a")
    try:
        config = tmp_path / "p.toml"
        config.write_text(
            f'[participant]\nid = "site-a"\ncoordinator = "127.0.0.1:1"\ninsecure = true\n'
            f'state_dir = "{state.as_posix()}"\n'
            f'[data]\ndataset = "digits"\n'
        )
        done = _cli(tmp_path, "participant", "--config", str(config))
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"in use by participant site-a (pid {holder.pid}, since " in done.stderr
    assert "Traceback" not in done.stderr
    assert not (state / "identity.key").exists()  # refused before enrolment wrote anything


def test_in_use_tells_a_held_directory_without_creating_or_writing_anything(
    tmp_path: Path,
) -> None:
    """``spherecal audit`` asks whether a coordinator holds the directory to choose how
    to read its database; asking must leave no file (no lock file made) and no lock."""
    from spherecal.spherefed.state_lock import in_use

    assert not in_use(tmp_path) and list(tmp_path.iterdir()) == []  # never held
    holder = _hold(tmp_path, "coordinator")
    try:
        written = (tmp_path / LOCK_NAME).read_bytes()
        assert in_use(tmp_path)
        assert (tmp_path / LOCK_NAME).read_bytes() == written
    finally:
        holder.kill()
        holder.wait()
    assert not in_use(tmp_path)  # the kernel dropped the dead holder's lock
    StateDirLock(tmp_path, role="coordinator").acquire().release()  # the probe kept none
