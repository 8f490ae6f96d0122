"""Durable writes: a rename that survives a power loss and a record appended and
synced, for every file a process must find again after a crash.

Why one module: the coordinator's checkpoints and journal blobs, a site's held jobs
and algorithm state, and every saved model are written the same way — a temporary
file, written and ``fsync``-ed, then renamed over the final name. ``fsync`` of the file
makes its *contents* durable, but the rename is an entry of the *folder*: until the
folder itself is synced, a power loss can bring back the old file, or none, while a
database row committed afterwards already names the new one (POSIX ``rename(2)``,
``fsync(2)``). Two of the five writers synced the folder and three did not; they now
share these functions. It lives here because it is the lowest package that both
processes may import (``docs/design.md`` §2) and does no more than file I/O.

Appending (issue #24): a file that already exists under its final name, and whose
name is already durable, needs no temporary file, rename or folder sync to grow by one
record — :func:`append_durably` writes the record after the last one and makes it
durable with one ``fdatasync`` (which also syncs the new size, the metadata needed to
read the data back). A power loss during it can leave a *torn* tail — the record cut
short — which the reader must recognise and ignore (``participant/held_jobs.py``
frames and seals each record for that).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["append_durably", "fsync_folder", "replace_durably", "write_durably"]


def fsync_folder(folder: Path) -> None:
    """``fsync`` the folder itself, so that the names created, renamed or removed in it
    are on disk when this returns."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` (already written and ``fsync``-ed by the caller) over ``final``,
    then sync their folder: on return the new file is what ``final`` names, even after
    a power loss."""
    os.replace(tmp, final)
    fsync_folder(final.parent)


def write_durably(final: Path, parts: Iterable[bytes | memoryview]) -> None:
    """Write ``parts`` as the file ``final``, durable on return: a temporary file beside
    it (mode 0600, also where a stale one kept another mode), every part written whole
    before the next is taken from ``parts`` (a caller may reuse one buffer from part to
    part), ``fsync``, then :func:`replace_durably` — the file is absent, the old one or
    complete. The temporary file goes if any step fails."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        for part in parts:
            view = memoryview(part)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)
    try:
        replace_durably(tmp, final)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def append_durably(path: Path, data: bytes | memoryview, *, at: int) -> bool:
    """Write ``data`` at offset ``at`` of the existing file ``path`` — its end as the
    caller last made it durable — then ``fdatasync`` it: on return the file is its
    first ``at`` bytes followed by ``data``, even after a power loss. Anything found
    after ``at`` (the torn tail of an append that a crash interrupted) is cut off
    first. False, and nothing written, when the file is shorter than ``at`` (it is not
    the file the caller wrote: the caller writes it whole instead).
    FileNotFoundError when there is none."""
    fd = os.open(path, os.O_WRONLY)
    try:
        size = os.fstat(fd).st_size
        if size < at:
            return False
        if size > at:
            os.ftruncate(fd, at)
        view = memoryview(data).cast("B")
        offset = at
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return True
