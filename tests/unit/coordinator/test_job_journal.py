"""The secure-job journal (issue #20): a coordinator that dies at any point of a job
and restarts on its database continues *the same job* — same id, same spec, the
stage it reached — and ends with exactly the sum an uninterrupted job gives, while
every participant sends each message at most once in content (a resend is the same
bytes, acknowledged) and never a second, different masked input.

The participants here are the protocol's own state machines
(``crypto.SecAggParticipant``) with the one thing a site adds around them: what it
sent is kept and sent again, identical, when asked again (``SecureSession``). The
crash is the coordinator's test-only halt hook raising at the named point, right
after the journal write that point follows; the "restart" is a new ``Store`` on the
same SQLite file and a job rebuilt from its journal.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.halts import HALT_POINTS
from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.coordinator.driver.stages import continue_journaled_job, with_first_cause
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.settings import SecAggSettings
from spherecal.coordinator.state.job_journal import MASKED_CLOSED_BLOB, JobJournal
from spherecal.coordinator.state.journal_blobs import (
    BLOB_FOLDER,
    CONCURRENT_DIGEST_BYTES,
    BlobCorrupt,
    JournalBlobs,
)
from spherecal.coordinator.state.store import Store
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import public_key_bytes

N = 4
LENGTH = 300
SLOT = "ffc"


class Crash(Exception):
    """The coordinator process dies here."""


class Site:
    """One participant: the protocol state machine plus a record of what it sent."""

    def __init__(self, client: crypto.SecAggParticipant, vector: np.ndarray) -> None:
        self.client = client
        client.set_input(vector)
        self.sent: dict[int, bytes] = {}
        self.uploads: list[str] = []  # SHA-256 of every masked input it streamed

    def message(self, stage: int, request: bytes | None) -> bytes:
        if stage in self.sent:  # asked again: the same bytes (SecureSession.respond)
            return self.sent[stage]
        c = self.client
        if stage == pb.ADVERTISE:
            out = c.advertise_keys().to_bytes()
        elif stage == pb.SHARE:
            assert request is not None
            out = c.share_keys(crypto.KeyRoster.from_bytes(request)).to_bytes()
        elif stage == pb.CONSISTENCY:
            assert request is not None
            out = c.consistency_signature(crypto.ConsistencyRequest.from_bytes(request)).to_bytes()
        else:
            assert request is not None
            out = c.unmask(crypto.UnmaskRequest.from_bytes(request)).to_bytes()
        self.sent[stage] = out
        return out

    def upload(self, job: SecureJob, pid: str, bundle: bytes) -> None:
        if self.client.stage is crypto.ParticipantStage.RECEIVE_SHARES:
            self.client.receive_shares(crypto.ShareBundle.from_bytes(bundle))
        chunks = [chunk.to_bytes() for chunk in self.client.masked_chunks()]
        self.uploads.append(hashlib.sha256(b"".join(chunks)).hexdigest())
        job.begin_upload(pid)
        try:
            for chunk in chunks:
                job.absorb(pid, chunk)
        finally:
            job.end_upload(pid)


def _settings() -> SecAggSettings:
    return SecAggSettings(threshold=3, chunk_entries=64, consistency_check=True)


def _new_job(tmp: Path, halt: object) -> tuple[SecureJob, Store, dict[str, Site], np.ndarray]:
    ids = [f"p{k}" for k in range(N)]
    identities = {p: crypto.generate_identity() for p in ids}
    keys = {p: public_key_bytes(k) for p, k in identities.items()}
    store = Store(tmp / "state.db")
    journal = JobJournal(store)
    job = SecureJob(
        purpose="ffc",
        round_index=None,
        participants=ids,
        identity_keys=keys,
        directory=[pb.DirectoryEntry(participant_id=p, identity_public_key=keys[p]) for p in ids],
        settings=_settings(),
        length=LENGTH,
        bound=10.0,
        first_stage_s=60.0,
        stage_s=60.0,
        journal=journal,
        halt=halt,  # type: ignore[arg-type]
    )
    journal.created(
        job_id=job.job_hex,
        slot=SLOT,
        purpose="ffc",
        round_index=None,
        job=job.journal_message(),
        first_stage_s=60.0,
    )
    ledger = crypto.MemoryJobLedger()
    rng = np.random.default_rng(7)
    inputs = {p: rng.uniform(-5, 5, LENGTH) for p in ids}
    sites = {
        p: Site(
            crypto.SecAggParticipant(
                job.spec,
                p,
                identities[p],
                {e.participant_id: e.identity_public_key for e in job.job_message(p).directory},
                ledger=ledger,
            ),
            inputs[p],
        )
        for p in ids
    }
    return job, store, sites, np.sum(list(inputs.values()), axis=0)


def _send(job: SecureJob, pid: str, stage: int, data: bytes) -> None:
    """Submit as a site does: ALREADY_EXISTS (an identical resend) is delivered."""
    try:
        job.submit(pid, stage, data)  # type: ignore[arg-type]
    except ServiceError as exc:
        if exc.code is not grpc.StatusCode.ALREADY_EXISTS:
            raise


def _drive(job: SecureJob, sites: dict[str, Site]) -> None:
    """Every site answers whatever the job asks of it now (a redelivered task first
    resends its advertisement), then the stage closes; until the job ends."""
    alive = frozenset(sites)
    for _ in range(20):
        if job.outcome is not None:
            return
        for pid, site in sorted(sites.items()):
            if not job.has_advertised(pid):
                _send(job, pid, pb.ADVERTISE, site.message(pb.ADVERTISE, None))
            step = job.step_for(pid)
            if step is None:
                continue
            if step.stage == pb.MASKED:
                site.upload(job, pid, bytes(step.message))
            else:
                _send(job, pid, step.stage, site.message(step.stage, bytes(step.message)))
        job.advance(alive)
    raise AssertionError(f"the job did not end: {job.stage_name}")


def _halting_at(point: str) -> object:
    def halt(reached: str, purpose: str, job: SecureJob) -> None:
        if reached == point:
            raise Crash(point)

    return halt


def test_an_uninterrupted_job_with_a_journal_sums_exactly(tmp_path: Path) -> None:
    job, store, sites, expected = _new_job(tmp_path, None)
    _drive(job, sites)
    assert job.outcome is not None and job.outcome.status == "done"
    np.testing.assert_allclose(np.asarray(job.outcome.values), expected, rtol=0, atol=1e-6)
    # a finished job keeps only its result: its messages are dropped from the journal
    assert store.query("SELECT COUNT(*) FROM job_journal") == [(0,)]
    found = JobJournal(store).find(SLOT)
    assert found is not None and found.state == "done" and found.result is not None
    store.close()


@pytest.mark.parametrize("point", HALT_POINTS)
def test_a_crash_at_every_point_continues_the_same_job_to_the_same_sum(
    tmp_path: Path, point: str
) -> None:
    job, store, sites, expected = _new_job(tmp_path / "a", _halting_at(point))
    with pytest.raises(Crash):
        _drive(job, sites)
    store.close()  # the process is gone; its database is what is left

    again = Store(tmp_path / "a" / "state.db")
    journal = JobJournal(again)
    record = journal.find(SLOT)
    assert record is not None and record.job_id == job.job_hex
    resumed = continue_journaled_job(record, settings=_settings(), stage_s=60.0, journal=journal)
    assert resumed.job_id == job.job_id and resumed.spec_bytes == job.spec_bytes
    if point == "aggregated":
        assert resumed.outcome is not None  # the result was written before it was used
    _drive(resumed, sites)
    outcome = resumed.outcome
    assert outcome is not None and outcome.status == "done", outcome
    assert outcome.contributors == tuple(sorted(sites))

    # the same sum, bit for bit, as an uninterrupted job over the same inputs
    clean, clean_store, clean_sites, _ = _new_job(tmp_path / "b", None)
    _drive(clean, clean_sites)
    clean_store.close()
    assert clean.outcome is not None
    assert np.array_equal(np.asarray(outcome.values), np.asarray(clean.outcome.values))
    np.testing.assert_allclose(np.asarray(outcome.values), expected, rtol=0, atol=1e-6)
    # no site ever streamed two different masked inputs
    for pid, site in sites.items():
        assert len(set(site.uploads)) <= 1, (pid, site.uploads)
    again.close()


def test_an_identical_resend_is_acknowledged_and_a_different_one_refused(
    tmp_path: Path,
) -> None:
    job, store, sites, _ = _new_job(tmp_path, None)
    advert = sites["p0"].message(pb.ADVERTISE, None)
    job.submit("p0", pb.ADVERTISE, advert)
    with pytest.raises(ServiceError) as info:  # the same bytes: "already there"
        job.submit("p0", pb.ADVERTISE, advert)
    assert info.value.code is grpc.StatusCode.ALREADY_EXISTS
    for pid in ("p1", "p2", "p3"):
        job.submit(pid, pb.ADVERTISE, sites[pid].message(pb.ADVERTISE, None))
    job.advance(frozenset(sites))
    assert job.stage_name == "share"
    with pytest.raises(ServiceError) as info:  # after the stage closed: still "there"
        job.submit("p0", pb.ADVERTISE, advert)
    assert info.value.code is grpc.StatusCode.ALREADY_EXISTS
    other = crypto.AdvertiseKeys.from_bytes(advert)
    forged = other.to_bytes()[:-1] + bytes([other.to_bytes()[-1] ^ 1])
    with pytest.raises(ServiceError) as info:  # a different one: the stage is over
        job.submit("p0", pb.ADVERTISE, forged)
    assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
    store.close()


def test_a_failed_job_is_not_continued(tmp_path: Path) -> None:
    job, store, sites, _ = _new_job(tmp_path, None)
    for pid in ("p0", "p1"):  # fewer than the threshold advertise
        job.submit(pid, pb.ADVERTISE, sites[pid].message(pb.ADVERTISE, None))
    job.advance(frozenset({"p0", "p1"}))
    assert job.outcome is not None and job.outcome.status == "failed"
    assert JobJournal(store).find(SLOT) is None
    store.close()


def test_a_failed_job_names_the_withdrawals_before_the_shortfall(tmp_path: Path) -> None:
    job, store, sites, _ = _new_job(tmp_path, None)
    for pid in ("p0", "p1"):
        job.submit(pid, pb.ADVERTISE, sites[pid].message(pb.ADVERTISE, None))
    job.withdraw("p2", "POLICY_REFUSAL/RULE_RELEASE_REPEATED: the update already left")
    job.withdraw("p3", "POLICY_REFUSAL/RULE_RELEASE_REPEATED: the update already left")
    job.advance(frozenset(sites))
    assert job.outcome is not None and job.outcome.status == "failed"
    assert "TooFewSurvivors" in str(job.outcome.error)
    assert with_first_cause("failed", job.outcome.dropped) == (
        "failed — first cause: p2, p3 withdrew at advertise: "
        "POLICY_REFUSAL/RULE_RELEASE_REPEATED: the update already left"
    )
    store.close()


def test_a_consumed_result_is_dropped_and_not_continued_again(tmp_path: Path) -> None:
    job, store, sites, _ = _new_job(tmp_path, None)
    _drive(job, sites)
    journal = JobJournal(store)
    assert store.query("SELECT COUNT(*) FROM job_results") == [(1,)]
    journal.discard_results(SLOT)  # e.g. the round's checkpoint is committed
    assert store.query("SELECT COUNT(*) FROM job_results") == [(0,)]
    assert journal.find(SLOT) is None
    assert store.query("SELECT state FROM job_journal_jobs") == [("consumed",)]
    store.close()


# ---------------------------------------------------------------- blobs (issue #24)
def _blob_names(root: Path) -> list[str]:
    folder = root / BLOB_FOLDER
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _drive_to_unmask(job: SecureJob, sites: dict[str, Site]) -> None:
    """Drive the job until its masked stage closed (the masked sum is journaled)."""
    for _ in range(10):
        if job.stage_name in ("consistency", "unmask"):
            return
        for pid, site in sorted(sites.items()):
            if not job.has_advertised(pid):
                _send(job, pid, pb.ADVERTISE, site.message(pb.ADVERTISE, None))
            step = job.step_for(pid)
            if step is None:
                continue
            if step.stage == pb.MASKED:
                site.upload(job, pid, bytes(step.message))
            else:
                _send(job, pid, step.stage, site.message(step.stage, bytes(step.message)))
        job.advance(frozenset(sites))
    raise AssertionError(f"the masked stage did not close: {job.stage_name}")


def test_the_masked_sum_and_the_result_are_blobs_named_by_their_rows(tmp_path: Path) -> None:
    job, store, sites, expected = _new_job(tmp_path, None)
    _drive_to_unmask(job, sites)
    # the masked stage's sum: a file whose SHA-256 the row records, not the row itself
    (row,) = store.query("SELECT seq, data FROM job_journal WHERE kind = ?", (MASKED_CLOSED_BLOB,))
    name = JournalBlobs.name(job.job_hex, f"masked-{row[0]}")
    assert _blob_names(tmp_path) == [name]
    blob = (tmp_path / BLOB_FOLDER / name).read_bytes()
    assert len(blob) == LENGTH * job.spec.entry_bytes
    assert bytes(row[1]).decode() == hashlib.sha256(blob).hexdigest()
    _, total = job.server.masked_snapshot()
    assert blob == np.ascontiguousarray(total, dtype=total.dtype.newbyteorder("<")).tobytes()

    _drive(job, sites)
    assert job.outcome is not None and job.outcome.status == "done"
    # the result replaces it: a blob of the exact float64 values; the masked sum's is gone
    result = JournalBlobs.name(job.job_hex, "result")
    assert _blob_names(tmp_path) == [result]
    assert store.query("SELECT length(value_bytes) FROM job_results") == [(0,)]
    values = np.frombuffer((tmp_path / BLOB_FOLDER / result).read_bytes(), dtype="<f8")
    assert np.array_equal(values, np.asarray(job.outcome.values))
    found = JobJournal(store).find(SLOT)
    assert found is not None and found.result is not None
    assert np.array_equal(found.result.values, np.asarray(job.outcome.values))
    np.testing.assert_allclose(found.result.values, expected, rtol=0, atol=1e-6)

    JobJournal(store).discard_results(SLOT)  # consumed: the blob goes with its row
    assert _blob_names(tmp_path) == []
    store.close()


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_a_missing_or_altered_blob_is_refused_not_used(tmp_path: Path, damage: str) -> None:
    job, store, sites, _ = _new_job(tmp_path, None)
    _drive_to_unmask(job, sites)
    (name,) = _blob_names(tmp_path)
    path = tmp_path / BLOB_FOLDER / name
    if damage == "missing":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[5] ^= 1
        path.write_bytes(bytes(data))
    with pytest.raises(BlobCorrupt):
        JobJournal(store).find(SLOT)
    store.close()


def test_no_row_is_committed_when_its_blob_could_not_be_written(tmp_path: Path) -> None:
    """The blob is durable before its row: a failed blob write leaves no row naming
    it (were the row written first, a crash between would leave a row whose sum is
    lost, and the job could not be continued)."""
    job, store, sites, _ = _new_job(tmp_path, None)
    (tmp_path / BLOB_FOLDER).write_bytes(b"")  # a file where the folder goes: writes fail
    with pytest.raises(OSError):
        _drive_to_unmask(job, sites)
    assert store.query(
        "SELECT COUNT(*) FROM job_journal WHERE kind IN (?, ?)",
        (MASKED_CLOSED_BLOB, "masked-closed"),
    ) == [(0,)]
    store.close()


@pytest.mark.parametrize(
    "size",
    [100, CONCURRENT_DIGEST_BYTES - 8, CONCURRENT_DIGEST_BYTES, 3 * CONCURRENT_DIGEST_BYTES + 8],
)
def test_a_blob_is_named_by_the_sha256_of_its_bytes_whichever_thread_hashes_it(
    tmp_path: Path, size: int
) -> None:
    """Below ``CONCURRENT_DIGEST_BYTES`` the digest is computed inline, from it on
    beside the write: the same SHA-256 of the same bytes either way, and the blob
    reads back under it (a float64 vector, as the result is handed over)."""
    values = np.random.default_rng(size).standard_normal(size // 8).astype("<f8")
    blobs = JournalBlobs(tmp_path / BLOB_FOLDER)
    digest = blobs.write("j.result.blob", values.data)
    assert digest == hashlib.sha256(values.tobytes()).hexdigest()
    assert blobs.read("j.result.blob", digest) == values.tobytes()


def test_a_large_blob_that_cannot_be_written_leaves_no_digest_thread(tmp_path: Path) -> None:
    (tmp_path / BLOB_FOLDER).write_bytes(b"")  # a file where the folder goes: writes fail
    blobs = JournalBlobs(tmp_path / BLOB_FOLDER)
    with pytest.raises(OSError):
        blobs.write("j.result.blob", bytes(8 * CONCURRENT_DIGEST_BYTES))
    assert [t for t in threading.enumerate() if t.name == "blob-digest"] == []


def test_sweep_removes_only_orphaned_blobs_of_known_jobs(tmp_path: Path) -> None:
    job, store, sites, _ = _new_job(tmp_path, None)
    _drive_to_unmask(job, sites)
    folder = tmp_path / BLOB_FOLDER
    (kept,) = _blob_names(tmp_path)
    orphan = JournalBlobs.name(job.job_hex, "masked-99")  # written, row never committed
    stale = f".{JournalBlobs.name(job.job_hex, 'result')}.123.tmp"  # killed mid-write
    foreign = JournalBlobs.name("ab" * 16, "result")  # a job this database does not know
    for name in (orphan, stale, foreign):
        (folder / name).write_bytes(b"x")
    assert sorted(JobJournal(store).sweep()) == sorted([orphan, stale])
    assert _blob_names(tmp_path) == sorted([kept, foreign])
    store.close()


def test_rows_written_inline_by_an_earlier_version_still_read(tmp_path: Path) -> None:
    job, store, sites, _ = _new_job(tmp_path, None)
    _drive(job, sites)
    assert job.outcome is not None
    raw = np.asarray(job.outcome.values, dtype="<f8").tobytes()
    store.call(
        lambda c: c.execute(
            "UPDATE job_results SET value_bytes = ?, sha256 = ?",
            (raw, hashlib.sha256(raw).hexdigest()),
        )
    )
    (tmp_path / BLOB_FOLDER / JournalBlobs.name(job.job_hex, "result")).unlink()
    found = JobJournal(store).find(SLOT)
    assert found is not None and found.result is not None
    assert np.array_equal(found.result.values, np.asarray(job.outcome.values))
    store.close()


def test_a_masked_sum_written_inline_by_an_earlier_version_still_continues(
    tmp_path: Path,
) -> None:
    job, store, sites, _ = _new_job(tmp_path / "a", None)
    _drive_to_unmask(job, sites)
    store.close()
    again = Store(tmp_path / "a" / "state.db")
    (seq, digest) = again.query(
        "SELECT seq, data FROM job_journal WHERE kind = ?", (MASKED_CLOSED_BLOB,)
    )[0]
    blob = tmp_path / "a" / BLOB_FOLDER / JournalBlobs.name(job.job_hex, f"masked-{seq}")
    inline = blob.read_bytes()
    assert hashlib.sha256(inline).hexdigest() == bytes(digest).decode()
    again.call(
        lambda c: c.execute(
            "UPDATE job_journal SET kind = 'masked-closed', data = ? WHERE seq = ?", (inline, seq)
        )
    )
    blob.unlink()
    journal = JobJournal(again)
    record = journal.find(SLOT)
    assert record is not None
    resumed = continue_journaled_job(record, settings=_settings(), stage_s=60.0, journal=journal)
    _drive(resumed, sites)
    clean, clean_store, clean_sites, _ = _new_job(tmp_path / "b", None)
    _drive(clean, clean_sites)
    clean_store.close()
    assert resumed.outcome is not None and clean.outcome is not None
    assert np.array_equal(np.asarray(resumed.outcome.values), np.asarray(clean.outcome.values))
    again.close()


def _block_writer(store: Store) -> tuple[threading.Event, threading.Event]:
    """Hold the store's writer thread inside a write until ``release`` is set."""
    entered, release = threading.Event(), threading.Event()

    def hold(c: object) -> None:
        entered.set()
        release.wait(30)

    store.submit(hold)
    assert entered.wait(30)
    return entered, release


def test_a_stages_messages_are_journaled_together_each_durable_before_its_ok(
    tmp_path: Path,
) -> None:
    """Issue #24: a message's journal write is awaited outside the job's lock, so the
    messages of a stage that arrive together queue together (one commit) instead of
    one commit after another under the lock — and still no sender hears "OK" before
    its message committed."""
    job, store, sites, _ = _new_job(tmp_path, None)
    _, release = _block_writer(store)
    answered: list[str] = []

    def advertise(pid: str) -> None:
        job.submit(pid, pb.ADVERTISE, sites[pid].message(pb.ADVERTISE, None))
        answered.append(pid)

    threads = [threading.Thread(target=advertise, args=(p,)) for p in sorted(sites)]
    for t in threads:
        t.start()
    # every submission got past the job's lock and queued its write: the writer is
    # still held, so none of them committed — and none was answered
    deadline = time.monotonic() + 30
    while store._queue.qsize() < N and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store._queue.qsize() == N
    assert answered == []
    # an identical resend is acknowledged only once the first copy is durable
    resend: list[BaseException] = []

    def again() -> None:
        try:
            job.submit("p0", pb.ADVERTISE, sites["p0"].message(pb.ADVERTISE, None))
        except ServiceError as exc:
            resend.append(exc)

    repeat = threading.Thread(target=again)
    repeat.start()
    repeat.join(0.5)
    assert repeat.is_alive() and resend == []
    release.set()
    for t in [*threads, repeat]:
        t.join(30)
    assert sorted(answered) == sorted(sites)
    assert len(resend) == 1 and resend[0].code is grpc.StatusCode.ALREADY_EXISTS  # type: ignore[attr-defined]
    assert store.query("SELECT COUNT(*) FROM job_journal WHERE kind = 'message'") == [(N,)]
    store.close()
