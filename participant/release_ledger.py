"""The participant's release ledger: each calibration statistic at most once per
federation and per model, each evaluation at most once per (model, heads).

Why: secure aggregation hides one input inside a sum, but two sums over the same
statistic and model that differ by one participant give that participant's
statistics exactly (differencing). A malicious coordinator can arrange that by
asking twice with different rosters, so the participant — the party at stake —
counts its own releases, in its state directory (``state_dir/privacy.db``, table
``releases``), so a restart does not reset the count.

When a release counts (the choice, and its residual risk, in ``docs/privacy.md``):
a job is *reserved* when the participant admits the task and *consumed* the moment
its input leaves — right before the first masked chunk (secure) or the plaintext
upload/report. A job that failed before that (a peer dealt forged shares, a dropout
before masking, a refusal) consumed nothing, so the coordinator's retry with a fresh
job id for the same statistic and model is admitted. A job that failed after this
participant's masked input left counts as a release: its input may be in a sum the
coordinator can unmask with other holders' shares, so a retry is refused (fail safe).
Consuming re-checks the rule atomically, so two concurrent jobs for one statistic
cannot both be released.

Keys: statistics kinds (``ffc``, ``ccvr``, any other) are unique per
``(kind, federation)`` *and* per ``(kind, model digest)`` — a renamed federation
does not reset a model, a new model does not reset a federation. Evaluations
(kind ``evaluate``) are unique per digest of model and heads: a federation evaluates
many models (one per ``federated_every`` round), each once.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from spherecal.participant.policy import ReleaseRepeated

__all__ = ["EVALUATE", "ReleaseLedger"]

EVALUATE = "evaluate"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    participant TEXT NOT NULL,
    job         TEXT NOT NULL,
    kind        TEXT NOT NULL,
    federation  TEXT NOT NULL,
    digest      BLOB NOT NULL,
    state       TEXT NOT NULL,
    reserved    REAL NOT NULL,
    released    REAL,
    PRIMARY KEY (participant, job)
);
"""


class ReleaseLedger:
    """Reserve-then-consume ledger of releases (thread-safe, durable, autocommit)."""

    def __init__(self, path: Path, *, participant: str = "", enforce: bool = True) -> None:
        self.path = path
        self.participant = participant
        """Whose releases (one state directory may, in tests, serve several ids)."""
        self.enforce = enforce
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    @property
    def _conn(self) -> sqlite3.Connection:
        """Opened on first use (a participant that never releases creates no file)."""
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30.0
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _conflict(self, kind: str, federation: str, digest: bytes, job: str) -> str | None:
        params: tuple[object, ...]
        if kind == EVALUATE:
            where, params = "digest = ?", (digest,)
        else:
            where, params = "(federation = ? OR digest = ?)", (federation, digest)
        row = self._conn.execute(
            f"SELECT job, federation, digest FROM releases WHERE participant = ? AND kind = ? "
            f"AND state = 'released' AND job != ? AND {where} LIMIT 1",
            (self.participant, kind, job, *params),
        ).fetchone()
        if row is None:
            return None
        same = "model" if bytes(row[2]) == digest else f"federation {row[1]!r}"
        return (
            f"{kind} was already released for this {same} (job {str(row[0])[:16]}); "
            "this participant releases each statistic once per federation and per model"
            if kind != EVALUATE
            else f"this model and these heads were already evaluated (job {str(row[0])[:16]})"
        )

    def reserve(self, *, kind: str, federation: str, digest: bytes, job: str) -> None:
        """Admit a task (nothing leaves yet); raise :class:`ReleaseRepeated` when the
        statistic was already released."""
        with self._lock:
            if self.enforce:
                conflict = self._conflict(kind, federation, digest, job)
                if conflict is not None:
                    raise ReleaseRepeated(conflict)
            self._conn.execute(
                "INSERT OR IGNORE INTO releases (participant, job, kind, federation, digest, "
                "state, reserved) VALUES (?, ?, ?, ?, ?, 'reserved', ?)",
                (self.participant, job, kind, federation, bytes(digest), time.time()),
            )

    def consume(self, job: str) -> None:
        """The input of ``job`` is about to leave: re-check and record it, atomically.
        Idempotent for one job (a retried upload); unknown jobs are a no-op."""
        with self._lock:
            row = self._conn.execute(
                "SELECT kind, federation, digest, state FROM releases WHERE participant = ? "
                "AND job = ?",
                (self.participant, job),
            ).fetchone()
            if row is None or row[3] == "released":
                return
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if self.enforce:
                    conflict = self._conflict(str(row[0]), str(row[1]), bytes(row[2]), job)
                    if conflict is not None:
                        raise ReleaseRepeated(conflict)
                self._conn.execute(
                    "UPDATE releases SET state = 'released', released = ? WHERE participant = ? "
                    "AND job = ?",
                    (time.time(), self.participant, job),
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def released(self) -> list[tuple[str, str, str]]:
        """(job, kind, federation) of every consumed release (tests, audit)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT job, kind, federation FROM releases WHERE participant = ? "
                "AND state = 'released' ORDER BY released",
                (self.participant,),
            ).fetchall()
        return [(str(a), str(b), str(c)) for a, b, c in rows]
