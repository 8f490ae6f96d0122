"""The participant's side of a job: persistent replay ledger, idempotent re-sends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spherecal import crypto
from spherecal.participant.secure_session import SecureSession, SqliteJobLedger
from spherecal.participant.trust import DirectoryTrust, UntrustedDirectory
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import public_key_bytes


def test_ledger_refuses_a_replayed_job_across_restarts(tmp_path: Path) -> None:
    ledger = SqliteJobLedger(tmp_path / "jobs.db")
    ledger.claim("p0", b"job-1")
    ledger.keys_out("p0", b"job-1")  # its advertisement left (pending until then)
    ledger.close()
    again = SqliteJobLedger(tmp_path / "jobs.db")
    with pytest.raises(crypto.JobReplayed):
        again.claim("p0", b"job-1")
    again.claim("p0", b"job-2")
    again.close()


def _job(n: int = 3, length: int = 16) -> tuple[pb.SecAggJob, dict[str, object]]:
    identities = {f"p{k}": crypto.generate_identity() for k in range(n)}
    spec = crypto.JobSpec.create(identities, threshold=2, length=length, bound=10.0)
    job = pb.SecAggJob(
        spec=spec.to_bytes(),
        directory=[
            pb.DirectoryEntry(participant_id=p, identity_public_key=public_key_bytes(k))
            for p, k in identities.items()
        ],
        purpose="ffc",
    )
    return job, identities  # type: ignore[return-value]


def test_repeated_steps_get_the_same_bytes(tmp_path: Path) -> None:
    job, identities = _job()
    spec = crypto.JobSpec.from_bytes(job.spec)
    keys = {e.participant_id: e.identity_public_key for e in job.directory}
    server = crypto.SecAggServer(spec, keys)
    sessions = {
        p: SecureSession(
            job,
            participant_id=p,
            identity=identities[p],  # type: ignore[arg-type]
            ledger=crypto.MemoryJobLedger(),
            trust=DirectoryTrust(None),
            vector=np.full(16, 1.0),
        )
        for p in identities
    }
    for p, s in sessions.items():
        server.receive_bytes(s.advertise(), sender=p)
        assert s.advertise() == s.advertise()
    server.close_stage()
    for p, s in sessions.items():
        step = pb.SecAggStep(
            job_id=spec.job_id, stage=pb.SHARE, message=server.roster_for(p).to_bytes()
        )
        first = s.respond(step)
        assert first is not None and s.respond(step) == first  # lost reply: same bytes
        server.receive_bytes(first, sender=p)


def test_refuses_a_job_whose_length_differs_from_the_input() -> None:
    job, identities = _job(length=16)
    with pytest.raises(crypto.WrongLength):
        SecureSession(
            job,
            participant_id="p0",
            identity=identities["p0"],  # type: ignore[arg-type]
            ledger=crypto.MemoryJobLedger(),
            trust=DirectoryTrust(None),
            vector=np.zeros(15),
        )


def test_out_of_bound_input_is_refused_not_wrapped() -> None:
    job, identities = _job()
    with pytest.raises(crypto.EncodingOverflow):
        SecureSession(
            job,
            participant_id="p0",
            identity=identities["p0"],  # type: ignore[arg-type]
            ledger=crypto.MemoryJobLedger(),
            trust=DirectoryTrust(None),
            vector=np.full(16, 1e9),
        )


def test_a_harary_job_with_only_the_needed_entries_is_accepted_and_a_gap_refused() -> None:
    """At n = 40 (Harary) the instruction carries only ``crypto.keys_needed``'s
    entries; the session accepts exactly those, and one missing is refused."""
    identities = {f"p{k:02d}": crypto.generate_identity() for k in range(40)}
    spec = crypto.JobSpec.create(
        identities, threshold=4, length=4, bound=1.0, graph="harary", degree=5
    )
    me = "p00"
    needed = sorted(crypto.keys_needed(spec, me))
    assert len(needed) < 40

    def job(ids: list[str]) -> pb.SecAggJob:
        entries = [
            pb.DirectoryEntry(participant_id=p, identity_public_key=public_key_bytes(identities[p]))
            for p in ids
        ]
        return pb.SecAggJob(spec=spec.to_bytes(), directory=entries, purpose="ffc")

    session = SecureSession(
        job(needed),
        participant_id=me,
        identity=identities[me],
        ledger=crypto.MemoryJobLedger(),
        trust=DirectoryTrust(None),
    )
    assert session.advertise()
    gap = next(p for p in needed if p != me)
    with pytest.raises(UntrustedDirectory, match=f"no entry for job participant {gap!r}"):
        SecureSession(
            job([p for p in needed if p != gap]),
            participant_id=me,
            identity=identities[me],
            ledger=crypto.MemoryJobLedger(),
            trust=DirectoryTrust(None),
        )
