"""A site killed *before* its masked upload (issue #20): its job is held from the moment
its keys are made, so the restarted process goes on with the *same* keys — the
advertisement the coordinator holds and the shares its neighbours were dealt stay
valid —, redoes its local work when its task comes again, and masks that input for
the same job. The job ends with all four sites (threshold 4: without the site it
would fail) and one release in the site's ledger.

Each crash point of the masked upload (issue #20's narrow window) is injected with
the test-only halt points ``stored`` (the masked input and its record written,
nothing charged) and ``charged`` (charged, no byte sent), and between the two writes
of the store: each leaves either no charge or what sends the identical input.
Mutation check: a site that does not hold its keys comes back unable to rejoin the
job (its job id is claimed, the keys are gone), and the job fails.

Both sides are the real ones: the site's ``SecureSteps`` with its held-jobs folder,
job-id ledger and release ledger on disk, the coordinator's ``SecureJob``; the
transport calls the job's methods in process, as the service does."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.coordinator.errors import ServiceError
from spherecal.participant.faults import Halter, HaltPoint
from spherecal.participant.held_jobs import HeldJob, HeldJobStore
from spherecal.participant.policy import PolicySettings
from spherecal.participant.release_ledger import LedgerRules, Release, ReleaseLedger
from spherecal.participant.secure_jobs import SecureSteps
from spherecal.participant.secure_session import SecureSession, SqliteJobLedger
from spherecal.participant.transport import Transport, TransportError
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from tests.unit.coordinator.helpers import make_job

IDS = ("p0", "p1", "p2", "p3")
OTHERS = frozenset(IDS) - {"p1"}
GRACE_S = 30.0


class Killed(BaseException):
    """The site's process dies here (what SIGKILL does to it)."""


def _die(stage: str, purpose: str, what: str) -> None:
    raise Killed(stage)


class ToJob:
    """The site's transport, straight into the coordinator's job."""

    def __init__(self, job: SecureJob) -> None:
        self.job = job
        self.streamed: list[bytes] = []

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        try:
            self.job.begin_upload("p1")
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message) from None
        try:
            for message in messages:
                if not message.chunk:
                    continue  # the upload's header
                self.streamed.append(bytes(message.chunk))
                self.job.absorb("p1", bytes(message.chunk))
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message) from None
        finally:
            complete = self.job.end_upload("p1")
        if not complete:
            raise TransportError(grpc.StatusCode.INVALID_ARGUMENT, "incomplete upload")
        return pb.UploadReceipt()

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        try:
            self.job.submit("p1", request.stage, bytes(request.message))
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message) from None
        return pb.Receipt()


class Federation:
    """One job of four: p1 is the site under test (restartable), the others are
    plain ``crypto`` participants driven step by step."""

    def __init__(self, tmp_path: Path, *, hold: bool = True) -> None:
        self.tmp_path, self.hold = tmp_path, hold
        self.job, self.clients = make_job(
            4, 40, threshold=4, chunk_entries=8, rejoin_s=GRACE_S
        )
        self.identity = self.clients["p1"]._identity
        self.inputs = {p: np.linspace(-1.0, 1.0, 40) * (k + 1) for k, p in enumerate(IDS)}
        self.release = self.job.job_hex
        self.log: list[str] = []
        self.transport = ToJob(self.job)
        self.steps: SecureSteps | None = None
        self._closers: list[Any] = []

    # ------------------------------------------------------------ the site p1
    def start_site(self, halts: tuple[HaltPoint, ...] = ()) -> SecureSteps:
        """A (re)started p1 process on the same state directory."""
        releases = ReleaseLedger(
            self.tmp_path / "privacy.db", participant="p1", rules=LedgerRules()
        )
        ledger = SqliteJobLedger(self.tmp_path / "jobs.db")
        self._closers += [releases, ledger]
        self.transport = ToJob(self.job)
        self.steps = SecureSteps(
            participant_id="p1",
            identity=self.identity,
            ledger=ledger,
            trust=DirectoryTrust(None),
            transport=cast(Transport, self.transport),
            halter=Halter(halts, _die),
            releases=releases,
            policy=PolicySettings(share_wait_s=0.0),  # the share step from the main loop
            caller=pb.Caller,
            refuse=lambda task, exc: self.log.append(f"refused {task[:8]}: {exc}"),
            log=self.log.append,
            store=HeldJobStore(self.tmp_path, "p1", self.identity) if self.hold else None,
            federation=lambda: "fed-1",
        )
        self.steps.restore_held("fed-1")
        return self.steps

    def start_task(self, *, donates_input: bool = False) -> SecureSession | None:
        """p1 gets its task (again): reserve, then start or continue the job."""
        steps = self.steps
        assert steps is not None
        steps.releases.reserve(
            Release(kind="ffc", federation="fed-1", model=b"m" * 32, data=b"d" * 32),
            job=self.release,
        )
        return steps.start(
            "task-1",
            self.job.job_message("p1"),
            round_index=None,
            expected_length=40,
            release=self.release,
            donates_input=donates_input,
        )

    def task(self) -> None:
        """p1 gets its task (again) and does its local work."""
        session = self.start_task()
        if session is not None:
            assert self.steps is not None
            assert self.steps.set_input("task-1", session, self.inputs["p1"])

    def site_step(self) -> None:
        step = self.job.step_for("p1")
        assert step is not None
        assert self.steps is not None
        self.steps.step(step)

    def through_shares(self) -> None:
        """The task, then everyone's advertise and share stages (p1 one step each)."""
        self.task()
        self.others("advertise")
        self.job.advance(frozenset(IDS))
        self.site_step()
        self.others("share")
        self.job.advance(frozenset(IDS))

    def released(self) -> int:
        releases = ReleaseLedger(
            self.tmp_path / "privacy.db", participant="p1", rules=LedgerRules()
        )
        try:
            return sum(1 for job, _, _ in releases.released() if job == self.release)
        finally:
            releases.close()

    # ------------------------------------------------------------ the others
    def others(self, stage: str) -> None:
        for p in sorted(OTHERS):
            client = self.clients[p]
            if stage == "advertise":
                self.job.submit(p, pb.ADVERTISE, client.advertise_keys().to_bytes())
                continue
            step = self.job.step_for(p)
            assert step is not None, (stage, p)
            if stage == "share":
                roster = crypto.KeyRoster.from_bytes(step.message)
                self.job.submit(p, pb.SHARE, client.share_keys(roster).to_bytes())
            elif stage == "masked":
                client.receive_shares(crypto.ShareBundle.from_bytes(step.message))
                client.set_input(self.inputs[p])
                self.job.begin_upload(p)
                for chunk in client.masked_chunks():
                    self.job.absorb(p, chunk.to_bytes())
                assert self.job.end_upload(p)
            elif stage == "consistency":
                request = crypto.ConsistencyRequest.from_bytes(step.message)
                self.job.submit(p, pb.CONSISTENCY, client.consistency_signature(request).to_bytes())
            else:
                answer = client.unmask(crypto.UnmaskRequest.from_bytes(step.message))
                self.job.submit(p, pb.UNMASK, answer.to_bytes())

    def gone(self, stage: str) -> None:
        """p1 is dead: the stage waits for it (``rejoin_grace_s``), it does not close."""
        self.job.advance(OTHERS)
        assert self.job.stage_name == stage and self.job.outcome is None

    def close(self) -> None:
        for closer in self._closers:
            closer.close()


@pytest.fixture
def fed(tmp_path: Path) -> Iterable[Federation]:
    federation = Federation(tmp_path)
    yield federation
    federation.close()


def _finish(fed: Federation, *, from_stage: str = "consistency") -> None:
    everyone = frozenset(IDS)
    stages = ("share", "masked", "consistency", "unmask")
    for stage in stages[stages.index(from_stage) :]:
        assert fed.job.stage_name == stage, (stage, fed.log)
        fed.others(stage)
        if fed.job.step_for("p1") is not None:
            fed.site_step()
        fed.job.advance(everyone)
    outcome = fed.job.outcome
    assert outcome is not None and outcome.status == "done", (outcome, fed.log)
    assert outcome.contributors == IDS and outcome.dropped == {}
    np.testing.assert_allclose(np.asarray(outcome.values), sum(fed.inputs.values()), atol=1e-6)
    assert fed.released() == 1
    assert fed.steps is not None and fed.steps.store is not None
    assert fed.steps.store.job_ids() == []  # the job ended: its files are gone
    assert not list(fed.steps.store.folder.glob("*.masked"))


def _advert_of_p1(fed: Federation) -> bytes:
    return fed.job._accepted[("p1", pb.ADVERTISE)]


def test_killed_before_its_advertisement_left_the_site_advertises_the_same_keys(
    fed: Federation,
) -> None:
    fed.start_site((HaltPoint("advertise"),))
    with pytest.raises(Killed):
        fed.task()
    store = HeldJobStore(fed.tmp_path, "p1", fed.identity)
    held = crypto.HeldState.from_bytes(store.load(fed.job.job_id).state)
    assert held.stage is crypto.HeldStage.ADVERTISED and held.keys is not None
    assert ("p1", pb.ADVERTISE) not in fed.job._accepted  # nothing left the site
    fed.others("advertise")
    fed.gone("advertise")
    steps = fed.start_site()
    assert any("with the keys it advertised" in line for line in fed.log), fed.log
    fed.task()  # the task again: the held advertisement goes, the local work runs
    sent = dict(steps.jobs[fed.job.job_id].sent())[pb.ADVERTISE]
    assert crypto.AdvertiseKeys.from_bytes(sent).masking_public == _public(held.keys, 1)
    fed.job.advance(frozenset(IDS))
    _finish(fed, from_stage="share")


def _public(keys: tuple[bytes, bytes, bytes] | None, which: int) -> bytes:
    from spherecal.crypto.keys import x25519_public_from_private

    assert keys is not None
    return x25519_public_from_private(keys[which])


@pytest.mark.parametrize("hold", [True, False])
def test_killed_at_the_share_stage_the_site_deals_with_the_same_keys(
    tmp_path: Path, hold: bool
) -> None:
    """With its job held, the restarted site deals shares of the keys it advertised
    and the job ends with all four. Mutation check (``hold = False``, the site as it
    was): it comes back with nothing — its job id is claimed, so it refuses a job it
    cannot run again — and the job, needing all four, fails."""
    fed = Federation(tmp_path, hold=hold)
    try:
        fed.start_site((HaltPoint("share"),))
        fed.task()
        fed.others("advertise")
        fed.job.advance(frozenset(IDS))
        with pytest.raises(Killed):
            fed.site_step()
        assert ("p1", pb.SHARE) not in fed.job._accepted
        fed.others("share")
        fed.gone("share")
        fed.start_site()
        fed.task()  # the task again (the coordinator hands it to the new session)
        if not hold:
            assert any("never run twice" in line for line in fed.log), fed.log
            fed.job.withdraw("p1", "refused")  # its withdrawal, as the service records it
            fed.job.advance(frozenset(IDS))
            outcome = fed.job.outcome
            assert outcome is not None and outcome.status == "failed", fed.log
            assert "p1" in outcome.dropped
            return
        fed.site_step()  # the share step, answered with the held keys
        fed.job.advance(frozenset(IDS))
        _finish(fed, from_stage="masked")
    finally:
        fed.close()


def test_killed_after_sharing_before_its_upload_the_site_masks_the_recomputed_input(
    fed: Federation,
) -> None:
    fed.start_site()
    fed.through_shares()
    fed.others("masked")
    # p1 dies in its local work (a step that never came): held at the shared stage
    store = HeldJobStore(fed.tmp_path, "p1", fed.identity)
    held = crypto.HeldState.from_bytes(store.load(fed.job.job_id).state)
    assert held.stage is crypto.HeldStage.SHARED and held.adverts
    fed.gone("masked")
    steps = fed.start_site()
    fed.task()
    shares = dict(steps.jobs[fed.job.job_id].sent())[pb.SHARE]
    assert fed.job._accepted[("p1", pb.SHARE)] == _sha(shares)  # the same shares again
    fed.site_step()  # the masked stage: its bundle, then the upload
    assert len(fed.transport.streamed) == 5
    fed.job.advance(frozenset(IDS))
    _finish(fed)


def _sha(data: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(data).digest()


def _to_masked(fed: Federation, halts: tuple[HaltPoint, ...]) -> None:
    fed.start_site(halts)
    fed.through_shares()
    fed.others("masked")


@pytest.mark.parametrize("point", ["stored", "charged"])
def test_a_crash_in_the_upload_window_leaves_the_identical_input_and_one_charge(
    fed: Federation, point: str
) -> None:
    _to_masked(fed, (HaltPoint(point),))
    with pytest.raises(Killed):
        fed.site_step()
    assert fed.transport.streamed == []  # no byte left
    assert fed.released() == (1 if point == "charged" else 0)
    store = HeldJobStore(fed.tmp_path, "p1", fed.identity)
    record = store.load(fed.job.job_id)
    assert record.masked is not None  # the stored input, named by its record ...
    held = crypto.HeldState.from_bytes(record.state)
    assert held.stage is crypto.HeldStage.MASKED and held.keys is None  # ... and no keys
    stored = list(store.masked_chunks(fed.job.job_id))
    fed.gone("masked")
    fed.start_site()
    fed.task()  # its input is fixed: what it sent is acknowledged, nothing recomputed
    fed.site_step()
    assert fed.transport.streamed == stored  # the stored bytes, charged once
    fed.job.advance(frozenset(IDS))
    _finish(fed)


def test_a_crash_between_the_stored_input_and_its_record_charges_nothing(
    fed: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the masked chunks were written, before the record naming them:
    nothing was charged or sent; the restart deletes the unnamed file and masks
    again — the same keys and the same input give the same bytes."""
    _to_masked(fed, ())
    real_save = HeldJobStore.save

    def save(self: HeldJobStore, job_id: bytes, record: HeldJob) -> None:
        if record.masked is not None:
            raise Killed("between the two writes")
        real_save(self, job_id, record)

    monkeypatch.setattr(HeldJobStore, "save", save)
    with pytest.raises(Killed):
        fed.site_step()
    monkeypatch.setattr(HeldJobStore, "save", real_save)
    store = HeldJobStore(fed.tmp_path, "p1", fed.identity)
    first = list(store.masked_chunks(fed.job.job_id))
    assert store.load(fed.job.job_id).masked is None and fed.released() == 0
    fed.start_site()
    assert any("is not its record's; deleting it" in line for line in fed.log), fed.log
    assert not store.masked_path(fed.job.job_id).exists()
    fed.task()
    fed.site_step()
    assert fed.transport.streamed == first
    fed.job.advance(frozenset(IDS))
    _finish(fed)


def test_the_live_upload_sends_the_stored_bytes_from_memory_a_restart_reads_the_file(
    fed: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process that stored its masked input streams the very chunks it wrote
    (issue #24: no read-back and decryption of the file on the critical path); only a
    restarted process, which has nothing else, reads the file — and both send the
    same bytes."""
    _to_masked(fed, ())
    real_read = HeldJobStore.masked_chunks

    def unreadable(self: HeldJobStore, job_id: bytes) -> Iterator[bytes]:
        raise AssertionError("the live upload read the stored file back")

    monkeypatch.setattr(HeldJobStore, "masked_chunks", unreadable)
    fed.site_step()
    monkeypatch.setattr(HeldJobStore, "masked_chunks", real_read)
    assert fed.steps is not None and fed.steps.store is not None
    assert list(fed.steps.store.masked_chunks(fed.job.job_id)) == fed.transport.streamed
    session = fed.steps.jobs[fed.job.job_id]
    assert session.stored_chunks is None  # delivered: the memory is given back
    assert fed.released() == 1
    fed.job.advance(frozenset(IDS))
    _finish(fed)


def test_a_stored_uncharged_input_of_an_ended_federation_goes_uncharged(
    fed: Federation,
) -> None:
    _to_masked(fed, (HaltPoint("stored"),))
    with pytest.raises(Killed):
        fed.site_step()
    fed.job.abort("the federation stopped")
    steps = fed.start_site()
    steps.end_federation()
    assert steps.store is not None and steps.store.job_ids() == []
    assert not list(steps.store.folder.glob("*.masked"))
    assert fed.released() == 0


def test_without_its_input_a_restored_session_refuses_the_masked_step(fed: Federation) -> None:
    fed.start_site()
    fed.through_shares()
    steps = fed.start_site()  # restarted before its task came again
    fed.site_step()
    assert fed.transport.streamed == [] and fed.released() == 0
    assert any("came before this site's input" in line for line in fed.log), fed.log
    assert steps.jobs == {}


def test_killed_between_claiming_the_job_and_holding_its_keys_the_site_runs_it_afresh(
    fed: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job id is claimed before the keys exist; the keys are held before the
    advertisement leaves. Killed in between, the site has nothing on disk and sent
    nothing: its claim is still pending, so its task, again, runs the job with new
    keys instead of being refused as a replay."""

    def save(self: HeldJobStore, job_id: bytes, record: HeldJob) -> None:
        raise Killed("before the keys were held")

    fed.start_site()
    with monkeypatch.context() as patched:
        patched.setattr(HeldJobStore, "save", save)
        with pytest.raises(Killed):
            fed.task()
    assert ("p1", pb.ADVERTISE) not in fed.job._accepted
    fed.others("advertise")
    fed.gone("advertise")
    steps = fed.start_site()
    assert steps.jobs == {}  # nothing held
    fed.task()
    assert fed.job.job_id in steps.jobs and not any("refused" in line for line in fed.log)
    fed.job.advance(frozenset(IDS))
    _finish(fed, from_stage="share")


def test_once_the_keys_left_a_claim_is_final_across_restarts(tmp_path: Path) -> None:
    job = b"\x05" * 16
    first = SqliteJobLedger(tmp_path / "jobs.db")
    first.claim("p1", job)
    first.claim("p1", job)  # pending: nothing left yet, the job may start again
    first.keys_out("p1", job)
    first.close()
    again = SqliteJobLedger(tmp_path / "jobs.db")
    with pytest.raises(crypto.JobReplayed):
        again.claim("p1", job)
    again.close()


def test_a_job_ledger_written_before_keeps_every_claim_final(tmp_path: Path) -> None:
    import sqlite3

    with sqlite3.connect(tmp_path / "jobs.db") as conn:
        conn.execute(
            "CREATE TABLE jobs (participant TEXT, job_id BLOB, PRIMARY KEY (participant, job_id))"
        )
        conn.execute("INSERT INTO jobs VALUES ('p1', ?)", (b"\x06" * 16,))
    ledger = SqliteJobLedger(tmp_path / "jobs.db")
    with pytest.raises(crypto.JobReplayed):
        ledger.claim("p1", b"\x06" * 16)
    ledger.close()


def test_in_its_share_wait_the_task_again_is_the_same_job_not_the_coordinator_moving_on(
    fed: Federation,
) -> None:
    """A site that reconnects (a new session) while it waits for its share step is
    handed its task again (``SecureJob.rejoined``): that is its own job, so it keeps
    waiting and answers the share step — it does not drop the job."""
    steps = fed.start_site()
    fed.others("advertise")
    job_message = fed.job.job_message("p1")
    polls: list[pb.Instruction] = []

    def next_instruction(request: pb.InstructionRequest) -> pb.Instruction:
        if not polls:  # first poll: the task again; then the share step
            fed.job.advance(frozenset(IDS))
            polls.append(pb.Instruction(statistics=pb.StatisticsTask(secure=job_message)))
            return polls[-1]
        step = fed.job.step_for("p1")
        assert step is not None and step.stage == pb.SHARE
        polls.append(pb.Instruction(secagg=step))
        return polls[-1]

    fed.transport.next_instruction = next_instruction  # type: ignore[attr-defined]
    steps.share_wait_s = 30.0
    fed.task()
    assert len(polls) == 2 and fed.job.job_id in steps.jobs, fed.log
    assert ("p1", pb.SHARE) in fed.job._accepted  # answered before its local work
    assert any("shared keys before the local work" in line for line in fed.log), fed.log
    fed.others("share")
    fed.job.advance(frozenset(IDS))
    _finish(fed, from_stage="masked")


def test_a_masked_input_that_cannot_be_stored_goes_only_once_the_keys_are_off_disk(
    fed: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The masked chunks cannot be written (disk full): the record is replaced by one
    without keys and the upload goes from memory — a restart then cannot mask a
    second, recomputed input under the same masks; it answers the later stages."""
    _to_masked(fed, ())

    def full(*args: object, **kwargs: object) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(HeldJobStore, "save_masked", full)
    fed.site_step()
    assert len(fed.transport.streamed) == 5 and fed.released() == 1
    store = HeldJobStore(fed.tmp_path, "p1", fed.identity)
    record = store.load(fed.job.job_id)
    held = crypto.HeldState.from_bytes(record.state)
    assert record.masked is None and held.keys is None  # no keys beside a sent input
    assert held.stage is crypto.HeldStage.MASKED
    fed.job.advance(frozenset(IDS))
    fed.start_site()  # restarted after its upload: answers the rest as a survivor
    _finish(fed)


def test_if_the_keys_cannot_be_taken_off_disk_nothing_is_sent(
    fed: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation of the safety rule's premise: the store refuses every write and every
    delete. The site withdraws — no byte, no charge — rather than leave its keys on
    disk beside a sent masked input."""
    _to_masked(fed, ())

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    for name in ("save_masked", "save", "delete"):
        monkeypatch.setattr(HeldJobStore, name, broken)
    fed.site_step()
    assert fed.transport.streamed == [] and fed.released() == 0
    assert any("neither replaced" in line for line in fed.log), fed.log


def test_a_held_job_taken_up_again_is_charged_its_epsilon_once(tmp_path: Path) -> None:
    """A DP statistics release and a distributed DP-SGD step are charged to the
    site's privacy ledger by job id before the keys are made; the restarted site
    admits the same job again when its task comes again — one charge, not two."""
    from spherecal.participant.dp_gate import BudgetExceeded, ParticipantPrivacy
    from spherecal.spherefed.privacy.charge import dpsgd_charge
    from spherecal.spherefed.privacy.settings import PrivacySettings

    charge = dpsgd_charge(1.0, 0.05, 40, 1e-5, max_grad_norm=1.0)
    settings = PrivacySettings(
        enabled=True, epsilon=5.0, total_epsilon=1.05 * charge.epsilon, delta=1e-5
    )
    first = ParticipantPrivacy(settings, "p1", tmp_path)
    entry = first.charge(charge, delta=1e-5, release_id="dpsgd-job-a")
    first.close()  # the process dies; its task comes again after the restart
    again = ParticipantPrivacy(settings, "p1", tmp_path)
    assert again.charge(charge, delta=1e-5, release_id="dpsgd-job-a") == entry
    assert again.ledger(1e-5).spent("p1").releases == 1
    with pytest.raises(BudgetExceeded):  # another job is another charge
        again.charge(charge, delta=1e-5, release_id="dpsgd-job-b")
    again.close()
