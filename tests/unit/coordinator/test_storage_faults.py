"""Storage faults end the store's work at once, never a hang (issue #20).

Two ways to make a real write fail, no mocks: SQLite's own ``max_page_count`` (the
database refuses to grow: SQLITE_FULL at the statement), and — as root — a tiny
tmpfs filled to the last byte (the failure then comes at ``COMMIT``, where the old
writer thread died on its ``ROLLBACK`` and every caller waited forever).
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spherecal.coordinator.errors import StorageFailed, status_for
from spherecal.coordinator.state.spool import Spool
from spherecal.coordinator.state.storage_faults import storage_failure
from spherecal.coordinator.state.store import Store
from spherecal.proto.codec import header_for


def _cap(store: Store) -> None:
    """Fault injection: the database may not grow past the pages it has."""

    def cap(c: sqlite3.Connection) -> None:
        pages = int(c.execute("PRAGMA page_count").fetchone()[0])
        c.execute(f"PRAGMA max_page_count = {pages}")

    store.call(cap)


def _big_event(store: Store, n: int = 64) -> None:
    for k in range(n):
        store.set_meta(f"filler-{k}", "x" * 4096)


def test_a_full_database_fails_the_call_every_queued_one_and_every_later_one(
    tmp_path: Path,
) -> None:
    db = tmp_path / "state.db"
    seen: list[StorageFailed] = []
    store = Store(db, on_failure=seen.append)
    store.set_meta("fingerprint", "kept")
    store.round_started(0, 1)
    store.round_finished(0, "completed", {"round": 1}, ("checkpoints/r1.pt", "ab"))
    _cap(store)
    with pytest.raises(StorageFailed) as info:
        _big_event(store)
    fault = info.value
    assert fault.path == str(db) and "full" in fault.cause and "SQLITE_FULL" in fault.cause
    assert str(fault).startswith(f"cannot write {db}: ")
    assert seen == [fault]  # reported once
    # Nothing waits: later calls, posts and the WAL checkpoint fail at once.
    with pytest.raises(StorageFailed):
        store.get_meta("fingerprint")
    with pytest.raises(StorageFailed):
        store.event("info", "after the fault")
    with pytest.raises(StorageFailed):
        store.checkpoint_wal()
    assert status_for(fault) is not None and status_for(fault).code.name == "UNAVAILABLE"  # type: ignore[union-attr]
    store.close()
    assert seen == [fault]
    # What was committed before the fault is all there after a restart.
    again = Store(db)
    assert again.get_meta("fingerprint") == "kept"
    assert [r.round for r in again.completed_rounds()] == [0]
    assert again.query("SELECT count(*) FROM meta WHERE key LIKE 'filler-%'")[0][0] < 64
    again.close()


def test_callers_waiting_on_other_threads_are_all_released(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    _cap(store)
    outcomes: list[BaseException | None] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        try:
            for i in range(40):
                store.set_meta(f"w{k}-{i}", "y" * 4096)
        except BaseException as exc:
            with lock:
                outcomes.append(exc)
            return
        with lock:
            outcomes.append(None)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a caller hangs on a failed store"
    assert len(outcomes) == 6 and all(isinstance(o, StorageFailed) for o in outcomes)
    store.close()


def test_a_bad_query_is_the_callers_error_not_a_storage_fault(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        store.query("SELECT * FROM no_such_table")
    store.set_meta("still", "writable")
    assert store.get_meta("still") == "writable" and store.failure is None
    store.close()


def test_which_errors_are_storage_faults() -> None:
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/state/spool/x.part")
    fault = storage_failure("/state", full)
    assert fault is not None and fault.path == "/state/spool/x.part" and "ENOSPC" in fault.cause
    assert storage_failure("/state", OSError(errno.EROFS, "ro")) is not None
    assert storage_failure("/state", OSError(errno.EIO, "io")) is not None
    assert storage_failure("/state", FileNotFoundError(errno.ENOENT, "gone")) is None
    assert storage_failure("/state", ValueError("x")) is None


# ------------------------------------------------------------------ a real full disk


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only; skipped with the reason otherwise)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root; the max_page_count tests cover the rest")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte; returns the filler file (delete it to free)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (65536, 512, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_fails_fast_and_a_restart_after_freeing_it_resumes(tiny_disk: Path) -> None:
    db = tiny_disk / "state" / "state.db"
    seen: list[StorageFailed] = []
    store = Store(db, on_failure=seen.append)
    store.set_meta("fingerprint", "kept")
    store.round_started(0, 1)
    store.round_finished(0, "completed", {"round": 1}, ("checkpoints/r1.pt", "ab"))
    filler = _fill(tiny_disk)
    result: list[BaseException | None] = []

    def write() -> None:
        try:
            for r in range(1, 200):
                store.round_started(r, 1)
                store.round_finished(r, "completed", {"pad": "z" * 8192}, None)
        except BaseException as exc:
            result.append(exc)
            return
        result.append(None)

    worker = threading.Thread(target=write)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the store hangs on a full disk"
    assert isinstance(result[0], StorageFailed), result
    assert result[0].path.startswith(str(tiny_disk)) and seen == [result[0]]
    store.close()
    filler.unlink()
    again = Store(db)  # after space is freed: everything committed is there
    assert again.get_meta("fingerprint") == "kept"
    rounds = [r.round for r in again.completed_rounds()]
    assert rounds == list(range(len(rounds))) and rounds[0] == 0
    again.set_meta("after", "ok")
    again.close()


def test_a_full_disk_under_the_spool_is_reported_as_a_storage_fault(tiny_disk: Path) -> None:
    reported: list[StorageFailed] = []

    def report(fault: StorageFailed) -> StorageFailed:
        reported.append(fault)
        return fault

    spool = Spool(tiny_disk / "spool", report=report)
    vector = np.arange(64 * 1024, dtype=np.float64)  # 512 KiB
    _fill(tiny_disk)
    writer = spool.writer("t1", "p0", header_for(vector), (64 * 1024,))
    with pytest.raises(StorageFailed) as info:
        data = vector.tobytes()
        for start in range(0, len(data), 65536):
            writer.add(data[start : start + 65536])
        writer.finish()
    writer.abort()
    assert reported == [info.value] and "ENOSPC" in info.value.cause
    assert not list((tiny_disk / "spool" / "t1").glob("*.part"))  # nothing left behind


def test_a_fault_reported_by_the_spool_refuses_writes_and_close_still_stops_the_writer(
    tmp_path: Path,
) -> None:
    seen: list[StorageFailed] = []
    store = Store(tmp_path / "state.db", on_failure=seen.append)
    fault = StorageFailed(str(tmp_path / "spool" / "x.part"), "No space left on device (ENOSPC)")
    assert store.report_failure(fault) is fault
    assert store.report_failure(StorageFailed("/other", "later")) is fault  # the first one
    assert seen == [fault]
    with pytest.raises(StorageFailed):
        store.set_meta("k", "v")
    writer = store._thread
    store.close()
    assert not writer.is_alive()  # stopped, not left to a 10 s join timeout
