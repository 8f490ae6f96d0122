"""Durable file replacement: a rename that survives a power loss, for every file a
process must find again after a crash.

Why one module: the coordinator's checkpoints and journal blobs, a site's held jobs
and algorithm state, and every saved model are written the same way — a temporary
file, written and ``fsync``-ed, then renamed over the final name. ``fsync`` of the file
makes its *contents* durable, but the rename is an entry of the *folder*: until the
folder itself is synced, a power loss can bring back the old file, or none, while a
database row committed afterwards already names the new one (POSIX ``rename(2)``,
``fsync(2)``). Two of the five writers synced the folder and three did not; they now
share these two functions. It lives here because it is the lowest package that both
processes may import (``docs/design.md`` §2) and does no more than file I/O.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_folder", "replace_durably"]


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
