"""Check that an output path can be written *before* any work starts.

A run that trains for an hour and then cannot write its result has lost the hour.
Every command that writes (``reference --json``, ``simulate --out``, ``predict --out``,
a participant's ``out_dir``) calls these first: they create the directories, write and
remove a probe file, and turn whatever the OS says into one :class:`OutputPathError`
line naming the path and the reason (under a regular file, permission denied, ...).
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

__all__ = ["OutputPathError", "check_output_dir", "check_output_file"]


class OutputPathError(ValueError):
    """An output path that cannot be written (checked before any work)."""


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOTDIR:
        return "a parent is not a directory"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    return exc.strerror or type(exc).__name__


def _file_ancestor(path: Path) -> Path | None:
    """The first existing ancestor of ``path`` that is not a directory, if any."""
    for parent in [*reversed(path.parents)]:
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def check_output_dir(path: Path, *, what: str = "output directory") -> Path:
    """Create ``path`` (and parents) and prove it is writable; returns it."""
    blocker = _file_ancestor(path / "x")
    if blocker is not None:
        raise OutputPathError(f"cannot use {what} {path}: {blocker} is a regular file")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{secrets.token_hex(4)}"
        with open(probe, "wb") as fh:
            fh.write(b"\0")
        probe.unlink()
    except FileExistsError:
        raise OutputPathError(f"cannot use {what} {path}: it is not a directory") from None
    except OSError as exc:
        raise OutputPathError(f"cannot write {what} {path}: {_reason(exc)}") from None
    return path


def check_output_file(path: Path, *, what: str = "output file") -> Path:
    """Prove ``path`` can be created or replaced (its directory made, a probe written
    next to it); the file itself is not created. Returns it."""
    blocker = _file_ancestor(path)
    if blocker is not None:
        raise OutputPathError(f"cannot write {what} {path}: {blocker} is a regular file")
    if path.is_dir():
        raise OutputPathError(f"cannot write {what} {path}: it is a directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"cannot write {what} {path}: permission denied")
    try:
        check_output_dir(path.parent, what=what)
    except OutputPathError as exc:
        raise OutputPathError(str(exc).replace(f"{what} {path.parent}", f"{what} {path}")) from None
    return path
