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
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.state.store import Store

__all__ = ["JobJournal", "JournalEntry", "JournaledJob", "JournaledResult"]

MESSAGE = "message"
CLOSE = "close"
MASKED_CLOSED = "masked-closed"


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
        seq = self._seq.get(job_id, 0)
        self._seq[job_id] = seq + 1
        self.store.call(
            lambda c: c.execute(
                "INSERT INTO job_journal (job_id, seq, kind, stage, sender, data) "
                "VALUES (?,?,?,?,?,?)",
                (job_id, seq, kind, stage, sender, data),
            )
        )

    def message(self, job_id: str, stage: int, sender: str, data: bytes) -> None:
        self.append(job_id, MESSAGE, stage=stage, sender=sender, data=data)

    def closed(self, job_id: str, stage: int) -> None:
        self.append(job_id, CLOSE, stage=stage)

    def masked_closed(
        self, job_id: str, survivors: list[str], total: npt.NDArray[np.unsignedinteger]
    ) -> None:
        self.append(
            job_id,
            MASKED_CLOSED,
            sender=json.dumps(sorted(survivors)),
            data=np.ascontiguousarray(total).astype(total.dtype.newbyteorder("<")).tobytes(),
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
        """The job's end; a done job's result is written in the same transaction."""

        def write(c: sqlite3.Connection) -> None:
            if values is not None:
                raw = np.ascontiguousarray(values, dtype="<f8").tobytes()
                c.execute(
                    "INSERT OR REPLACE INTO job_results (job_id, contributors, dropouts, "
                    "excluded, value_bytes, sha256) VALUES (?,?,?,?,?,?)",
                    (
                        job_id,
                        json.dumps(list(contributors)),
                        json.dumps(list(dropouts)),
                        json.dumps(list(excluded)),
                        raw,
                        hashlib.sha256(raw).hexdigest(),
                    ),
                )
            c.execute("UPDATE job_journal_jobs SET state = ? WHERE job_id = ?", (state, job_id))
            c.execute("DELETE FROM job_journal WHERE job_id = ?", (job_id,))

        self.store.call(write)
        self._seq.pop(job_id, None)

    def discard_results(self, slot: str) -> None:
        """Drop the aggregates of ``slot``'s jobs once what they fed is durable
        elsewhere (a round's checkpoint): a restart no longer needs them, and a long
        federation would otherwise keep one model-sized vector per round. The job
        rows stay (state ``done``), so the slot is not continued again."""

        def write(c: sqlite3.Connection) -> None:
            c.execute(
                "DELETE FROM job_results WHERE job_id IN "
                "(SELECT job_id FROM job_journal_jobs WHERE slot = ?)",
                (slot,),
            )
            c.execute(
                "UPDATE job_journal_jobs SET state = 'consumed' WHERE slot = ? AND state = 'done'",
                (slot,),
            )

        self.store.call(write)

    # ------------------------------------------------------------ reading
    def find(self, slot: str) -> JournaledJob | None:
        """The latest job of ``slot`` still to continue — running, or done with its
        result kept — if any (a failed or consumed one is not)."""

        def read(c: sqlite3.Connection) -> JournaledJob | None:
            row = c.execute(
                "SELECT job_id, slot, purpose, round, job, first_stage_s, state "
                "FROM job_journal_jobs WHERE slot = ? AND state IN ('running', 'done') "
                "ORDER BY created DESC LIMIT 1",
                (slot,),
            ).fetchone()
            if row is None:
                return None
            job_id = str(row[0])
            entries = tuple(
                JournalEntry(
                    str(k), None if st is None else int(st), snd, None if d is None else bytes(d)
                )
                for k, st, snd, d in c.execute(
                    "SELECT kind, stage, sender, data FROM job_journal WHERE job_id = ? "
                    "ORDER BY seq",
                    (job_id,),
                )
            )
            result = None
            res = c.execute(
                "SELECT contributors, dropouts, excluded, value_bytes, sha256 "
                "FROM job_results WHERE job_id = ?",
                (job_id,),
            ).fetchone()
            if res is not None:
                raw = bytes(res[3])
                if hashlib.sha256(raw).hexdigest() != res[4]:
                    raise ValueError(f"job {job_id[:8]}: its journaled result is corrupt")
                result = JournaledResult(
                    tuple(json.loads(res[0])),
                    tuple(json.loads(res[1])),
                    tuple(json.loads(res[2])),
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
                entries,
                result,
            )

        return self.store.call(read)
