"""SQLite persistence: participants, rounds, jobs, events and the audit log.

One connection, owned by one writer thread; every other thread hands it work
through a queue. Why: SQLite allows one writer at a time, and a single owner thread
means no ``database is locked`` retries, no connection shared across threads, and
natural batching — the writer runs whatever is queued and commits once, so auditing
every masked chunk costs one row insert, not one fsync. WAL mode lets an operator
read the database (``sqlite3 state.db``) while the coordinator runs.

Durability: :meth:`Store.call` returns only after the transaction holding its work
has committed, so "round 3 is complete" is on disk before round 4 starts; audit rows
(:meth:`Store.audit`) are fire-and-forget and committed with the next batch.

Power loss, not only a process crash (``[federation] durability``): a commit
survives a killed process as soon as SQLite wrote it, but an OS crash or a power cut
keeps only what was *synced*. With ``synchronous=NORMAL`` in WAL mode the WAL is
synced only at checkpoints, so a machine that lost power came back with seconds of
commits gone — among them the journal rows of a job whose masked inputs had already
left the sites: the restarted coordinator no longer knew the job, made a new one,
and every site refused it (its moments already left), burning each site's release
(``tests/integration/test_coordinator_power_loss.py``). The rule now: whatever a
caller waits for is acted on outside the coordinator (a job instruction sent, a
message acknowledged, a round begun), so a batch holding any waited work
(:meth:`call`, :meth:`submit`) commits with ``synchronous=FULL`` — its WAL frames
are synced before any waiter is told, and with them every earlier frame, the
fire-and-forget rows included. A batch of fire-and-forget rows alone
(:meth:`post`: audit rows, events, masked samples) commits with ``NORMAL``: nothing
outside has seen their effect, and the next synced commit carries them. What the
disk holds after a power loss is thus a prefix of the commits that includes every
one anything outside acted on — the same state a process crash leaves, as far as
the sites can tell. ``durability = "process-crash"`` keeps ``NORMAL`` throughout
(logged as a weakening): commits synced only at checkpoints.

State that cannot be silently lost (issue #10): every completed round and every
close checkpoint the WAL into the main file (``wal_checkpoint(TRUNCATE)``), so a
``state.db`` copied without its ``state.db-wal`` still holds every completed round;
opening runs ``PRAGMA quick_check`` and refuses a damaged, truncated or non-SQLite
file with one :class:`~spherecal.coordinator.state.state_dir.StateDamaged` line; checkpoint paths
are
stored relative to the state directory (absolute ones from older versions are
migrated when read), so a copied state directory reads its own checkpoints.

The audit log records, for every payload the coordinator receives: sender, job, stage,
kind, size and SHA-256 — never the payload itself (masked bytes are uniformly random
anyway, and plaintext updates are a deployment's own choice to allow).

Every query lives here, with the one writer thread that runs it, so no SQL that
writes is composed anywhere else in the coordinator; the table definitions and
their migrations are in :mod:`spherecal.coordinator.state.schema` (which only this
module uses).
"""

from __future__ import annotations

import contextlib
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from spherecal.coordinator.errors import StorageFailed
from spherecal.coordinator.settings import DURABILITY
from spherecal.coordinator.state.schema import SCHEMA, SCHEMA_VERSION, add_missing_columns
from spherecal.coordinator.state.state_dir import StateDamaged
from spherecal.coordinator.state.storage_faults import commit_failure, storage_failure
from spherecal.coordinator.summary_schema import RoundMetrics

__all__ = [
    "DURABILITY",
    "POWER_LOSS",
    "PROCESS_CRASH",
    "RoundRecord",
    "Store",
    "durability_warning",
]

POWER_LOSS, PROCESS_CRASH = DURABILITY
"""``power-loss`` (the default): every commit a caller waits for is synced before the
caller goes on. ``process-crash``: commits are synced only at checkpoints — a process
crash loses nothing, an OS crash or power cut may roll back the commits since the
last checkpoint."""

T = TypeVar("T")


@dataclass(frozen=True)
class RoundRecord:
    round: int
    status: str
    checkpoint_path: str | None
    checkpoint_sha256: str | None
    metrics: RoundMetrics  # a completed round's, as the driver stored it (``round_finished``)


_STOP = object()
_WAL_CHECKPOINT = object()


def _open_checked(path: Path, *, synced: bool) -> sqlite3.Connection:
    """Open ``path`` in WAL mode after ``PRAGMA quick_check``; a damaged, truncated or
    non-SQLite file raises :class:`StateDamaged` (one line, no traceback at the CLI).
    ``synced``: the schema's commits are synced (``synchronous=FULL``)."""
    existed = path.exists() and path.stat().st_size > 0
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
    try:
        if existed:
            rows = conn.execute("PRAGMA quick_check").fetchall()
            problems = [str(r[0]) for r in rows if str(r[0]) != "ok"]
            if problems:
                raise StateDamaged(
                    f"state database {path} is damaged ({len(problems)} problem(s), first: "
                    f"{problems[0][:120]}); restore it from a backup or start elsewhere"
                )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if synced else 'NORMAL'}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(SCHEMA)
        add_missing_columns(conn)
        conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StateDamaged(
            f"state database {path} is not a usable SQLite database ({exc}); restore it "
            "from a backup or start elsewhere"
        ) from None
    except BaseException:
        conn.close()
        raise
    return conn


def durability_warning(durability: str) -> str | None:
    """The line a weakened ``durability`` is logged with (``None`` at the default)."""
    if durability == POWER_LOSS:
        return None
    return (
        f'[federation] durability = "{durability}": state commits are synced to disk only '
        "at checkpoints (each completed round, the end); an OS crash or power loss may roll "
        "back the last commits, and a job the sites already released into is then asked "
        "for again and refused — its release lost"
    )


def _waited(item: Any) -> bool:
    """Whether a queued item is work a caller waits for (:meth:`Store.call`,
    :meth:`Store.submit`) rather than a fire-and-forget row or a control item."""
    return item is not _STOP and item[0] is not _WAL_CHECKPOINT and item[1] is not None


def _wal_checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """Copy the WAL into the main file and truncate it (busy, log pages, checkpointed)."""
    row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (1, -1, -1)


class Store:
    """The coordinator's database, driven by one writer thread.

    A storage fault (:mod:`~spherecal.coordinator.state.storage_faults`) on the writer
    thread fails the batch it was committing, every queued call and every later
    one with the same :class:`StorageFailed` — nothing waits forever — and calls
    ``on_failure`` once (the coordinator stops on it)."""

    def __init__(
        self,
        path: Path,
        *,
        on_failure: Callable[[StorageFailed], None] | None = None,
        durability: str = POWER_LOSS,
    ) -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, got {durability!r}")
        self.durability = durability
        """:data:`POWER_LOSS` (waited commits synced) or :data:`PROCESS_CRASH`."""
        self.commits = 0
        """Transactions committed that wrote (read-only batches are not counted)."""
        self.synced_commits = 0
        """Of :attr:`commits`, those committed with ``synchronous=FULL``."""
        self.path = Path(path)
        #: The state directory: checkpoint paths are stored relative to it.
        self.root = self.path.parent
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.on_failure = on_failure
        """Called once, from the thread that saw it, with the first storage fault."""
        self.failure: StorageFailed | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._gate = threading.Lock()  # orders "failed" against enqueueing
        self._ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, name="sqlite-writer", daemon=True)
        self._thread.start()
        self._ready.result()

    # ------------------------------------------------------------ writer thread
    def _run(self) -> None:
        try:
            conn = _open_checked(self.path, synced=self.durability == POWER_LOSS)
        except BaseException as exc:  # surface open errors to the constructor
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        try:
            self._serve(conn)
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _serve(self, conn: sqlite3.Connection) -> None:
        stop = False
        synced = self.durability == POWER_LOSS  # what _open_checked set
        while not stop:
            batch = [self._queue.get()]
            while len(batch) < 512:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done: list[tuple[Future[Any], Any]] = []
            failed: list[tuple[Future[Any], BaseException]] = []
            checkpoints: list[Future[Any]] = []
            try:
                # SQLite refuses to change the level inside a transaction: decide here.
                want = self.durability == POWER_LOSS and any(_waited(item) for item in batch)
                if want != synced:
                    conn.execute(f"PRAGMA synchronous={'FULL' if want else 'NORMAL'}")
                    synced = want
                before = conn.total_changes
                conn.execute("BEGIN")
                for item in batch:
                    if item is _STOP:
                        stop = True
                        continue
                    fn, future = item
                    if fn is _WAL_CHECKPOINT:  # runs after the commit, outside a transaction
                        checkpoints.append(future)
                        continue
                    try:
                        result = fn(conn)
                    except BaseException as error:
                        fault = storage_failure(self.path, error)
                        if fault is not None:
                            raise fault from error
                        if future is not None:
                            failed.append((future, error))
                        continue
                    if future is not None:
                        done.append((future, result))
                conn.execute("COMMIT")
                if conn.total_changes != before:
                    self.commits += 1
                    self.synced_commits += synced
            except BaseException as error:
                # SQLite may already have rolled back (SQLITE_FULL, SQLITE_IOERR):
                # a ROLLBACK outside a transaction raises, so only when one is open.
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                self._fail(commit_failure(self.path, error), batch)
                return
            for future, result in done:
                future.set_result(result)
            for future, failure in failed:
                future.set_exception(failure)
            for future in checkpoints:
                try:
                    future.set_result(_wal_checkpoint(conn))
                except sqlite3.Error as error:
                    fault = storage_failure(self.path, error)
                    future.set_exception(fault or error)
                    if fault is not None:
                        self._fail(fault, [])
                        return
        try:
            _wal_checkpoint(conn)  # at exit: the main file alone holds everything
        except sqlite3.Error as error:
            fault = storage_failure(self.path, error)
            if fault is not None:
                self.report_failure(fault)

    def _fail(self, fault: StorageFailed, batch: list[Any]) -> None:
        """End the writer: every call of ``batch``, every queued one and every later
        one fails with ``fault`` (never a caller waiting forever)."""
        self.report_failure(fault)
        pending = list(batch)
        while True:
            try:
                pending.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for item in pending:
            if item is _STOP:
                continue
            _fn, future = item
            if future is not None and not future.done():
                future.set_exception(fault)

    def report_failure(self, fault: StorageFailed) -> StorageFailed:
        """Record a storage fault in the state directory (the spool and checkpoints
        report theirs here too): later writes are refused with the first fault, and
        ``on_failure`` is called once. Returns the fault to raise."""
        with self._gate:
            first = self.failure is None
            if first:
                self.failure = fault
        if first and self.on_failure is not None:
            self.on_failure(fault)
        return self.failure if self.failure is not None else fault

    def _put(self, item: Any) -> None:
        with self._gate:
            if self.failure is not None:
                raise self.failure
            if not self._thread.is_alive():
                raise StorageFailed(str(self.path), "the database writer has stopped")
            self._queue.put(item)

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the writer thread; return after its batch committed
        (raises :class:`StorageFailed` if it could not be)."""
        return self.submit(fn).result()

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Queue ``fn(conn)`` for the writer thread now; the future is done once its
        batch committed. Calls queued from several threads before any of them waits
        commit in the order queued, in as few batches as the writer finds them —
        what :meth:`call` cannot give callers that each wait holding a lock."""
        future: Future[T] = Future()
        self._put((fn, future))
        return future

    def checkpoint_wal(self) -> tuple[int, int, int]:
        """Commit everything queued so far, then copy the WAL into ``state.db`` and
        truncate it; returns SQLite's (busy, log pages, checkpointed pages). Called at
        every completed round and at close, so the main file alone is a usable copy."""
        future: Future[tuple[int, int, int]] = Future()
        self._put((_WAL_CHECKPOINT, future))
        return future.result()

    def post(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        """Run ``fn(conn)`` on the writer thread without waiting (committed with its
        batch; raises :class:`StorageFailed` once the store has failed)."""
        self._put((fn, None))

    def close(self) -> None:
        if self._thread.is_alive():
            # Past the gate on purpose: a store that failed elsewhere (the spool)
            # still has a live writer to stop, and must not wait for it in vain.
            self._queue.put(_STOP)
            self._thread.join(timeout=10)

    # ------------------------------------------------------------ meta
    def get_meta(self, key: str) -> str | None:
        row = self.call(
            lambda c: c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        )
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.call(
            lambda c: c.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (key, value),
            )
        )

    # ------------------------------------------------------------ participants
    def pinned_keys(self) -> dict[str, bytes]:
        rows = self.call(
            lambda c: c.execute(
                "SELECT participant_id, identity_key FROM participants "
                "WHERE identity_key IS NOT NULL"
            ).fetchall()
        )
        return {str(pid): bytes(key) for pid, key in rows}

    def left_members(self) -> dict[str, str]:
        """The members that refused the federation's plan and left, with why
        (:meth:`record_left`), for a restarted coordinator's registry."""
        rows = self.call(
            lambda c: c.execute(
                "SELECT participant_id, left_reason FROM participants WHERE left_reason IS NOT NULL"
            ).fetchall()
        )
        return {str(pid): str(why) for pid, why in rows}

    def certificate_serials(self) -> dict[str, int]:
        """The serial number of the certificate each member last joined with (mutual
        TLS; rows written before 2026-11-27 have none), for a restarted coordinator's
        registry: a CRL that lists it means the member left (``Registry.revoked``)."""
        rows = self.call(
            lambda c: c.execute(
                "SELECT participant_id, certificate_serial FROM participants "
                "WHERE certificate_serial IS NOT NULL"
            ).fetchall()
        )
        return {str(pid): int(str(serial), 16) for pid, serial in rows}

    def record_left(self, participant_id: str, why: str) -> None:
        """``participant_id`` refused the federation's plan and left, for ``why``:
        kept with its row, so that a coordinator restarted during its join window
        does not wait for it again (``Registry.leave``); its next join clears it."""
        self.call(
            lambda c: c.execute(
                "UPDATE participants SET left_reason = ? WHERE participant_id = ?",
                (why, participant_id),
            )
        )

    def unpin(self, participant_id: str) -> bool:
        """Forget ``participant_id``'s pinned identity key (an operator's decision after
        a key compromise or loss), recorded as an event; True if a key was pinned."""

        def clear(c: sqlite3.Connection) -> int:
            cursor = c.execute(
                "UPDATE participants SET identity_key = NULL "
                "WHERE participant_id = ? AND identity_key IS NOT NULL",
                (participant_id,),
            )
            return int(cursor.rowcount)

        changed = self.call(clear) > 0
        if changed:
            self.event("warning", f"operator unpinned the identity key of {participant_id}")
        return changed

    def record_join(
        self,
        participant_id: str,
        index: int,
        key: bytes,
        cert_sha256: str | None,
        cert_serial: int | None = None,
    ) -> None:
        """A join: ``cert_sha256`` and ``cert_serial`` name the certificate it joined
        with (None without mutual TLS); the serial is kept as hex (up to 159 bits)."""
        now = time.time()
        serial = None if cert_serial is None else f"{cert_serial:x}"
        self.call(
            lambda c: c.execute(
                "INSERT INTO participants (participant_id, roster_index, identity_key, "
                "certificate_sha256, certificate_serial, first_joined, last_joined, joins) "
                "VALUES (?,?,?,?,?,?,?,1) "
                "ON CONFLICT(participant_id) DO UPDATE SET last_joined=excluded.last_joined, "
                "certificate_sha256=excluded.certificate_sha256, "
                "certificate_serial=excluded.certificate_serial, joins=joins+1, "
                "left_reason=NULL, "
                # Re-pins after an operator's unpin; the registry refuses a key that
                # differs from a pinned one before this is ever reached.
                "identity_key=COALESCE(participants.identity_key, excluded.identity_key)",
                (participant_id, index, key, cert_sha256, serial, now, now),
            )
        )

    # ------------------------------------------------------------ rounds
    def round_started(self, round_index: int, attempt: int) -> None:
        self.call(
            lambda c: c.execute(
                "INSERT INTO rounds (round, status, attempt, started) VALUES (?, 'running', ?, ?) "
                "ON CONFLICT(round) DO UPDATE SET status='running', attempt=excluded.attempt, "
                "started=excluded.started",
                (round_index, attempt, time.time()),
            )
        )

    def round_finished(
        self,
        round_index: int,
        status: str,
        metrics: Mapping[str, object],
        checkpoint: tuple[str, str] | None = None,
    ) -> None:
        path, digest = checkpoint if checkpoint is not None else (None, None)
        stored = None if path is None else self.relative_to_state(path)
        self.call(
            lambda c: c.execute(
                "UPDATE rounds SET status=?, finished=?, metrics=?, checkpoint_path=?, "
                "checkpoint_sha256=? WHERE round=?",
                (status, time.time(), json.dumps(metrics), stored, digest, round_index),
            )
        )
        if status == "completed":
            self.checkpoint_wal()

    def relative_to_state(self, path: str | Path) -> str:
        """``path`` as stored: relative to the state directory when inside it.

        An absolute path outside it (written by an older version into a state
        directory that was then copied) is mapped to the same file name under this
        state directory's ``checkpoints/`` — the SHA-256 recorded next to it still
        decides whether that file is the right one."""
        target = Path(path)
        root = self.root.resolve()
        resolved = target.resolve() if target.is_absolute() else (Path.cwd() / target).resolve()
        try:
            return resolved.relative_to(root).as_posix()
        except ValueError:
            pass
        if target.is_absolute() and target.parent.name == "checkpoints":
            return f"checkpoints/{target.name}"
        return str(path)

    def completed_rounds(self) -> list[RoundRecord]:
        """Completed rounds with absolute checkpoint paths under this state directory
        (stored absolute paths are migrated to relative ones on the way)."""

        def read(c: sqlite3.Connection) -> list[tuple[Any, ...]]:
            rows = c.execute(
                "SELECT round, status, checkpoint_path, checkpoint_sha256, metrics FROM rounds "
                "WHERE status='completed' ORDER BY round"
            ).fetchall()
            for r, _s, p, _d, _m in rows:
                if p is not None and Path(p).is_absolute():
                    c.execute(
                        "UPDATE rounds SET checkpoint_path=? WHERE round=?",
                        (self.relative_to_state(p), r),
                    )
            return list(rows)

        rows = self.call(read)
        out = []
        for r, s, p, d, m in rows:
            if p is not None and Path(p).is_absolute():
                p = self.relative_to_state(p)
            path = None if p is None else str(self.root / p)
            out.append(RoundRecord(int(r), str(s), path, d, json.loads(m or "{}")))
        return out

    # ------------------------------------------------------------ jobs
    def job_created(
        self,
        job_id: str,
        purpose: str,
        round_index: int | None,
        participants: list[str],
        threshold: int,
        vector_length: int,
        spec_sha256: str,
    ) -> None:
        self.call(
            lambda c: c.execute(
                "INSERT INTO jobs (job_id, purpose, round, status, created, participants, "
                "threshold, vector_length, spec_sha256) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    job_id,
                    purpose,
                    round_index,
                    "running",
                    time.time(),
                    json.dumps(participants),
                    threshold,
                    vector_length,
                    spec_sha256,
                ),
            )
        )

    def job_finished(
        self,
        job_id: str,
        status: str,
        *,
        contributors: list[str] | None = None,
        dropouts: list[str] | None = None,
        excluded: list[str] | None = None,
        error: str | None = None,
    ) -> None:
        self.call(
            lambda c: c.execute(
                "UPDATE jobs SET status=?, finished=?, contributors=?, dropouts=?, excluded=?, "
                "error=? WHERE job_id=?",
                (
                    status,
                    time.time(),
                    json.dumps(contributors or []),
                    json.dumps(dropouts or []),
                    json.dumps(excluded or []),
                    error,
                    job_id,
                ),
            )
        )

    # ------------------------------------------------------------ audit + events
    def audit(
        self,
        *,
        sender: str,
        job: str | None,
        stage: str,
        kind: str,
        nbytes: int,
        sha256: str,
        status: str = "accepted",
        code: str | None = None,
        detail: str | None = None,
    ) -> None:
        row = (time.time(), sender, job, stage, kind, nbytes, sha256, status, code, detail)
        self.post(
            lambda c: c.execute(
                "INSERT INTO audit (ts, sender, job, stage, kind, bytes, sha256, status, code, "
                "detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
                row,
            )
        )

    def revealed_shares(self, job: str, holder: str, shares: list[tuple[str, str]]) -> None:
        """Which kinds of secret shares ``holder`` revealed, per owner, at unmasking (the
        audit checks no owner had both its self-mask seed and its mask key revealed)."""
        now = time.time()
        rows = [(job, holder, owner, kind, now) for owner, kind in shares]
        self.post(
            lambda c: c.executemany(
                "INSERT OR IGNORE INTO revealed_shares (job, holder, owner, kind, ts) "
                "VALUES (?,?,?,?,?)",
                rows,
            )
        )

    def masked_sample(self, job: str, sender: str, purpose: str | None, sample: bytes) -> None:
        """A bounded prefix of one masked upload (uniformly random bytes if masking
        works; the audit tests that, and that masks are not reused across jobs)."""
        row = (job, sender, purpose, time.time(), sample)
        self.post(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO masked_samples (job, sender, purpose, ts, sample) "
                "VALUES (?,?,?,?,?)",
                row,
            )
        )

    def dp_release(
        self,
        job_id: str,
        kind: str,
        plan: dict[str, Any],
        contributors: list[str],
        charge: dict[str, Any],
    ) -> None:
        """The public inputs and realised noise of one DP release (for the audit)."""
        row = (
            job_id,
            kind,
            time.time(),
            json.dumps(plan, sort_keys=True),
            json.dumps(contributors),
            json.dumps(charge, sort_keys=True),
        )
        self.call(
            lambda c: c.execute(
                "INSERT OR REPLACE INTO dp_releases (job_id, kind, ts, plan_json, contributors, "
                "charge_json) VALUES (?,?,?,?,?,?)",
                row,
            )
        )

    def policy_event(
        self,
        *,
        type: str,
        participant: str,
        job: str | None,
        purpose: str | None,
        kind: str,
        rule: str | None,
        reason: str,
        complainants: tuple[str, ...] | None = None,
    ) -> None:
        """A participant's typed refusal (``type`` ``refusal``) or its exclusion by the
        coordinator (``exclusion``, with the participants whose signed complaints
        excluded it), for ``spherecal audit`` and a resumed coordinator."""
        named = None if complainants is None else json.dumps(list(complainants))
        row = (time.time(), type, participant, job, purpose, kind, rule, reason, named)
        self.post(
            lambda c: c.execute(
                "INSERT INTO policy_events (ts, type, participant, job, purpose, kind, rule, "
                "reason, complainants) VALUES (?,?,?,?,?,?,?,?,?)",
                row,
            )
        )

    def event(self, level: str, message: str) -> None:
        row = (time.time(), level, message)
        self.post(
            lambda c: c.execute("INSERT INTO events (ts, level, message) VALUES (?,?,?)", row)
        )

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Read-only helper for tests and reports."""
        return self.call(lambda c: c.execute(sql, params).fetchall())
