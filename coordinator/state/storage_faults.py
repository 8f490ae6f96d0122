"""Which failures are storage faults: the ones that end the coordinator (issue #20).

Why fatal: a coordinator whose state directory cannot be written (disk full, I/O
error, read-only file system) can neither record a finished round nor keep an
upload. Carrying on would compute what it cannot keep; waiting would hang (the
SQLite writer thread used to die on a failed ``COMMIT`` while the driver waited for
it forever). So every write path — the database's writer thread, the upload spool,
checkpoints — turns such a failure into one :class:`StorageFailed` naming the path
and the cause, the coordinator stops within seconds, and a restart after the fault
is fixed resumes from what was committed (SQLite rolls the failed transaction back).

What is *not* a storage fault: a query the code got wrong (``no such table``, a
constraint), which stays the caller's error — it is a bug, not the disk.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from spherecal.coordinator.errors import StorageFailed

__all__ = ["FATAL_ERRNOS", "FATAL_SQLITE_CODES", "commit_failure", "storage_failure"]

#: SQLite primary result codes that mean the storage, not the query, failed.
FATAL_SQLITE_CODES = frozenset(
    {
        8,  # SQLITE_READONLY
        10,  # SQLITE_IOERR (every extended I/O error)
        11,  # SQLITE_CORRUPT
        13,  # SQLITE_FULL
        14,  # SQLITE_CANTOPEN
        15,  # SQLITE_PROTOCOL
        26,  # SQLITE_NOTADB
    }
)

#: ``errno`` values of a file write that mean the storage failed.
FATAL_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.ENODEV}
)


def storage_failure(path: str | Path, exc: BaseException) -> StorageFailed | None:
    """``exc`` as a :class:`StorageFailed` if it is a storage fault, else None.

    ``path`` names the file written when the exception does not (an ``OSError``
    carrying a ``filename`` names its own)."""
    if isinstance(exc, StorageFailed):
        return exc
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int) and (code & 0xFF) in FATAL_SQLITE_CODES:
            name = getattr(exc, "sqlite_errorname", None) or f"SQLite code {code}"
            return StorageFailed(str(path), f"{exc} ({name})")
        return None
    if isinstance(exc, OSError) and exc.errno in FATAL_ERRNOS:
        where = exc.filename if exc.filename else path
        symbol = errno.errorcode.get(exc.errno, str(exc.errno))
        return StorageFailed(str(where), f"{os.strerror(exc.errno)} ({symbol})")
    return None


def commit_failure(path: str | Path, exc: BaseException) -> StorageFailed:
    """A failed ``BEGIN``/``COMMIT`` of statements that each succeeded: the storage
    refused them, whatever the code says (SQLite may already have rolled back)."""
    known = storage_failure(path, exc)
    if known is not None:
        return known
    return StorageFailed(str(path), f"{type(exc).__name__}: {exc}")
