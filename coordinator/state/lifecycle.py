"""A finished federation's state directory is read-only to a restarted coordinator.

Why (issue #23): restarted on a federation that had completed, the coordinator
"resumed after round 40" and waited; stopped, it overwrote ``summary.json`` with
``failed`` and null accuracies, and sites that rejoined refused to release again and
ended it ``degraded`` with a misleading reason. A federation that ended — its
database records ``completed``, ``degraded`` or ``failed`` (a stop by SIGTERM or a
storage fault records ``stopped`` and *is* resumed) — is over:

- :func:`finished_federation` reads the database **read-only**, creating and
  changing no file beside it (:mod:`~spherecal.coordinator.state.read_only`, before
  the coordinator's store opens and migrates it; until 2026-11-27 a bare ``mode=ro``,
  which rewrote a crashed coordinator's ``state.db-shm`` even where the federation
  had ended and nothing was to be written) and says whether it ended;
- without ``--new-federation`` the coordinator reports the stored result
  (:func:`stored_result`: its ``summary.json`` when that names the same federation,
  else what the database holds) and exits with its status — nothing written;
- with ``--new-federation`` :func:`set_aside_finished` moves the finished
  federation's files — ``state.db`` (and its WAL), ``checkpoints/``, ``spool/``,
  ``journal/``, ``federation.json``, and the result files in ``out_dir`` (summary,
  models and heads, saved statistics, the ``spherecal report`` page) — into
  ``set-aside-<UTC time>/`` beside them, never deleting, and says so in the log; a
  new federation then starts in the emptied directory.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from spherecal.coordinator.state.read_only import read_only
from spherecal.coordinator.summary_schema import EndedResult, SummaryDocument

__all__ = [
    "ENDED_STATUSES",
    "Finished",
    "finished_federation",
    "kept_meta",
    "set_aside_finished",
    "stored_result",
]

ENDED_STATUSES = frozenset({"completed", "degraded", "failed"})
"""Statuses a federation ends with; ``stopped`` (SIGTERM, storage fault) resumes."""

STATE_FILES = ("state.db", "state.db-wal", "state.db-shm", "federation.json")
STATE_DIRS = ("checkpoints", "spool", "journal")
RESULT_FILES = ("summary.json", "model_spec.json", "classifiers.pt", "report.html")
#: ``statistics_*.npz``: ``[calibration] save_statistics``; ``report.html``: what
#: ``spherecal report OUT_DIR`` draws there. Left behind, either would sit beside the
#: new federation's results as if they were its own.
RESULT_PATTERNS = ("model_*.pt", "head_*.pt", "statistics_*.npz")


@dataclass(frozen=True)
class Finished:
    """A federation whose database says it ended."""

    federation_id: str
    status: str
    database: Path


def finished_federation(state_dir: Path) -> Finished | None:
    """The ended federation in ``state_dir``, or None (no database, a new one, a
    federation still running or stopped to be resumed). Opens nothing for writing;
    a database it cannot read is left for the store to diagnose."""
    database = state_dir / "state.db"
    rows = _meta(database, ("status", "federation_id"))
    status, federation_id = rows.get("status"), rows.get("federation_id")
    if status not in ENDED_STATUSES or not federation_id:
        return None
    return Finished(federation_id=str(federation_id), status=str(status), database=database)


def stored_result(finished: Finished, out_dir: Path) -> SummaryDocument | EndedResult:
    """The result to report: ``out_dir/summary.json`` when it is this federation's
    (read, never rewritten), else the database's status with the reason it gives."""
    path = out_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        summary = None
    if isinstance(summary, dict) and summary.get("federation_id") == finished.federation_id:
        return cast(SummaryDocument, summary)  # the file our writer wrote for this federation
    return {
        "federation_id": finished.federation_id,
        "status": finished.status,
        "status_reasons": [
            f"{path} is missing or belongs to another federation; the status is the "
            f"one recorded in {finished.database}"
        ],
        "accuracy": None,
        "errors": [],
        "warnings": [],
    }


def kept_meta(folder: Path, keys: Collection[str]) -> dict[str, str]:
    """``keys`` of the ``meta`` table of the database set aside in ``folder`` (those it
    holds), opened read-only: what a new federation in the same state directory
    carries over from the one before (:func:`set_aside_finished`). A database that
    cannot be read gives nothing."""
    return _meta(folder / "state.db", keys)


def _meta(database: Path, keys: Collection[str]) -> dict[str, str]:
    """``keys`` of ``database``'s ``meta`` table (those it holds), read without
    changing a file (:func:`read_only`); nothing for a database that is missing or
    cannot be read (left for the store to diagnose)."""
    if not keys or not database.is_file():
        return {}
    marks = ", ".join("?" for _ in keys)
    try:
        with read_only(database) as conn:
            rows = conn.execute(
                f"SELECT key, value FROM meta WHERE key IN ({marks})", tuple(keys)
            ).fetchall()
    except (sqlite3.Error, OSError):
        return {}
    return {str(key): str(value) for key, value in rows}


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _move_into(paths: list[Path], folder: Path) -> list[str]:
    moved = []
    for path in paths:
        if path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            path.rename(folder / path.name)
            moved.append(path.name)
    return moved


def set_aside_finished(
    finished: Finished, state_dir: Path, out_dir: Path, say: Callable[[str], None]
) -> Path:
    """Move the finished federation's files into ``set-aside-<time>/`` folders (the
    state's in ``state_dir``, the results' in ``out_dir``) so that a new federation
    starts clean and the old one stays whole; returns the state's folder."""
    stamp = _stamp()
    state_folder = state_dir / f"set-aside-{stamp}"
    moved = _move_into(
        [state_dir / n for n in STATE_FILES] + [state_dir / n for n in STATE_DIRS], state_folder
    )
    results = [out_dir / n for n in RESULT_FILES]
    for pattern in RESULT_PATTERNS:
        results.extend(sorted(out_dir.glob(pattern)))
    out_folder = out_dir / f"set-aside-{stamp}"
    moved_results = _move_into(results, out_folder)
    say(
        f"WARNING: --new-federation: federation {finished.federation_id} had ended "
        f"{finished.status}; its state ({', '.join(moved)}) was moved to {state_folder}"
        + (
            f" and its results ({', '.join(moved_results)}) to {out_folder}"
            if moved_results
            else ""
        )
        + "; starting a NEW federation in this state directory"
    )
    return state_folder
