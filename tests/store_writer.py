"""A child process that writes to a coordinator's store and then waits, or dies
without closing it: the state directory a live coordinator, or a killed one, leaves
(its rows in ``state.db-wal`` alone). Read-only inspections are tested on both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["start_writer"]

REPOSITORY = Path(__file__).resolve().parents[1]


def start_writer(script: str, *args: str) -> subprocess.Popen[str]:
    """Run ``script`` (Python source; its arguments in ``sys.argv[1:]``) in a child
    process from the repository root, its stdin and stdout piped: the script prints
    ``ready`` once it has written, then waits for stdin to close (or exits at once,
    without closing its store, to play a kill)."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPOSITORY,
    )
