"""The site's held-jobs folder (issue #20): sealed, 0600, atomic, deleted with the job;
a session restored from it answers the rest of the job with the exact sum."""

from __future__ import annotations

import dataclasses
import hashlib
import stat
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from spherecal import crypto
from spherecal.participant.faults import Halter
from spherecal.participant.held_jobs import (
    FOLDER,
    MASKED_SUFFIX,
    CorruptHeldJob,
    HeldJob,
    HeldJobStore,
    seals_digest,
)
from spherecal.participant.policy import PolicySettings, ReleaseRepeated
from spherecal.participant.release_ledger import LedgerRules, Release, ReleaseLedger
from spherecal.participant.secure_jobs import SecureSteps
from spherecal.participant.secure_session import SecureSession
from spherecal.participant.transport import Transport
from spherecal.participant.trust import DirectoryTrust, UntrustedDirectory
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import public_key_bytes

JOB = b"\x07" * 16
RECORD = HeldJob(
    federation="fed-1",
    job=b"job message",
    round=2,
    release=JOB.hex(),
    sent=((int(pb.ADVERTISE), b"advert"), (int(pb.SHARE), b"shares")),
    state=b'{"state": 1}',
)


def _store(tmp_path: Path, pid: str = "p0", key: object = None) -> HeldJobStore:
    identity = key if key is not None else crypto.generate_identity()
    return HeldJobStore(tmp_path, pid, identity)  # type: ignore[arg-type]


def test_round_trip_mode_and_deletion(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(JOB, RECORD)
    assert store.load(JOB) == RECORD
    path = store.path(JOB)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / FOLDER).stat().st_mode) == 0o700
    assert sorted(p.name for p in (tmp_path / FOLDER).iterdir()) == [path.name]  # no temp
    assert store.job_ids() == [JOB]
    # the record's bytes are not on disk in the clear
    assert b"fed-1" not in path.read_bytes() and b"shares" not in path.read_bytes()
    store.save(JOB, RECORD.__class__(**{**RECORD.__dict__, "round": 3}))  # replaced whole
    assert store.load(JOB).round == 3
    store.delete(JOB)
    assert store.job_ids() == [] and not path.exists()
    store.delete(JOB)  # deleting twice is fine


def test_clear_deletes_every_job(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(JOB, RECORD)
    store.save(b"\x08" * 16, RECORD)
    store.clear()
    assert store.job_ids() == []


@pytest.mark.parametrize("where", [0, 30, -1])
def test_a_flipped_bit_anywhere_is_refused(tmp_path: Path, where: int) -> None:
    store = _store(tmp_path)
    store.save(JOB, RECORD)
    path = store.path(JOB)
    data = bytearray(path.read_bytes())
    data[where] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptHeldJob):
        store.load(JOB)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(JOB, RECORD)
    path = store.path(JOB)
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CorruptHeldJob, match="integrity"):
        store.load(JOB)


def test_another_identity_or_participant_cannot_read_it(tmp_path: Path) -> None:
    key = crypto.generate_identity()
    _store(tmp_path, "p0", key).save(JOB, RECORD)
    with pytest.raises(CorruptHeldJob, match="integrity"):
        _store(tmp_path, "p0").load(JOB)  # another identity key
    with pytest.raises(CorruptHeldJob, match="integrity"):
        _store(tmp_path, "p1", key).load(JOB)  # same key, another participant id
    assert _store(tmp_path, "p0", key).load(JOB) == RECORD


def test_a_file_moved_to_another_job_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(JOB, RECORD)
    other = b"\x09" * 16
    store.path(JOB).rename(store.path(other))
    with pytest.raises(CorruptHeldJob, match="holds job"):
        store.load(other)


def test_a_malformed_record_is_refused() -> None:
    with pytest.raises(CorruptHeldJob):
        HeldJob.from_bytes(b'{"federation": 1}')
    with pytest.raises(CorruptHeldJob):
        HeldJob.from_bytes(b"not json")


# ------------------------------------------------------------------ a restored session
def _job(n: int = 3) -> tuple[pb.SecAggJob, dict[str, crypto.SecAggParticipant]]:
    identities = {f"p{k}": crypto.generate_identity() for k in range(n)}
    spec = crypto.JobSpec.create(
        identities, threshold=n, length=8, bound=10.0, consistency_check=True
    )
    job = pb.SecAggJob(
        spec=spec.to_bytes(),
        directory=[
            pb.DirectoryEntry(participant_id=p, identity_public_key=public_key_bytes(k))
            for p, k in identities.items()
        ],
        purpose="ccvr",
    )
    return job, identities  # type: ignore[return-value]


def _step(spec: crypto.JobSpec, stage: pb.SecAggStage, message: crypto.Message) -> pb.SecAggStep:
    return pb.SecAggStep(job_id=spec.job_id, stage=stage, message=message.to_bytes())


Masked = tuple[
    pb.SecAggJob,
    dict[str, crypto.SecAggParticipant],
    crypto.SecAggServer,
    dict[str, SecureSession],
    dict[str, pb.SecAggStep],
    dict[str, np.ndarray],
]


def _masked_sessions() -> Masked:
    """Three sessions whose masked inputs are in the server's sum."""
    job, identities = _job()
    spec = crypto.JobSpec.from_bytes(job.spec)
    server = crypto.SecAggServer(
        spec, {e.participant_id: e.identity_public_key for e in job.directory}
    )
    inputs = {p: np.arange(8.0) + k for k, p in enumerate(identities)}
    sessions = {
        p: SecureSession(
            job,
            participant_id=p,
            identity=identities[p],  # type: ignore[arg-type]
            ledger=crypto.MemoryJobLedger(),
            trust=DirectoryTrust(None),
            vector=inputs[p],
            release=f"release-{p}",
        )
        for p in identities
    }
    for p, s in sessions.items():
        server.receive_bytes(s.advertise(), sender=p)
    server.close_stage()
    for p, s in sessions.items():
        out = s.respond(_step(spec, pb.SHARE, server.roster_for(p)))
        assert out is not None
        server.receive_bytes(out, sender=p)
    server.close_stage()
    bundles = {p: _step(spec, pb.MASKED, server.bundle_for(p)) for p in sessions}
    for p, s in sessions.items():
        assert s.respond(bundles[p]) is None
        for chunk in s.masked_chunks():
            server.receive_bytes(chunk, sender=p)
    server.close_stage()
    return job, identities, server, sessions, bundles, inputs


def test_a_restored_session_answers_the_rest_of_the_job(tmp_path: Path) -> None:
    job, identities, server, sessions, bundles, inputs = _masked_sessions()
    spec = crypto.JobSpec.from_bytes(job.spec)
    # p1 is written to its folder as its masked input leaves, then its process dies
    store = _store(tmp_path, "p1", identities["p1"])
    store.save(spec.job_id, sessions["p1"].record("fed-1"))
    record = store.load(spec.job_id)
    restored = SecureSession.restore(
        record,
        participant_id="p1",
        identity=identities["p1"],  # type: ignore[arg-type]
        trust=DirectoryTrust(None),
    )
    assert restored.restored and restored.release == "release-p1"
    assert restored.sent() == sessions["p1"].sent()  # answered again byte for byte
    sessions["p1"] = restored
    with pytest.raises(crypto.OutOfStage, match="never computed twice"):
        restored.respond(bundles["p1"])

    request = server.consistency_request()
    for p, s in sessions.items():
        out = s.respond(_step(spec, pb.CONSISTENCY, request))
        assert out is not None
        server.receive_bytes(out, sender=p)
    server.close_stage()
    for p, s in sessions.items():
        out = s.respond(_step(spec, pb.UNMASK, server.unmask_request_for(p)))
        assert out is not None
        server.receive_bytes(out, sender=p)
    result = server.finish()
    assert result.contributors == ("p0", "p1", "p2")
    np.testing.assert_allclose(result.values, sum(inputs.values()), atol=1e-6)


def test_a_restored_session_checks_its_directory_against_the_trust_root(
    tmp_path: Path,
) -> None:
    job, identities = _job()
    session = SecureSession(
        job,
        participant_id="p0",
        identity=identities["p0"],  # type: ignore[arg-type]
        ledger=crypto.MemoryJobLedger(),
        trust=DirectoryTrust(None),
    )
    # before its keys exist there is nothing to hold; once advertised, the keys are
    with pytest.raises(crypto.OutOfStage):
        session.record("fed-1")
    session.advertise()
    state = crypto.HeldState.from_bytes(session.record("fed-1").state)
    assert state.stage is crypto.HeldStage.ADVERTISED and state.keys is not None
    emptied = pb.SecAggJob(spec=job.spec, directory=job.directory[1:], purpose=job.purpose)
    record = HeldJob("fed-1", emptied.SerializeToString(), None, None, (), b"{}")
    with pytest.raises(UntrustedDirectory):
        SecureSession.restore(
            record,
            participant_id="p0",
            identity=identities["p0"],  # type: ignore[arg-type]
            trust=DirectoryTrust(None),
        )


def test_after_a_restart_a_new_job_for_the_same_release_is_refused(tmp_path: Path) -> None:
    """The restored session refuses to mask again (above); a coordinator that starts
    a *new* job for the same statistics instead is refused by the site's ledger,
    which the restarted process reads from the same state directory."""
    release = Release(kind="ccvr", federation="fed-1", model=b"m" * 32, data=b"d" * 32)
    first = ReleaseLedger(tmp_path / "privacy.db", participant="p1", rules=LedgerRules())
    first.reserve(release, job="job-a")
    first.consume("job-a")
    first.close()  # the process dies after its masked input left
    restarted = ReleaseLedger(tmp_path / "privacy.db", participant="p1", rules=LedgerRules())
    restarted.consume("job-a")  # the same job's input again: one release, idempotent
    with pytest.raises(ReleaseRepeated):
        restarted.reserve(release, job="job-b")
    restarted.close()


def test_a_restarted_process_restores_only_its_federations_usable_jobs(tmp_path: Path) -> None:
    job, identities, _, sessions, _, _ = _masked_sessions()
    spec = crypto.JobSpec.from_bytes(job.spec)
    identity = identities["p1"]
    store = HeldJobStore(tmp_path, "p1", identity)  # type: ignore[arg-type]
    store.save(spec.job_id, sessions["p1"].record("fed-1"))
    store.save(b"\x01" * 16, sessions["p1"].record("fed-0"))  # an older federation
    store.save(b"\x02" * 16, RECORD)
    store.path(b"\x02" * 16).write_bytes(b"garbage")  # damaged on disk
    lines: list[str] = []
    releases = ReleaseLedger(tmp_path / "privacy.db", participant="p1", rules=LedgerRules())
    steps = SecureSteps(
        participant_id="p1",
        identity=identity,  # type: ignore[arg-type]
        ledger=crypto.MemoryJobLedger(),
        trust=DirectoryTrust(None),
        transport=cast(Transport, None),  # restoring sends nothing
        halter=Halter(()),
        releases=releases,
        policy=PolicySettings(),
        caller=pb.Caller,
        refuse=lambda task, exc: lines.append(f"refused {task}: {exc}"),
        log=lines.append,
        store=store,
        federation=lambda: "fed-1",
    )
    assert steps.restore_held("fed-1") == 1
    assert list(steps.jobs) == [spec.job_id] and steps.jobs[spec.job_id].restored
    assert store.job_ids() == [spec.job_id]  # the other two are deleted, each logged
    assert any("another federation" in line for line in lines), lines
    assert any("cannot be used (CorruptHeldJob" in line for line in lines), lines
    steps.end_federation()
    assert store.job_ids() == [] and steps.jobs == {}
    releases.close()


# ------------------------------------------------------------------ the stored masked input
CHUNKS = [bytes([k]) * (100 + k) for k in range(4)]


def _seals_of_file(blob: bytes, count: int) -> str:
    """The digest a format-2 record names a stored masked input by, computed from the
    file's bytes as the format states: SHA-256 of a context string, then each sealed
    chunk's nonce and tag in order."""
    magic = b"SPHERECAL-HELD-MASKED 2\n"
    assert blob.startswith(magic)
    at = len(magic) + 1 + blob[len(magic)] + 4
    outer = hashlib.sha256(b"spherecal held masked seals v2\x00")
    for _ in range(count):
        size = int.from_bytes(blob[at : at + 4], "big")
        sealed = blob[at + 4 : at + 4 + size]
        outer.update(sealed[:12] + sealed[-16:])
        at += 4 + size
    assert at == len(blob)
    return outer.hexdigest()


def test_the_record_names_one_written_file_not_any_valid_one_of_the_job(tmp_path: Path) -> None:
    """Issue #24 (format 2): the record's digest covers the seals, so a file the site
    sealed for the same job afterwards — another input, or the same chunks sealed
    again — is refused against the record of the first. Mutation: the seals alone
    (AES-GCM) accept either file, so without the record's digest a recomputed input
    would be sent as the stored one."""
    store = _store(tmp_path)
    first = store.save_masked(JOB, iter(CHUNKS), len(CHUNKS))
    other = [bytes([k + 50]) * (100 + k) for k in range(4)]
    second = store.save_masked(JOB, iter(other), len(other))
    assert second != first
    assert list(store.masked_chunks(JOB)) == other  # intact: the seals pass
    with pytest.raises(CorruptHeldJob, match="not the masked input"):
        store.check_masked(JOB, first)
    again = store.save_masked(JOB, iter(CHUNKS), len(CHUNKS))  # same chunks, new seals
    assert again != first
    with pytest.raises(CorruptHeldJob, match="not the masked input"):
        store.check_masked(JOB, first)
    store.check_masked(JOB, again)


def test_a_masked_input_of_format_1_is_refused_with_its_reason(tmp_path: Path) -> None:
    """A file written before format 2 (named by the SHA-256 of its chunks) is refused
    clearly rather than checked against a digest of another kind."""
    store = _store(tmp_path)
    store.save_masked(JOB, iter(CHUNKS), len(CHUNKS))
    path = store.masked_path(JOB)
    blob = path.read_bytes()
    path.write_bytes(b"SPHERECAL-HELD-MASKED 1\n" + blob[len(b"SPHERECAL-HELD-MASKED 2\n") :])
    with pytest.raises(CorruptHeldJob, match="format 1"):
        list(store.masked_chunks(JOB))
    with pytest.raises(CorruptHeldJob, match="format 1"):
        store.check_masked(JOB, _seals_of_file(blob, len(CHUNKS)))


def test_masked_input_round_trip_mode_digest_and_deletion(tmp_path: Path) -> None:
    store = _store(tmp_path)
    digest = store.save_masked(JOB, iter(CHUNKS), len(CHUNKS))
    assert digest == _seals_of_file(store.masked_path(JOB).read_bytes(), len(CHUNKS))
    assert list(store.masked_chunks(JOB)) == CHUNKS
    store.check_masked(JOB, digest)
    where = store.masked_path(JOB)
    assert stat.S_IMODE(where.stat().st_mode) == 0o600
    assert CHUNKS[1] not in where.read_bytes()  # sealed, not in the clear
    assert store.job_ids(MASKED_SUFFIX) == [JOB] and store.job_ids() == []
    with pytest.raises(CorruptHeldJob, match="not the masked input"):
        store.check_masked(JOB, seals_digest([]))
    store.save(JOB, RECORD)
    store.delete(JOB)  # the record and the masked input go together
    assert not where.exists() and not store.path(JOB).exists()
    store.save_masked(JOB, CHUNKS, len(CHUNKS))
    store.clear()
    assert not where.exists()


def test_masked_chunks_of_falling_sizes_through_one_seal_buffer(tmp_path: Path) -> None:
    """The chunks are sealed into one reused buffer: a shorter chunk after a longer
    one must come back exactly (no tail of the previous chunk), and the file must be
    what sealing each chunk on its own gives — read back independently of the
    store's reader, with the AEAD and associated data the format states."""
    identity = crypto.generate_identity()
    store = _store(tmp_path, key=identity)
    chunks = [bytes([7]) * 300, bytes([8]) * 120, bytes([9]) * 299, b"\x0a"]
    digest = store.save_masked(JOB, iter(chunks), len(chunks))
    assert list(store.masked_chunks(JOB)) == chunks
    store.check_masked(JOB, digest)
    blob = store.masked_path(JOB).read_bytes()
    magic = b"SPHERECAL-HELD-MASKED 2\n"
    head = len(magic) + 1 + len(JOB) + 4
    assert blob[:head] == magic + bytes([len(JOB)]) + JOB + len(chunks).to_bytes(4, "big")
    raw = identity.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"spherecal held-job store v1\x00p0"
    ).derive(raw)
    aead = AESGCM(key)
    at = head
    for index, chunk in enumerate(chunks):
        size = int.from_bytes(blob[at : at + 4], "big")
        nonce, sealed = blob[at + 4 : at + 16], blob[at + 16 : at + 4 + size]
        aad = magic + b"p0\x00" + JOB + index.to_bytes(4, "big") + len(chunks).to_bytes(4, "big")
        assert aead.decrypt(nonce, sealed, aad) == chunk
        at += 4 + size
    assert at == len(blob)


def test_masked_input_announced_count_must_match(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with pytest.raises(ValueError, match="announced"):
        store.save_masked(JOB, CHUNKS, len(CHUNKS) + 1)
    assert not store.masked_path(JOB).exists()  # nothing half-written is left
    assert [p for p in store.folder.iterdir()] == []


@pytest.mark.parametrize("where", [5, 40, 200, -3])
def test_a_masked_input_with_a_flipped_bit_is_refused(tmp_path: Path, where: int) -> None:
    store = _store(tmp_path)
    store.save_masked(JOB, CHUNKS, len(CHUNKS))
    path = store.masked_path(JOB)
    blob = bytearray(path.read_bytes())
    blob[where] ^= 1
    path.write_bytes(bytes(blob))
    with pytest.raises(CorruptHeldJob):
        list(store.masked_chunks(JOB))


def test_a_truncated_or_moved_masked_input_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save_masked(JOB, CHUNKS, len(CHUNKS))
    path = store.masked_path(JOB)
    blob = path.read_bytes()
    path.write_bytes(blob[:-50])
    with pytest.raises(CorruptHeldJob, match="truncated"):
        list(store.masked_chunks(JOB))
    other = b"\x08" * 16
    store.masked_path(other).write_bytes(blob)
    with pytest.raises(CorruptHeldJob, match="another job"):
        list(store.masked_chunks(other))
    with pytest.raises(CorruptHeldJob):  # another identity cannot read it
        list(_store(tmp_path).masked_chunks(other))


# ------------------------------------------------------------------ the record log (issue #24)
def _state(stage: crypto.HeldStage, *, keys: bool) -> bytes:
    """A real ``crypto.HeldState`` at ``stage`` (with job keys or without)."""
    if keys:
        state = crypto.HeldState(
            job_id=JOB,
            participant_id="p0",
            stage=stage,
            members1=("p0",) if stage is crypto.HeldStage.SHARED else (),
            members2=(),
            held=(),
            keys=(b"\x01" * 32, b"\x02" * 32, b"\x03" * 16),
            own_advert=b"advert",
            adverts=(b"advert",) if stage is crypto.HeldStage.SHARED else (),
        )
    else:
        state = crypto.HeldState(
            job_id=JOB,
            participant_id="p0",
            stage=stage,
            members1=("p0",),
            members2=("p0",),
            held=(),
        )
    return crypto.HeldState.from_bytes(state.to_bytes()).to_bytes()


def _record(step: int, *, keys: bool = True) -> HeldJob:
    stage = crypto.HeldStage.SHARED if keys else crypto.HeldStage.MASKED
    return HeldJob(
        federation="fed-1",
        job=b"job message",
        round=step,
        release=JOB.hex(),
        sent=tuple((int(pb.ADVERTISE) + k, bytes([k]) * 40) for k in range(step + 1)),
        state=_state(stage, keys=keys),
    )


LOG_MAGIC = b"SPHERECAL-HELD-JOB 3\n"
"""A log of version 3 (what every save writes since 2026-11-27: a record may be
withheld); version 2 logs are read, never appended to."""


def _frames(blob: bytes, magic: bytes = LOG_MAGIC) -> list[tuple[int, int]]:
    """(offset, length) of each complete record of a log file, parsed from the
    format's framing alone (no decryption)."""
    assert blob.startswith(magic)
    at = len(magic) + 1 + blob[len(magic)]
    out = []
    while len(blob) - at >= 4:
        size = int.from_bytes(blob[at : at + 4], "big")
        if at + 4 + size > len(blob):
            break
        out.append((at, 4 + size))
        at += 4 + size
    return out


def _key(identity: object) -> bytes:
    """The store's key, derived here as the format states."""
    raw = identity.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"spherecal held-job store v1\x00p0"
    ).derive(raw)


def _decrypt_all(identity: object, blob: bytes) -> list[HeldJob]:
    """Every complete record of the file, opened independently of the store with the
    key, nonce and associated data the format states."""
    key = _key(identity)
    out = []
    for index, (at, size) in enumerate(_frames(blob)):
        frame = blob[at + 4 : at + size]
        aad = LOG_MAGIC + b"p0\x00" + JOB + index.to_bytes(4, "big")
        out.append(HeldJob.from_bytes(AESGCM(key).decrypt(frame[:12], frame[12:], aad)))
    return out


def test_each_later_save_appends_one_record_and_the_newest_is_the_state(tmp_path: Path) -> None:
    identity = crypto.generate_identity()
    store = _store(tmp_path, key=identity)
    records = [_record(k) for k in range(3)]
    sizes = []
    for record in records:
        store.save(JOB, record)
        sizes.append(store.path(JOB).stat().st_size)
        assert _store(tmp_path, key=identity).load(JOB) == record  # a restarted reader
    blob = store.path(JOB).read_bytes()
    assert _decrypt_all(identity, blob) == records  # appended in order, none rewritten
    assert sizes[1] - sizes[0] == _frames(blob)[1][1]  # the second save added one record
    assert stat.S_IMODE(store.path(JOB).stat().st_mode) == 0o600
    assert sorted(p.name for p in store.folder.iterdir()) == [store.path(JOB).name]


def test_a_file_cut_mid_record_is_read_as_the_records_before_it(tmp_path: Path) -> None:
    """A power loss during an append leaves a torn last record; its message never left
    (it goes only once the sync returned), so the records before it are the state —
    and the next append replaces the torn bytes."""
    identity = crypto.generate_identity()
    store = _store(tmp_path, key=identity)
    for k in range(3):
        store.save(JOB, _record(k))
    path = store.path(JOB)
    blob = path.read_bytes()
    (_, _), (at1, size1), (at2, size2) = _frames(blob)
    for cut in (at2 + size2 - 1, at2 + 20, at2 + 5, at2 + 2):  # in the body, the length
        path.write_bytes(blob[:cut])
        assert _store(tmp_path, key=identity).load(JOB) == _record(1), cut
    path.write_bytes(blob[: at2 + 20])
    again = _store(tmp_path, key=identity)  # the restarted process
    assert again.load(JOB) == _record(1)
    again.save(JOB, _record(5))  # appended where the intact records end
    fixed = path.read_bytes()
    assert fixed[:at2] == blob[:at2] and len(_frames(fixed)) == 3
    assert _decrypt_all(identity, fixed)[-1] == _record(5)
    assert _store(tmp_path, key=identity).load(JOB) == _record(5)
    path.write_bytes(blob[: at1 + 7])  # even the second record cut: the first
    assert _store(tmp_path, key=identity).load(JOB) == _record(0)
    path.write_bytes(blob[: _frames(blob)[0][1] + _frames(blob)[0][0] - 1])  # none whole
    with pytest.raises(CorruptHeldJob, match="no complete record"):
        _store(tmp_path, key=identity).load(JOB)


def test_a_complete_record_that_fails_its_check_is_refused_not_rolled_back(
    tmp_path: Path,
) -> None:
    """Damage is not a torn write: falling back to the record before it could undo a
    signature or an unmask answer that left, so the file is refused whole. Mutation
    of the reader's rule: a reader that skipped the bad record would return
    ``_record(0)`` — this test would then fail."""
    store = _store(tmp_path)
    store.save(JOB, _record(0))
    store.save(JOB, _record(1))
    path = store.path(JOB)
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1  # the newest record's tag
    path.write_bytes(bytes(blob))
    with pytest.raises(CorruptHeldJob, match="record 1"):
        store.load(JOB)


def test_records_cannot_be_repeated_or_reordered(tmp_path: Path) -> None:
    """Each record's position is bound into its associated data."""
    store = _store(tmp_path)
    store.save(JOB, _record(0))
    store.save(JOB, _record(1))
    path = store.path(JOB)
    blob = path.read_bytes()
    (at0, size0), (at1, size1) = _frames(blob)
    first, second = blob[at0 : at0 + size0], blob[at1 : at1 + size1]
    for body in (first + first, second + first, second):
        path.write_bytes(blob[:at0] + body)
        with pytest.raises(CorruptHeldJob, match="record"):
            store.load(JOB)


def test_a_record_without_keys_starts_a_new_log_so_no_key_record_stays_on_disk(
    tmp_path: Path,
) -> None:
    """The record naming the stored masked input holds no keys; appended, it would
    leave the earlier records — with the job keys — in the file beside the masked
    input. It replaces the log whole instead (rename, folder synced: test_durable)."""
    identity = crypto.generate_identity()
    store = _store(tmp_path, key=identity)
    store.save(JOB, _record(0))
    store.save(JOB, _record(1))
    keyless = _record(2, keys=False)
    store.save(JOB, keyless)
    blob = store.path(JOB).read_bytes()
    assert _decrypt_all(identity, blob) == [keyless]  # the key records are gone
    assert crypto.HeldState.from_bytes(store.load(JOB).state).keys is None
    after = _record(3, keys=False)
    store.save(JOB, after)  # later keyless records are appended again
    assert _decrypt_all(identity, store.path(JOB).read_bytes()) == [keyless, after]
    # mutation of the rule: appending the keyless record would keep the key records
    store2 = _store(tmp_path / "mutant", key=identity)
    store2.save(JOB, _record(0))
    log = store2._logs[JOB]
    store2._logs[JOB] = log.__class__(log.end, log.records, keys=False)  # rule defeated
    store2.save(JOB, keyless)
    kept = _decrypt_all(identity, store2.path(JOB).read_bytes())
    assert any(crypto.HeldState.from_bytes(r.state).keys is not None for r in kept)


def test_a_failed_append_is_followed_by_a_whole_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spherecal.participant import held_jobs

    identity = crypto.generate_identity()
    store = _store(tmp_path, key=identity)
    store.save(JOB, _record(0))
    real = held_jobs.append_durably

    def full(path: Path, data: bytes, *, at: int) -> bool:
        with path.open("r+b") as f:  # half a record reached the file
            f.seek(at)
            f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(held_jobs, "append_durably", full)
    with pytest.raises(OSError):
        store.save(JOB, _record(1))
    assert store.load(JOB) == _record(0)  # the half record is a torn tail
    monkeypatch.setattr(held_jobs, "append_durably", real)
    store.save(JOB, _record(2))
    assert _decrypt_all(identity, store.path(JOB).read_bytes())[-1] == _record(2)
    assert _store(tmp_path, key=identity).load(JOB) == _record(2)


def test_a_version_1_file_is_read_and_its_next_save_writes_a_log(tmp_path: Path) -> None:
    """A site upgraded in the middle of a job: the one-record file of version 1."""
    identity = crypto.generate_identity()
    raw = identity.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"spherecal held-job store v1\x00p0"
    ).derive(raw)
    magic = b"SPHERECAL-HELD-JOB 1\n"
    nonce = b"\x05" * 12
    sealed = AESGCM(key).encrypt(nonce, _record(0).to_bytes(), magic + b"p0\x00" + JOB)
    store = _store(tmp_path, key=identity)
    store.folder.mkdir(mode=0o700)
    store.path(JOB).write_bytes(magic + bytes([len(JOB)]) + JOB + nonce + sealed)
    assert store.load(JOB) == _record(0)
    store.save(JOB, _record(1))
    assert _decrypt_all(identity, store.path(JOB).read_bytes()) == [_record(1)]


def test_a_log_that_is_gone_or_shorter_than_written_is_written_whole(tmp_path: Path) -> None:
    identity = crypto.generate_identity()
    store = _store(tmp_path, key=identity)
    store.save(JOB, _record(0))
    store.path(JOB).unlink()
    store.save(JOB, _record(1))
    assert _decrypt_all(identity, store.path(JOB).read_bytes()) == [_record(1)]
    store.path(JOB).write_bytes(store.path(JOB).read_bytes()[:30])  # not what it wrote
    store.save(JOB, _record(2))
    assert _decrypt_all(identity, store.path(JOB).read_bytes()) == [_record(2)]


def _version_2_log(identity: object, records: list[HeldJob]) -> bytes:
    """A log as a site of version 2 wrote it (before a record could be withheld)."""
    key, magic = _key(identity), b"SPHERECAL-HELD-JOB 2\n"
    blob = magic + bytes([len(JOB)]) + JOB
    for index, record in enumerate(records):
        nonce = bytes([index + 1]) * 12
        aad = magic + b"p0\x00" + JOB + index.to_bytes(4, "big")
        sealed = AESGCM(key).encrypt(nonce, record.to_bytes(), aad)
        blob += (12 + len(sealed)).to_bytes(4, "big") + nonce + sealed
    return blob


def test_a_version_2_log_is_read_and_its_next_save_writes_version_3_whole(
    tmp_path: Path,
) -> None:
    """A site upgraded in the middle of a job: its version 2 log is read (not withheld:
    no version 2 writer knew the mark), and the next save — which may say withheld —
    is never appended to it, so no version 2 reader meets a withheld record it would
    read as a job whose input is still to come."""
    identity = crypto.generate_identity()
    store = _store(tmp_path, key=identity)
    store.folder.mkdir(mode=0o700)
    store.path(JOB).write_bytes(_version_2_log(identity, [_record(0), _record(1)]))
    assert store.load(JOB) == _record(1) and store.load(JOB).withheld is None
    withheld = dataclasses.replace(_record(2), withheld="EncodingOverflow")
    store.save(JOB, withheld)
    blob = store.path(JOB).read_bytes()
    assert blob.startswith(LOG_MAGIC) and _decrypt_all(identity, blob) == [withheld]
    assert _store(tmp_path, key=identity).load(JOB) == withheld
    store.save(JOB, _record(3))  # a version 3 log is appended to
    assert _decrypt_all(identity, store.path(JOB).read_bytes()) == [withheld, _record(3)]


def test_the_withheld_mark_round_trips_and_is_checked() -> None:
    withheld = dataclasses.replace(RECORD, withheld="MemoryError")
    assert HeldJob.from_bytes(withheld.to_bytes()) == withheld
    assert b"withheld" not in RECORD.to_bytes()  # absent when not withheld
    for bad in (b'"withheld":3', b'"withheld":""'):
        text = withheld.to_bytes().replace(b'"withheld":"MemoryError"', bad)
        with pytest.raises(CorruptHeldJob, match="withheld"):
            HeldJob.from_bytes(text)
