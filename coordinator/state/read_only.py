"""Read a state database without creating or changing a file beside it.

Why: ``spherecal audit STATE_DB`` is a privacy officer's read-only inspection (and
``spherecal coordinator --check-state`` an operator's, before a restart, a backup or
a copy), but SQLite opening a WAL-mode database with ``mode=ro`` still creates
``state.db-wal`` and ``state.db-shm`` next to it when they are missing (a cleanly
stopped coordinator leaves none), and leaves them there; with a ``-wal`` left by a
coordinator that did not stop cleanly it rebuilds the shared-memory index in
``state.db-shm``. The directory a coordinator resumes from, and its operator backs up
and copies whole, changed under an audit or a check.

Every read-only inspection of a coordinator's or a site's database opens it here:
``spherecal audit`` (the coordinator's database and the sites' ledgers),
``spherecal audit --site``, ``--check-state``
(:func:`~spherecal.coordinator.state.state_dir.inspect_state`), the timing-channel
measurement (:mod:`spherecal.timing_channel`) and a starting coordinator's check
whether its federation already ended
(:func:`~spherecal.coordinator.state.lifecycle.finished_federation`). The running
coordinator and sites open their own databases read-write, as before.

How :func:`read_only` opens ``database``, by what is beside it:

- **a live process holds the state directory** (its lock, :func:`~spherecal.spherefed.
  state_lock.in_use`) and its ``-wal`` and ``-shm`` exist: ``mode=ro`` on them, as
  any SQLite reader beside a writer must — the snapshot is consistent under SQLite's
  own locks, the database and its ``-wal`` are only read, and nothing is created.
  ``-shm`` is the writer's shared-memory index, which every reader's locks use.
- **no ``-wal``, or an empty one** (the coordinator stopped and checkpointed):
  ``mode=ro&immutable=1``, which reads the one file and creates nothing.
- **a ``-wal`` with frames and no live process** (a coordinator killed or crashed, or
  a copied directory): its frames hold committed rows the database file does not, so
  they must be read; the database and its ``-wal`` are copied into a private
  temporary directory and the copy is opened there (SQLite's recovery writes only the
  copy's index), then removed.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

from spherecal.spherefed.state_lock import in_use

__all__ = ["read_only"]


def _uri(database: Path, query: str) -> str:
    """A ``file:`` URI (a path with ``?`` or ``#`` in it stays a path)."""
    return f"{database.resolve().as_uri()}?{query}"


@contextlib.contextmanager
def read_only(database: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``database`` that creates and changes no file in its
    directory (the module docstring says how, case by case); closed on exit."""
    wal = database.with_name(database.name + "-wal")
    shm = database.with_name(database.name + "-shm")
    with contextlib.ExitStack() as stack:
        if in_use(database.parent) and wal.exists() and shm.exists():
            uri = _uri(database, "mode=ro")  # beside the live writer, under its locks
        elif not wal.exists() or wal.stat().st_size == 0:
            uri = _uri(database, "mode=ro&immutable=1")  # one file, nothing created
        else:  # frames no live process will checkpoint: read them from a copy
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spherecal-")))
            copy = scratch / database.name
            shutil.copyfile(database, copy)
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
            uri = _uri(copy, "mode=ro")
        conn = sqlite3.connect(uri, uri=True)
        stack.callback(conn.close)  # before the copy, if any, is removed
        yield conn
