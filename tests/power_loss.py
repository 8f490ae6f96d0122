"""A faithful power loss of one SQLite database, for tests on real processes.

Why: a process crash (SIGKILL) loses nothing SQLite has committed, but an OS crash or
a power cut loses every write that was not yet *synced* — with ``synchronous=NORMAL``
in WAL mode, every commit since the WAL was last synced (at a checkpoint). Killing a
process cannot show that; this module can. ``tests/fsync_snapshot.c``, preloaded
into the process under test (``LD_PRELOAD``), copies each file of a watched folder at
every successful ``fsync``/``fdatasync`` of it: the copies are what the disk is sure
to hold. :func:`lose_power` puts them back in place of the database and its WAL after
the process is killed, which is the worst an OS crash may leave (written but unsynced
pages may or may not reach the disk; SQLite's recovery keeps the longest valid
prefix of WAL frames, so "none of them" is the outcome to defend against). Files the
process syncs itself before use (the job journal's blobs, checkpoints) stay as they
are, as do every other process's files: a site's state lives on another machine.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("fsync_snapshot.c")
DATABASE_FILES = ("state.db", "state.db-wal")


def build_shim(folder: Path) -> Path:
    """Compile the shim into ``folder``; skips the test where no C compiler runs."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the fsync shim")
    target = folder / "fsync_snapshot.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(target), str(SOURCE), "-ldl"],
        check=True,
        capture_output=True,
    )
    return target


@dataclass(frozen=True)
class PowerLoss:
    """The shim watching ``watched`` (a folder, resolved), copies in ``snapshot``."""

    shim: Path
    watched: Path
    snapshot: Path

    @classmethod
    def prepare(cls, work: Path, watched: Path) -> PowerLoss:
        work.mkdir(parents=True, exist_ok=True)
        snapshot = work / "synced"
        snapshot.mkdir(exist_ok=True)
        watched.mkdir(parents=True, exist_ok=True)
        return cls(build_shim(work), watched.resolve(), snapshot)

    def env(self) -> dict[str, str]:
        """The environment of a process whose syncs are recorded."""
        return {
            "LD_PRELOAD": str(self.shim),
            "SPHERECAL_FSYNC_WATCH": str(self.watched),
            "SPHERECAL_FSYNC_SNAPSHOT": str(self.snapshot),
        }

    def synced(self) -> list[tuple[str, str, int]]:
        """Every sync seen so far: (call, file name, size it had)."""
        log = self.snapshot / "fsync.log"
        if not log.exists():
            return []
        out = []
        for line in log.read_text().splitlines():
            op, name, size = line.split()
            out.append((op, name, int(size)))
        return out

    def lose_power(self) -> None:
        """After the process is dead: the database and its WAL as of their last sync;
        the shared-memory index goes (it does not outlive a reboot)."""
        for name in DATABASE_FILES:
            copy, live = self.snapshot / name, self.watched / name
            if copy.exists():
                shutil.copyfile(copy, live)
            else:  # never synced: nothing of it is sure to be on disk
                live.unlink(missing_ok=True)
        (self.watched / "state.db-shm").unlink(missing_ok=True)
