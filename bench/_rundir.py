"""Where a bench script's runs write their state, logs and data — and when it goes.

Why: a run of ``bench/ffc_stage.py`` leaves ~400 MB of state folders (journals, held
masked inputs, the synthetic dataset), and it left them in the temporary folder after
every invocation: ninety-one of them held 35 GB of a development machine's disk. So a benchmark's
run directory is removed when the benchmark ends, unless the user named one to keep
(``--workdir``/``--keep``/``--out``), the benchmark raised, or it found something worth
reading (a run that failed: :meth:`RunDirectory.keep`) — then its path is printed, so
the logs are there to read.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType

__all__ = ["RunDirectory", "add_run_directory_option"]


def add_run_directory_option(
    parser: argparse.ArgumentParser, flag: str, *, kept_when: str, purpose: str = ""
) -> None:
    """The option that names a run directory to keep (``--workdir``, ``--keep``, ...),
    with one wording of the default in every script's ``--help``."""
    parser.add_argument(
        flag,
        type=Path,
        default=None,
        help=f"keep the run directories here{purpose} (by default a temporary folder, "
        f"removed at the end unless {kept_when})",
    )


class RunDirectory:
    """A context manager for one benchmark's run directory.

    ``RunDirectory(None, prefix="spherecal-ffc-stage-")`` makes a fresh temporary
    folder and removes it on a clean exit; ``RunDirectory(path, ...)`` uses ``path``
    (made if missing) and never removes it. A temporary folder is kept — and its path
    printed to stderr — when the block raises (a ``KeyboardInterrupt`` excepted: the
    user stopped it) or after :meth:`keep` was called."""

    def __init__(self, chosen: Path | None, *, prefix: str) -> None:
        self._chosen = chosen
        self._prefix = prefix
        self._reasons: list[str] = []
        self._path: Path | None = None

    def keep(self, reason: str) -> None:
        """Keep the temporary folder after the benchmark, saying ``reason`` (e.g. "run 3
        failed") with its path."""
        self._reasons.append(reason)

    def kept_path(self) -> str | None:
        """The folder's path if it outlives the benchmark as things stand (named, or
        :meth:`keep` called), else ``None`` — what a report should name."""
        if self._path is None:
            return None
        return str(self._path) if (self._chosen is not None or self._reasons) else None

    def __enter__(self) -> Path:
        if self._chosen is not None:
            self._chosen.mkdir(parents=True, exist_ok=True)
            self._path = self._chosen
        else:
            self._path = Path(tempfile.mkdtemp(prefix=self._prefix))
        return self._path

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._chosen is not None or self._path is None:
            return
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            self._reasons.append(f"the benchmark raised {exc_type.__name__}")
        if self._reasons:
            why = "; ".join(self._reasons)
            print(f"[bench] run directory kept ({why}): {self._path}", file=sys.stderr)
            return
        shutil.rmtree(self._path, ignore_errors=True)
