"""What a coordinator's state directory holds, and the checks before it is used.

A state directory is ``state.db`` (+ ``state.db-wal`` while open), ``checkpoints/``
(the global vector after the latest rounds), ``spool/``, ``journal/`` (the secure
jobs' journaled sums, ``journal_blobs``) and ``federation.json`` — a
small marker naming the federation id, written *outside* SQLite when a federation
starts. Why the marker: if ``state.db`` is restored or copied without its WAL, or
replaced by another file, the database may no longer know the federation its
checkpoints belong to; without the marker the coordinator would silently start a
new federation next to them (issue #10). :func:`guard_federation_start` refuses
that unless the operator says ``--new-federation``, and then sets the old files
aside rather than deleting them.

:func:`inspect_state` backs ``spherecal coordinator --check-state``: it opens the
database read-only, creating and changing no file beside it (as ``spherecal audit``
does, :mod:`spherecal.coordinator.state.read_only`), runs ``PRAGMA quick_check`` and
reports the federation id, its status, completed rounds (and whether each checkpoint
file is present and matches its recorded SHA-256), jobs and the privacy ledger —
without starting anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spherecal.coordinator.state.read_only import read_only

__all__ = [
    "MARKER_NAME",
    "StateConflict",
    "StateDamaged",
    "StateReport",
    "format_report",
    "guard_federation_start",
    "inspect_state",
    "read_marker",
    "write_marker",
]

MARKER_NAME = "federation.json"
DATABASE_NAME = "state.db"


class StateDamaged(ValueError):
    """The state database is not SQLite, is truncated or fails its integrity check."""


class StateConflict(ValueError):
    """The state directory holds files of a federation the database does not know
    (or of a different one); starting would silently mix or lose them."""


def read_marker(state_dir: Path) -> str | None:
    """The federation id named by ``federation.json`` (None when there is none)."""
    path = state_dir / MARKER_NAME
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        fid = data["federation_id"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StateDamaged(
            f"{path} is unreadable ({exc}); it should name a federation id"
        ) from None
    if not isinstance(fid, str) or not fid:
        raise StateDamaged(f"{path} names no federation id")
    return fid


def write_marker(state_dir: Path, federation_id: str) -> None:
    """Record ``federation_id`` next to the database (atomic replace)."""
    path = state_dir / MARKER_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"federation_id": federation_id, "written": time.time()}) + "\n",
        encoding="utf-8",
    )
    os.replace(tmp, path)


def _checkpoint_files(state_dir: Path) -> list[Path]:
    return sorted((state_dir / "checkpoints").glob("round-*.pt"))


def guard_federation_start(
    state_dir: Path,
    known_federation: str | None,
    *,
    new_federation: bool,
    say: Callable[[str], None],
) -> None:
    """Refuse to start over another federation's files (see the module docstring).

    ``known_federation`` is the id ``state.db`` holds (None: the database is new or
    lost its contents). With ``new_federation`` the orphaned checkpoints and marker
    are moved to ``set-aside-<time>/`` (never deleted) and a new federation may start.
    """
    marker = read_marker(state_dir)
    if known_federation is not None:
        if new_federation:
            raise StateConflict(
                f"{state_dir / DATABASE_NAME} holds federation {known_federation}; "
                "--new-federation never discards a federation the database knows — "
                "use a fresh state_dir (or drop --new-federation to resume it)"
            )
        if marker is not None and marker != known_federation:
            raise StateConflict(
                f"{state_dir / DATABASE_NAME} holds federation {known_federation} but "
                f"{MARKER_NAME} names {marker}: the database and the files beside it come "
                "from different federations; restore the matching state.db"
            )
        return
    orphans = _checkpoint_files(state_dir)
    if marker is None and not orphans:
        return
    what = []
    if orphans:
        what.append(f"{len(orphans)} round checkpoint(s)")
    if marker is not None:
        what.append(f"federation {marker} ({MARKER_NAME})")
    held = " and ".join(what)
    if not new_federation:
        raise StateConflict(
            f"{state_dir} holds {held} that {DATABASE_NAME} does not know (a database "
            f"copied or restored without its {DATABASE_NAME}-wal?); refusing to start a new "
            "federation over them — restore the matching state.db and state.db-wal, or pass "
            "--new-federation to set them aside"
        )
    aside = state_dir / f"set-aside-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    aside.mkdir(parents=True)
    if orphans:
        (state_dir / "checkpoints").rename(aside / "checkpoints")
    if marker is not None:
        (state_dir / MARKER_NAME).rename(aside / MARKER_NAME)
    say(f"--new-federation: set aside {held} in {aside}")


# ---------------------------------------------------------------------- inspection
@dataclass
class StateReport:
    """What ``--check-state`` prints (also returned as JSON-able data)."""

    state_dir: str
    database_bytes: int
    wal_bytes: int
    federation_id: str | None
    status: str | None
    marker_federation_id: str | None
    rounds_completed: int
    rounds: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[str, int] = field(default_factory=dict)
    participants: list[str] = field(default_factory=list)
    ledger: dict[str, float] = field(default_factory=dict)
    ledger_entries: int = 0
    audit_rows: int = 0
    problems: list[str] = field(default_factory=list)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,))
    return row.fetchone() is not None


def inspect_state(state_dir: Path) -> StateReport:
    """Read ``state_dir`` without changing it; raise :class:`StateDamaged` for a
    database that is not usable SQLite or fails ``quick_check``, and
    ``FileNotFoundError`` where there is none: ``--check-state`` is asked of a
    directory that should hold a federation (before a restart, a backup, a copy), so a
    missing database — a fresh directory or a config naming the wrong one — is exit 2,
    not an "ok" a script would take as a state to resume."""
    db = state_dir / DATABASE_NAME
    if not db.exists():
        raise FileNotFoundError(
            f"no coordinator state at {db}: no federation has run with this state_dir, or "
            "[federation] state_dir names another directory (nothing to check)"
        )
    wal = db.with_name(DATABASE_NAME + "-wal")
    report = StateReport(
        state_dir=str(state_dir),
        database_bytes=db.stat().st_size,
        wal_bytes=wal.stat().st_size if wal.exists() else 0,
        federation_id=None,
        status=None,
        marker_federation_id=read_marker(state_dir),
        rounds_completed=0,
    )
    try:
        # Not a bare ``mode=ro``: on a WAL database that creates and leaves
        # state.db-wal/-shm beside a checkpointed database, and rewrites the -shm beside
        # a killed coordinator's -wal -- a check before a backup or a copy changed what
        # it checked. read_only creates and changes nothing in the directory.
        with read_only(db) as conn:
            problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check") if str(r[0]) != "ok"]
            if problems:
                raise StateDamaged(
                    f"state database {db} is damaged ({len(problems)} problem(s), first: "
                    f"{problems[0][:120]})"
                )
            _read_contents(conn, state_dir, report)
    except sqlite3.DatabaseError as exc:
        raise StateDamaged(f"state database {db} is not a usable SQLite database ({exc})") from None
    except sqlite3.Error as exc:
        raise StateDamaged(f"cannot open {db}: {exc}") from None
    orphans = _checkpoint_files(state_dir)
    if report.federation_id is None and (orphans or report.marker_federation_id):
        report.problems.append(
            f"{len(orphans)} checkpoint(s) / marker {report.marker_federation_id} but the "
            "database knows no federation: a start would be refused (see --new-federation)"
        )
    elif (
        report.marker_federation_id is not None
        and report.federation_id is not None
        and report.marker_federation_id != report.federation_id
    ):
        report.problems.append(
            f"{MARKER_NAME} names {report.marker_federation_id}, the database "
            f"{report.federation_id}"
        )
    return report


def _read_contents(conn: sqlite3.Connection, state_dir: Path, report: StateReport) -> None:
    if not _has_table(conn, "meta"):
        return
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    report.federation_id = meta.get("federation_id")
    report.status = meta.get("status")
    if _has_table(conn, "rounds"):
        rows = conn.execute(
            "SELECT round, status, checkpoint_path, checkpoint_sha256 FROM rounds ORDER BY round"
        ).fetchall()
        for r, status, path, sha in rows:
            entry: dict[str, Any] = {"round": int(r) + 1, "status": status}
            if path is not None:
                target = Path(path)
                if target.is_absolute() and not target.exists():
                    target = state_dir / "checkpoints" / target.name
                elif not target.is_absolute():
                    target = state_dir / target
                entry["checkpoint"] = path
                if not target.exists():
                    entry["checkpoint_state"] = "missing (pruned or lost)"
                else:
                    entry["checkpoint_state"] = "ok" if _sha256(target) == sha else "MISMATCH"
            report.rounds.append(entry)
        report.rounds_completed = sum(1 for e in report.rounds if e["status"] == "completed")
        last = [e for e in report.rounds if e["status"] == "completed"][-1:]
        for entry in report.rounds:
            if entry.get("checkpoint_state", "").startswith("missing") and entry not in last:
                entry["checkpoint_state"] = "pruned (only the latest are kept)"
        if last and last[0].get("checkpoint_state") not in ("ok", None):
            report.problems.append(
                f"the last completed round's checkpoint is {last[0]['checkpoint_state']}: "
                "the federation cannot resume"
            )
    if _has_table(conn, "jobs"):
        for purpose, status, count in conn.execute(
            "SELECT purpose, status, COUNT(*) FROM jobs GROUP BY purpose, status"
        ):
            report.jobs[f"{purpose}/{status}"] = int(count)
    if _has_table(conn, "participants"):
        report.participants = [
            str(p) for (p,) in conn.execute("SELECT participant_id FROM participants ORDER BY 1")
        ]
    if _has_table(conn, "privacy_ledger"):
        for subject, total, count in conn.execute(
            "SELECT subject, SUM(epsilon), COUNT(*) FROM privacy_ledger GROUP BY subject"
        ):
            report.ledger[str(subject)] = float(total)
            report.ledger_entries += int(count)
    if _has_table(conn, "audit"):
        report.audit_rows = int(conn.execute("SELECT COUNT(*) FROM audit").fetchone()[0])


def format_report(report: StateReport) -> str:
    """The human-readable lines ``--check-state`` prints."""
    lines = [
        f"state directory  {report.state_dir}",
        f"database         state.db {report.database_bytes} bytes, WAL {report.wal_bytes} "
        "bytes, quick_check ok",
        f"federation       {report.federation_id or '(none yet)'}"
        + (f" — {report.status}" if report.status else ""),
        f"marker           {report.marker_federation_id or '(none)'}",
        f"rounds completed {report.rounds_completed}",
    ]
    for entry in report.rounds:
        state = entry.get("checkpoint_state")
        lines.append(
            f"  round {entry['round']:>4}  {entry['status']:<10}"
            + (f" checkpoint {state}" if state else "")
        )
    jobs = ", ".join(f"{k} {v}" for k, v in sorted(report.jobs.items())) or "(none)"
    lines.append(f"jobs             {jobs}")
    lines.append(f"participants     {', '.join(report.participants) or '(none joined)'}")
    if report.ledger:
        spent = ", ".join(f"{s} ε={e:.4g}" for s, e in sorted(report.ledger.items()))
        lines.append(f"privacy ledger   {report.ledger_entries} entries: {spent}")
    else:
        lines.append("privacy ledger   (empty)")
    lines.append(f"audit rows       {report.audit_rows}")
    for problem in report.problems:
        lines.append(f"PROBLEM          {problem}")
    return "\n".join(lines)
