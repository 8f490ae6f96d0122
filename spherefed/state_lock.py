"""One process per state directory: an exclusive lock held for the process's life.

Why: a coordinator's state directory (SQLite database, checkpoints, journal, summary)
and a site's (release ledger, held jobs, algorithm state) each belong to *one* running
process. Nothing stopped a second one: a coordinator started again on the same
``state_dir`` with another ``listen`` address (the usual way past "port in use", or a
service unit beside a manual start) resumed the running federation, wrote "resumed" and
"stopped" into its event log, replaced its recorded address and pruned its checkpoints
while the first was still driving it. SQLite keeps each transaction whole, but not two
drivers of one federation apart. A second site process would likewise hold jobs and
answer them beside the first.

How: ``flock(2)`` on ``<state_dir>/lock``, exclusive and non-blocking. The kernel drops
the lock when the process ends however it ends (SIGKILL, power loss), so there is never
a stale lock to clear by hand — unlike a pid file, whose pid may be reused. The file
keeps the holder's pid, role and start time only to say who holds it. It lives here
because it is the lowest package both processes may import (``docs/design.md`` §2)
and does no more than file I/O (:mod:`spherecal.spherefed.durable` likewise).

Read-only commands (``--check-state``, ``spherecal audit``) do not take it; they
ask :func:`in_use` whether a process holds it, to choose how to read a database
without writing beside it (:mod:`spherecal.coordinator.state.read_only`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

__all__ = ["LOCK_NAME", "StateDirInUse", "StateDirLock", "in_use"]

LOCK_NAME = "lock"


class StateDirInUse(ValueError):
    """Another live process holds the state directory (a bad-input refusal: exit 2)."""


class StateDirLock:
    """The exclusive lock of one state directory; :meth:`acquire` or ``with``.

    ``role`` names the holder in the refusal another process prints (``coordinator``,
    ``participant site-a``)."""

    def __init__(self, state_dir: Path, *, role: str) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / LOCK_NAME
        self.role = role
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> StateDirLock:
        """Take the lock or raise :class:`StateDirInUse` naming the holder. The folder
        is created if missing (as every process here creates its state directory)."""
        if self._fd is not None:
            return self
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise StateDirInUse(
                f"state directory {self.state_dir} is in use by {holder}; stop that "
                "process first, or give this one another state_dir (one process per "
                "state directory)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {started} {self.role}\n".encode(), 0)
        except OSError:
            pass  # who holds it is only for the message; the lock itself is taken
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the file stays: removing it could let a third process lock a
        new file while a second still waits on the old one)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> StateDirLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def in_use(state_dir: Path) -> bool:
    """Whether a live process may hold the lock of ``state_dir`` now — found without
    creating, writing or keeping anything: the lock file is opened read-only, and a
    shared lock is tried and dropped at once (a process starting in that instant
    would be refused as if another held the directory; the window is one system
    call). No lock file: no process has held it. A lock file this user cannot open
    (mode 0600, another account's coordinator): perhaps — a reader then takes the
    careful path."""
    try:
        fd = os.open(Path(state_dir) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _read_holder(fd: int) -> str:
    """``"coordinator (pid 123, since 2026-…Z)"`` from the lock file, or a plain
    "another process" when it cannot be read (written by an older version, say)."""
    try:
        fields = os.pread(fd, 512, 0).decode("utf-8", "replace").strip().split(" ", 2)
        pid, started, role = int(fields[0]), fields[1], fields[2]
    except (OSError, ValueError, IndexError):
        return "another process"
    return f"{role} (pid {pid}, since {started})"
