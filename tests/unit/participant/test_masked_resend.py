"""A site killed *during* its masked upload (issue #20): the masked input was stored
before the first byte left, so the restarted process sends the identical bytes for
the same job, the coordinator sums them (the cut stream never was) and the job ends
with every site — one release in the site's ledger. Mutation check: without the
stored input the restarted site cannot resend, and the job loses it.

Both sides are the real ones: the site's ``SecureSteps`` with its held-jobs folder
and release ledger on disk, the coordinator's ``SecureJob``; the transport between
them calls the job's upload methods in process, as the service does."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.coordinator.driver.stages import continue_journaled_job
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.settings import SecAggSettings
from spherecal.coordinator.state.job_journal import JobJournal
from spherecal.coordinator.state.store import Store
from spherecal.participant.faults import Halter
from spherecal.participant.held_jobs import HeldJobStore
from spherecal.participant.policy import PolicySettings
from spherecal.participant.release_ledger import LedgerRules, Release, ReleaseLedger
from spherecal.participant.secure_jobs import SecureSteps
from spherecal.participant.secure_session import SecureSession
from spherecal.participant.transport import Transport, TransportError
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from tests.unit.coordinator.helpers import make_job

IDS = ("p0", "p1", "p2", "p3")
GRACE_S = 30.0
RELEASE = "release-p1"
SENT: dict[tuple[str, int], bytes] = {}
"""(site, stage) -> what the sites other than p1 sent (to resend after a restart)."""


class Killed(BaseException):
    """The site's process dies here (what SIGKILL does to it)."""


class ToJob:
    """The site's transport, straight into the coordinator's job."""

    def __init__(self, job: SecureJob, pid: str, cut_after: int | None = None) -> None:
        self.job, self.pid, self.cut_after = job, pid, cut_after
        self.streamed: list[bytes] = []

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        try:
            self.job.begin_upload(self.pid)
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message) from None
        try:
            chunks = 0
            for message in messages:
                if not message.chunk:
                    continue  # the upload's header (the service may wait for a slot there)
                if chunks == self.cut_after:
                    raise Killed
                chunks += 1
                self.streamed.append(bytes(message.chunk))
                self.job.absorb(self.pid, bytes(message.chunk))
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message) from None
        finally:
            complete = self.job.end_upload(self.pid)
        if not complete:
            raise TransportError(grpc.StatusCode.INVALID_ARGUMENT, "incomplete upload")
        return pb.UploadReceipt()

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        try:
            self.job.submit(self.pid, request.stage, bytes(request.message))
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message) from None
        return pb.Receipt()


def _steps(
    tmp_path: Path, identity: object, transport: ToJob, lines: list[str]
) -> tuple[SecureSteps, ReleaseLedger]:
    releases = ReleaseLedger(tmp_path / "privacy.db", participant="p1", rules=LedgerRules())
    steps = SecureSteps(
        participant_id="p1",
        identity=identity,  # type: ignore[arg-type]
        ledger=crypto.MemoryJobLedger(),
        trust=DirectoryTrust(None),
        transport=cast(Transport, transport),
        halter=Halter(()),
        releases=releases,
        policy=PolicySettings(),
        caller=pb.Caller,
        refuse=lambda task, exc: lines.append(f"refused {task[:8]}: {exc}"),
        log=lines.append,
        store=HeldJobStore(tmp_path, "p1", identity),  # type: ignore[arg-type]
        federation=lambda: "fed-1",
    )
    return steps, releases


def _released(releases: ReleaseLedger) -> int:
    return sum(1 for job, _, _ in releases.released() if job == RELEASE)


def _cut_upload(
    tmp_path: Path, journal: JobJournal | None = None
) -> tuple[SecureJob, dict[str, crypto.SecAggParticipant], dict[str, np.ndarray], ToJob]:
    """p0, p2, p3 upload; p1's upload is cut after two of its five chunks and its
    process dies. Returns the job, the other clients, the inputs, p1's first stream."""
    job, clients = make_job(
        4, 40, threshold=4, chunk_entries=8, rejoin_s=GRACE_S, journal=journal
    )
    if journal is not None:
        journal.created(
            job_id=job.job_hex,
            slot="ffc",
            purpose="ffc",
            round_index=None,
            job=job.journal_message(),
            first_stage_s=60.0,
        )
    assert job.spec.n_chunks == 5
    inputs = {p: np.linspace(-1.0, 1.0, 40) * (k + 1) for k, p in enumerate(IDS)}
    identity = clients["p1"]._identity
    releases = ReleaseLedger(tmp_path / "privacy.db", participant="p1", rules=LedgerRules())
    releases.reserve(
        Release(kind="ccvr", federation="fed-1", model=b"m" * 32, data=b"d" * 32), job=RELEASE
    )
    releases.close()
    session = SecureSession(
        job.job_message("p1"),
        participant_id="p1",
        identity=identity,
        ledger=crypto.MemoryJobLedger(),
        trust=DirectoryTrust(None),
        vector=inputs["p1"],
        release=RELEASE,
    )
    everyone = frozenset(IDS)
    for p in IDS:
        advert = session.advertise() if p == "p1" else clients[p].advertise_keys().to_bytes()
        SENT[(p, pb.ADVERTISE)] = advert
        job.submit(p, pb.ADVERTISE, advert)
    job.advance(everyone)
    for p in IDS:
        step = job.step_for(p)
        assert step is not None
        if p == "p1":
            out = session.respond(step)
            assert out is not None
        else:
            roster = crypto.KeyRoster.from_bytes(step.message)
            out = clients[p].share_keys(roster).to_bytes()
        SENT[(p, pb.SHARE)] = out
        job.submit(p, pb.SHARE, out)
    job.advance(everyone)
    for p in ("p0", "p2", "p3"):
        step = job.step_for(p)
        assert step is not None
        clients[p].receive_shares(crypto.ShareBundle.from_bytes(step.message))
        clients[p].set_input(inputs[p])
        job.begin_upload(p)
        for chunk in clients[p].masked_chunks():
            job.absorb(p, chunk.to_bytes())
        assert job.end_upload(p)
    first = ToJob(job, "p1", cut_after=2)
    lines: list[str] = []
    steps, releases = _steps(tmp_path, identity, first, lines)
    steps.jobs[session.job_id] = session
    step = job.step_for("p1")
    assert step is not None and step.stage == pb.MASKED
    with pytest.raises(Killed):
        steps.step(step)
    assert _released(releases) == 1  # charged before the first byte left
    releases.close()
    return job, clients, inputs, first


def _restart(
    tmp_path: Path, job: SecureJob, identity: object
) -> tuple[SecureSteps, ToJob, list[str]]:
    again = ToJob(job, "p1")
    lines: list[str] = []
    steps, _ = _steps(tmp_path, identity, again, lines)
    assert steps.restore_held("fed-1") == 1
    return steps, again, lines


def test_a_site_killed_mid_upload_resends_the_identical_input_and_the_job_keeps_it(
    tmp_path: Path,
) -> None:
    job, clients, inputs, first = _cut_upload(tmp_path)
    others = frozenset(IDS) - {"p1"}
    t0 = time.monotonic()
    lines = job.advance(others, now=t0)  # p1 is gone: the masked stage waits for it
    assert job.stage_name == "masked" and job.outcome is None
    assert any("p1 disconnected in stage masked" in line for line in lines), lines
    assert job.advance(others, now=t0 + GRACE_S - 1) == ()

    steps, again, log = _restart(tmp_path, job, clients["p1"]._identity)
    step = job.step_for("p1")
    assert step is not None and step.stage == pb.MASKED
    steps.step(step)
    assert len(again.streamed) == 5
    assert again.streamed[:2] == first.streamed  # the same bytes, not another input
    _finish(tmp_path, job, clients, inputs, steps, log)


def _finish(
    tmp_path: Path,
    job: SecureJob,
    clients: dict[str, crypto.SecAggParticipant],
    inputs: dict[str, np.ndarray],
    steps: SecureSteps,
    log: list[str],
) -> None:
    """Every upload is in: the job's last two stages, its exact sum with all four
    sites, one release in p1's ledger, and p1's held files gone."""
    job.advance(frozenset(IDS))
    assert job.stage_name == "consistency"
    for stage in ("consistency", "unmask"):
        for p in IDS:
            step = job.step_for(p)
            assert step is not None, (stage, p)
            if p == "p1":
                steps.step(step)
            elif stage == "consistency":
                request = crypto.ConsistencyRequest.from_bytes(step.message)
                sig = clients[p].consistency_signature(request).to_bytes()
                job.submit(p, pb.CONSISTENCY, sig)
            else:
                answer = clients[p].unmask(crypto.UnmaskRequest.from_bytes(step.message))
                job.submit(p, pb.UNMASK, answer.to_bytes())
        job.advance(frozenset(IDS))
    outcome = job.outcome
    assert outcome is not None and outcome.status == "done", (outcome, log)
    assert outcome.contributors == IDS and outcome.dropped == {}
    np.testing.assert_allclose(np.asarray(outcome.values), sum(inputs.values()), atol=1e-6)
    releases = ReleaseLedger(tmp_path / "privacy.db", participant="p1", rules=LedgerRules())
    assert _released(releases) == 1  # one release, though the input went twice
    releases.close()
    assert steps.store is not None and steps.store.job_ids() == []  # job over: files gone
    assert not list(steps.store.folder.glob("*.masked"))


def test_the_coordinator_and_the_site_both_crash_in_the_masked_stage(tmp_path: Path) -> None:
    """The coordinator dies too: its continued job (from its journal) lost every
    upload of the open masked stage; the restarted site resends its stored input
    and the job ends with all four, one release."""
    store = Store(tmp_path / "state.db")
    job, clients, inputs, first = _cut_upload(tmp_path, JobJournal(store))
    store.close()  # the coordinator process is gone too
    again = Store(tmp_path / "state.db")
    journal = JobJournal(again)
    record = journal.find("ffc")
    assert record is not None
    settings = SecAggSettings(threshold=4, chunk_entries=8, max_in_flight=2)
    resumed = continue_journaled_job(
        record, settings=settings, stage_s=60.0, journal=journal, rejoin_s=GRACE_S
    )
    assert resumed.job_id == job.job_id and resumed.stage_name == "masked"
    for p in ("p0", "p2", "p3"):  # their task again: what they sent, then their input
        for stage in (pb.ADVERTISE, pb.SHARE):
            with pytest.raises(ServiceError) as known:
                resumed.submit(p, stage, SENT[(p, stage)])
            assert known.value.code is grpc.StatusCode.ALREADY_EXISTS
        step = resumed.step_for(p)
        assert step is not None and step.stage == pb.MASKED
        resumed.begin_upload(p)
        for chunk in clients[p].masked_chunks():
            resumed.absorb(p, chunk.to_bytes())
        assert resumed.end_upload(p)
    steps, resent, log = _restart(tmp_path, resumed, clients["p1"]._identity)
    session = steps.jobs[job.job_id]
    assert steps.continue_held(session) is None  # acknowledged; its input is fixed
    step = resumed.step_for("p1")
    assert step is not None and step.stage == pb.MASKED
    steps.step(step)
    assert len(resent.streamed) == 5 and resent.streamed[:2] == first.streamed
    _finish(tmp_path, resumed, clients, inputs, steps, log)
    again.close()


def test_mutation_without_the_stored_input_the_job_loses_the_site(tmp_path: Path) -> None:
    job, clients, _, _ = _cut_upload(tmp_path)
    store = HeldJobStore(tmp_path, "p1", clients["p1"]._identity)
    store.masked_path(job.job_id).unlink()  # what a site without this fix had on disk
    steps, again, log = _restart(tmp_path, job, clients["p1"]._identity)
    assert any("stored masked input cannot be used" in line for line in log), log
    step = job.step_for("p1")
    assert step is not None
    steps.step(step)
    assert again.streamed == []  # nothing to send: it refuses, as before the fix
    assert any("never computed twice" in line for line in log), log
    job.withdraw("p1", "refused")
    job.advance(frozenset(IDS))
    outcome = job.outcome
    assert outcome is not None and outcome.status == "failed"  # threshold 4: lost
    assert "p1" in outcome.dropped


def test_a_different_input_from_the_same_site_is_refused(tmp_path: Path) -> None:
    job, clients, _, first = _cut_upload(tmp_path)
    # the cut stream's chunks were never summed, but they were seen: another input
    # in their place is refused, typed, and changes nothing
    altered = bytearray(first.streamed[1])
    altered[-1] ^= 1
    job.begin_upload("p1")
    job.absorb("p1", first.streamed[0])
    with pytest.raises(ServiceError, match="differs from the one it sent before") as info:
        job.absorb("p1", bytes(altered))
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert not job.end_upload("p1")  # abandoned: out of the sum again
    # the identical input is accepted in full
    steps, again, _ = _restart(tmp_path, job, clients["p1"]._identity)
    step = job.step_for("p1")
    assert step is not None
    steps.step(step)
    assert len(again.streamed) == 5
    # a repeat of the complete input is delivered (ALREADY_EXISTS), not summed twice;
    # a different complete input is refused
    job.begin_upload("p1")
    for chunk in again.streamed[:-1]:
        job.absorb("p1", chunk)
    with pytest.raises(ServiceError) as repeat:
        job.absorb("p1", again.streamed[-1])
    assert repeat.value.code is grpc.StatusCode.ALREADY_EXISTS
    assert job.end_upload("p1")
    last = bytearray(again.streamed[-1])
    last[-1] ^= 1
    job.begin_upload("p1")
    with pytest.raises(ServiceError, match="differs"):
        job.absorb("p1", bytes(last))
    assert job.end_upload("p1")
    job.advance(frozenset(IDS))
    assert job.stage_name == "consistency"


def test_mutation_a_repeat_not_compared_would_pass_a_different_input(tmp_path: Path) -> None:
    """Weaken the rule (forget the digests): the altered chunk is taken."""
    job, _, _, first = _cut_upload(tmp_path)
    job._masked.clear()
    altered = bytearray(first.streamed[1])
    altered[-1] ^= 1
    job.begin_upload("p1")
    job.absorb("p1", first.streamed[0])
    job.absorb("p1", bytes(altered))  # no refusal without the comparison
    job.end_upload("p1")
