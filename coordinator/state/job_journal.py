"""The secure jobs' journal: what a restarted coordinator needs to *continue* a job
instead of asking the sites for a second release (issue #20).

Why: a site counts every value it releases (its release ledger,
:mod:`spherecal.participant.release_ledger`) and refuses a second update for a round
or a second set of moments for a model. A coordinator that lost a job in a crash and
asked again would therefore lose that release for good — and would be asking for
exactly what a differencing attack asks for. So every job is durable from its first
message: the job instruction (spec and directory) is written before anyone sees it;
every participant message the job accepts is written before its sender hears "OK";
when the masked stage closes, its (still masked) sum and survivors are written; when
the job aggregates, the result is written before anything is done with it. A
restarted coordinator replays the journal into a fresh ``crypto.SecAggServer`` —
the state machine is deterministic in its messages — and continues at the stage it
reached; the sites, which keep their job sessions across the coordinator's restart,
answer the remaining stages from what they already sent (an identical resend, never a
second masked input: :mod:`spherecal.participant.secure_jobs`).

A job is found again by its *slot* — what the driver was computing (``update:r3``,
``ffc``, ``evaluate:test:final:<digest>``) — not by its random id, which the
restarted driver cannot know. A failed job is not resumed (the driver's retry makes a
new one, as before the crash).

The two vector-sized payloads, the masked sum and the result, are files beside the
database (:mod:`spherecal.coordinator.state.journal_blobs`), durable before the row
that names them by SHA-256; rows written inline by an earlier version still read.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.state.journal_blobs import BLOB_FOLDER, JournalBlobs
from spherecal.coordinator.state.store import Store

__all__ = ["JobJournal", "JournalEntry", "JournaledJob", "JournaledResult"]

MESSAGE = "message"
CLOSE = "close"
MASKED_CLOSED = "masked-closed"
MASKED_CLOSED_BLOB = "masked-closed-blob"
"""The masked stage's close with its sum in a blob (``data``: the blob's SHA-256,
hex); :meth:`JobJournal.find` hands it on as a :data:`MASKED_CLOSED` entry."""
RESULT_BLOB = "result"


def _masked_blob(job_id: str, seq: int) -> str:
    """The blob of the masked sum journaled as entry ``seq`` of ``job_id``."""
    return JournalBlobs.name(job_id, f"masked-{seq}")


def _result_blob(job_id: str) -> str:
    """The blob of ``job_id``'s result."""
    return JournalBlobs.name(job_id, RESULT_BLOB)


@dataclass(frozen=True)
class JournalEntry:
    """One journaled event: a participant message (``stage`` code, ``sender``,
    ``data``), a stage close, or the masked stage's close with its sum."""

    kind: str
    stage: int | None
    sender: str | None
    data: bytes | None


@dataclass(frozen=True)
class JournaledResult:
    contributors: tuple[str, ...]
    dropouts: tuple[str, ...]
    excluded: tuple[str, ...]
    values: npt.NDArray[np.float64]


@dataclass(frozen=True)
class JournaledJob:
    job_id: str
    slot: str
    purpose: str
    round: int | None
    job: bytes
    """The serialized ``pb.SecAggJob`` with the whole directory the job was made with."""
    first_stage_s: float
    state: str
    entries: tuple[JournalEntry, ...]
    result: JournaledResult | None


class JobJournal:
    """The journal of one coordinator database (calls go through the store's single
    writer thread; each returns after its write committed)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._seq: dict[str, int] = {}
        self.blobs = JournalBlobs(store.root / BLOB_FOLDER, report=store.report_failure)

    def sweep(self) -> list[str]:
        """Delete the blobs no row names any more (a process killed between a blob
        and its row, or between a row's deletion and its blob's); returns their
        names. Called once when a coordinator opens its state directory."""

        def read(c: sqlite3.Connection) -> tuple[set[str], set[str]]:
            known = {str(r[0]) for r in c.execute("SELECT job_id FROM job_journal_jobs")}
            referenced = {
                _masked_blob(str(job), seq)
                for job, seq in c.execute(
                    "SELECT job_id, seq FROM job_journal WHERE kind = ?", (MASKED_CLOSED_BLOB,)
                )
            }
            referenced |= {
                _result_blob(str(r[0]))
                for r in c.execute("SELECT job_id FROM job_results WHERE length(value_bytes) = 0")
            }
            return known, referenced

        known, referenced = self.store.call(read)
        return self.blobs.sweep(known, referenced)

    # ------------------------------------------------------------ writing
    def created(
        self,
        *,
        job_id: str,
        slot: str,
        purpose: str,
        round_index: int | None,
        job: bytes,
        first_stage_s: float,
    ) -> None:
        self._seq[job_id] = 0
        self.store.call(
            lambda c: c.execute(
                "INSERT INTO job_journal_jobs (job_id, slot, purpose, round, job, "
                "first_stage_s, state, created) VALUES (?,?,?,?,?,?,?,?)",
                (job_id, slot, purpose, round_index, job, first_stage_s, "running", time.time()),
            )
        )

    def resumed(self, job_id: str, entries: int) -> None:
        """A replayed job continues its sequence after its ``entries`` entries."""
        self._seq[job_id] = entries

    def append(
        self,
        job_id: str,
        kind: str,
        *,
        stage: int | None = None,
        sender: str | None = None,
        data: bytes | None = None,
    ) -> None:
        self.queue(job_id, kind, stage=stage, sender=sender, data=data).result()

    def queue(
        self,
        job_id: str,
        kind: str,
        *,
        stage: int | None = None,
        sender: str | None = None,
        data: bytes | None = None,
    ) -> Future[Any]:
        """Take the entry's place in the job's sequence and queue its write; the
        future is done once it committed. Entries queued in sequence order commit in
        that order (the store's single writer), so a caller may queue under its job's
        lock and wait after releasing it."""
        seq = self._seq.get(job_id, 0)
        self._seq[job_id] = seq + 1
        return self.store.submit(
            lambda c: c.execute(
                "INSERT INTO job_journal (job_id, seq, kind, stage, sender, data) "
                "VALUES (?,?,?,?,?,?)",
                (job_id, seq, kind, stage, sender, data),
            )
        )

    def message(self, job_id: str, stage: int, sender: str, data: bytes) -> None:
        self.append(job_id, MESSAGE, stage=stage, sender=sender, data=data)

    def message_queued(self, job_id: str, stage: int, sender: str, data: bytes) -> Future[Any]:
        """:meth:`message`, waited for by the caller (:meth:`queue`)."""
        return self.queue(job_id, MESSAGE, stage=stage, sender=sender, data=data)

    def closed(self, job_id: str, stage: int) -> None:
        self.append(job_id, CLOSE, stage=stage)

    def masked_closed(
        self, job_id: str, survivors: list[str], total: npt.NDArray[np.unsignedinteger]
    ) -> None:
        """The masked stage closed over ``survivors`` with the (still masked) sum
        ``total``: the sum goes to a blob, durable before its row is committed."""
        seq = self._seq.get(job_id, 0)
        little = np.ascontiguousarray(total, dtype=total.dtype.newbyteorder("<"))
        digest = self.blobs.write(_masked_blob(job_id, seq), little.data)
        self.append(
            job_id,
            MASKED_CLOSED_BLOB,
            sender=json.dumps(sorted(survivors)),
            data=digest.encode("ascii"),
        )

    def finished(
        self,
        job_id: str,
        state: str,
        *,
        contributors: tuple[str, ...] = (),
        dropouts: tuple[str, ...] = (),
        excluded: tuple[str, ...] = (),
        values: npt.NDArray[np.float64] | None = None,
    ) -> None:
        """The job's end; a done job's result (a blob, durable first) is recorded in
        the same transaction that drops the job's messages; the masked sum's blob is
        deleted after it committed."""
        digest = None
        if values is not None:
            little = np.ascontiguousarray(values, dtype="<f8")
            digest = self.blobs.write(_result_blob(job_id), little.data)

        def write(c: sqlite3.Connection) -> list[str]:
            if digest is not None:
                c.execute(
                    "INSERT OR REPLACE INTO job_results (job_id, contributors, dropouts, "
                    "excluded, value_bytes, sha256) VALUES (?,?,?,?,?,?)",
                    (
                        job_id,
                        json.dumps(list(contributors)),
                        json.dumps(list(dropouts)),
                        json.dumps(list(excluded)),
                        b"",  # empty: the values are the blob (an inline row has them here)
                        digest,
                    ),
                )
            masked = [
                _masked_blob(job_id, seq)
                for (seq,) in c.execute(
                    "SELECT seq FROM job_journal WHERE job_id = ? AND kind = ?",
                    (job_id, MASKED_CLOSED_BLOB),
                )
            ]
            c.execute("UPDATE job_journal_jobs SET state = ? WHERE job_id = ?", (state, job_id))
            c.execute("DELETE FROM job_journal WHERE job_id = ?", (job_id,))
            return masked

        self.blobs.delete(self.store.call(write))
        self._seq.pop(job_id, None)

    def discard_results(self, slot: str) -> None:
        """Drop the aggregates of ``slot``'s jobs once what they fed is durable
        elsewhere (a round's checkpoint): a restart no longer needs them, and a long
        federation would otherwise keep one model-sized vector per round. The job
        rows stay (state ``done``), so the slot is not continued again."""

        def write(c: sqlite3.Connection) -> list[str]:
            blobs = [
                _result_blob(str(job))
                for (job,) in c.execute(
                    "SELECT job_id FROM job_results WHERE length(value_bytes) = 0 AND job_id IN "
                    "(SELECT job_id FROM job_journal_jobs WHERE slot = ?)",
                    (slot,),
                )
            ]
            c.execute(
                "DELETE FROM job_results WHERE job_id IN "
                "(SELECT job_id FROM job_journal_jobs WHERE slot = ?)",
                (slot,),
            )
            c.execute(
                "UPDATE job_journal_jobs SET state = 'consumed' WHERE slot = ? AND state = 'done'",
                (slot,),
            )
            return blobs

        self.blobs.delete(self.store.call(write))

    # ------------------------------------------------------------ reading
    def find(self, slot: str) -> JournaledJob | None:
        """The latest job of ``slot`` still to continue — running, or done with its
        result kept — if any (a failed or consumed one is not). Blobs are read and
        checked here, outside the writer thread; a missing or altered one raises
        :class:`~spherecal.coordinator.state.journal_blobs.BlobCorrupt` (a
        ``ValueError``, as a corrupt inline result does)."""

        def read(c: sqlite3.Connection) -> _Rows | None:
            row = c.execute(
                "SELECT job_id, slot, purpose, round, job, first_stage_s, state "
                "FROM job_journal_jobs WHERE slot = ? AND state IN ('running', 'done') "
                "ORDER BY created DESC LIMIT 1",
                (slot,),
            ).fetchone()
            if row is None:
                return None
            entries = c.execute(
                "SELECT seq, kind, stage, sender, data FROM job_journal WHERE job_id = ? "
                "ORDER BY seq",
                (str(row[0]),),
            ).fetchall()
            res = c.execute(
                "SELECT contributors, dropouts, excluded, value_bytes, sha256 "
                "FROM job_results WHERE job_id = ?",
                (str(row[0]),),
            ).fetchone()
            return _Rows(tuple(row), entries, None if res is None else tuple(res))

        rows = self.store.call(read)
        return None if rows is None else self._job(rows)

    def _job(self, rows: _Rows) -> JournaledJob:
        row = rows.job
        job_id = str(row[0])
        entries = []
        for seq, kind, stage, sender, data in rows.entries:
            payload = None if data is None else bytes(data)
            if kind == MASKED_CLOSED_BLOB:
                assert payload is not None
                name = _masked_blob(job_id, seq)
                kind, payload = MASKED_CLOSED, self.blobs.read(name, payload.decode("ascii"))
            entries.append(
                JournalEntry(str(kind), None if stage is None else int(stage), sender, payload)
            )
        result = None
        if rows.result is not None:
            contributors, dropouts, excluded, value_bytes, sha256 = rows.result
            raw = bytes(value_bytes)
            if not raw:  # the values are a blob
                raw = self.blobs.read(_result_blob(job_id), str(sha256))
            elif hashlib.sha256(raw).hexdigest() != sha256:
                raise ValueError(f"job {job_id[:8]}: its journaled result is corrupt")
            result = JournaledResult(
                tuple(json.loads(contributors)),
                tuple(json.loads(dropouts)),
                tuple(json.loads(excluded)),
                np.frombuffer(raw, dtype="<f8").astype(np.float64),
            )
        return JournaledJob(
            job_id,
            str(row[1]),
            str(row[2]),
            None if row[3] is None else int(row[3]),
            bytes(row[4]),
            float(row[5]),
            str(row[6]),
            tuple(entries),
            result,
        )


@dataclass(frozen=True)
class _Rows:
    """What :meth:`JobJournal.find` reads in one transaction, blobs still unread."""

    job: tuple[Any, ...]
    entries: list[tuple[Any, ...]]
    result: tuple[Any, ...] | None
