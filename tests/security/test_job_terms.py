"""A key a coordinator chooses admits one release: a held job's id one spec, a
plaintext task id one value.

Two attacks of a hostile coordinator, each played against the real
:class:`ParticipantRunner` (real trainer, SQLite release ledger, real secure
aggregation with the other members colluding: their inputs are known and unnoised).

* **A held job sent again under other terms.** A site keeps a job's session when its
  local work stops after the keys left (a download that fails), and continues it
  when the task comes again — encoding, noising and masking under the spec the
  session was started with, while the task that came again plans its noise from the
  spec it carries. A coordinator that sends the job again with the same id and
  ``scale_bits`` 0 instead of 24 had the site draw noise in units of 2^0 and add it
  to an encoding at 2^24: the sum minus the others read the site's evaluation
  counts to 10^-7, where its noise has a standard deviation of ≈ 0.46 counts. The
  site now continues a held job only under the same spec and purpose, and refuses
  any other at once (``SecureSteps.held``; what it refuses is what the coordinator
  sent).
* **A plaintext task id used again** (with ``allow_plaintext``): the ledger keyed the
  release ``task-<task id>`` and skipped that key's own row in every rule, so a
  second task under the id passed every rule uncounted — seven evaluations where the
  site allows four, a round's update twice. A key now admits the release it was
  reserved for (``ReleaseLedger._check_key``), and a plaintext key the value that
  left under it, never another (``ReleaseLedger.consume``'s ``value``).

* **A settled job asked again.** A job whose input is withheld (outside the bound,
  failed local work) had no input, so the task asked again ran its local work again —
  downloads included, and a model renamed outside the task's context missed the
  cache: the coordinator saw which outcome the first run had before any masked step,
  abandoned the job (nothing charged) and asked again (a site's example count read
  exactly in 14 jobs). A job whose input is set *or* withheld is now continued as
  it is (``SecureSteps.settled``), and with ``[policy] min_local_work_s`` a withheld
  input waits as long as a computed one before the site speaks again.
* **A withheld job across the site's restart.** The withheld mark lived in the
  process: a site restarted between its local work and the masked step ran the work
  again and sent what it now gave (a failed allocation that did not fail twice) — a
  second outcome for one job. The mark is now in the job's held record, and the
  restarted site withdraws at the masked step, charged once, while still running the
  local work again as a set input's job must (its input is not kept), so that the
  restart shows the coordinator the same downloads either way.

The first three have their mutation checks in this file: the old lookup, the ledger
without the key check, or the continuation of set inputs only, lets the attack
through; the fourth's test fails on the code before the mark was kept (checked by
hand: the restarted site's masked input left).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.crypto.dp import guaranteed_contributors
from spherecal.participant import release_ledger
from spherecal.participant.data import LocalData
from spherecal.participant.failures import WITHHELD_TEXT
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.secure_jobs import SecureSteps
from spherecal.participant.secure_session import SecureSession, SqliteJobLedger
from spherecal.participant.trainer import LocalTrainer
from spherecal.participant.transport import TransportError
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.task_context import task_context
from spherecal.spherefed.privacy.evaluation_noise import plan_evaluation_noise
from spherecal.spherefed.privacy.settings import PrivacySettings
from tests.security.hostile_plan import hostile_join_reply
from tests.security.hostile_ring import (
    DIRECTORY,
    IDENTITIES,
    TARGET,
    HostileRing,
    RingJob,
    make_job,
    run_target,
    target_settings,
)

ROSTER = ("p0", "p1", "p2", "p3")
JOB_ID = b"J" * 16
NOISE_SD = 0.8
"""The evaluation noise's standard deviation the job plans for, over all members."""


def _evaluation_spec(scale_bits: int) -> crypto.JobSpec:
    """An evaluation job of one head (``[total, correct(none), correct(h)]``) whose
    noise is planned at ``scale_bits``, as an honest coordinator plans it."""
    base = make_job(ROSTER, 3, bound=1000.0, scale_bits=scale_bits, job_id=JOB_ID).spec
    noise = plan_evaluation_noise(
        NOISE_SD,
        participants=base.n,
        min_contributors=guaranteed_contributors(base),
        length=3,
        scale_bits=scale_bits,
    )
    return dataclasses.replace(base, noise_bound=noise.plan.noise_bound)


class ResendingRing(HostileRing):
    """A ring whose server acknowledges an identical resend (a continued job) with
    ALREADY_EXISTS, as the service does."""

    def __init__(self, *, federation: str, model: GlobalModel) -> None:
        super().__init__(federation=federation, model=model)
        self.seen: dict[tuple[bytes, int], bytes] = {}
        self.downloads: list[str] = []

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]:
        self.downloads.append(request.name)
        return super().download_tensor(request)

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        key = (bytes(request.job_id), int(request.stage))
        if self.seen.get(key) == bytes(request.message):
            raise TransportError(grpc.StatusCode.ALREADY_EXISTS, "identical resend")
        self.seen[key] = bytes(request.message)
        return super().submit_secagg(request)


class ResentJobRing(ResendingRing):
    """The evaluation's job at ``first`` scale bits; the head's download fails once
    after the site's keys and shares left; the task again under the same job id at
    ``again`` scale bits (the server and the others keep the first spec); then the
    masked step, and the rest of the job."""

    def __init__(self, model: GlobalModel, head: np.ndarray, *, first: int, again: int) -> None:
        super().__init__(federation="fed", model=model)
        self.first, self.again = first, again
        self.model_ref = self.publish("model", model.initial_vector)
        self.head_ref = self.publish("head-h", head)
        self.failed_once = False
        self.phase = 0
        self.masked: list[pb.Instruction] = []
        self.job: RingJob | None = None

    def _task(self, spec: crypto.JobSpec) -> pb.Instruction:
        secure = pb.SecAggJob(
            spec=spec.to_bytes(),
            purpose="evaluate",
            directory=[
                pb.DirectoryEntry(participant_id=p, identity_public_key=key)
                for p, key in sorted(DIRECTORY.items())
                if p in crypto.keys_needed(spec, TARGET)
            ],
        )
        instruction = pb.Instruction(
            task_id="eval",
            evaluate=pb.EvaluateTask(
                model=self.model_ref,
                heads=[pb.NamedTensorRef(name="h", tensor=self.head_ref)],
                split=pb.SPLIT_TEST,
                round=-1,
                secure=secure,
            ),
        )
        bound = dataclasses.replace(spec, context=task_context(instruction.evaluate, self.joined))
        instruction.evaluate.secure.spec = bound.to_bytes()
        return instruction

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self._steps:
            step = self._steps.pop(0)
            if step.secagg.stage == pb.MASKED and self.phase == 1:
                self.masked.append(step)  # held back until the task came again
                return pb.Instruction(wait=pb.Wait())
            return step
        if self.phase == 0:
            self.phase = 1
            instruction = self._task(_evaluation_spec(self.first))
            spec = crypto.JobSpec.from_bytes(instruction.evaluate.secure.spec)
            self.job = RingJob(spec=spec, others={p: np.zeros(3) for p in ROSTER[1:]})
            self.jobs[JOB_ID] = self.job
            self._start(self.job)
            return instruction
        if self.phase == 1 and self.failed_once:
            self.phase = 2
            return self._task(_evaluation_spec(self.again))
        if self.phase == 2 and self.masked:
            return self.masked.pop(0)
        return pb.Instruction(done=pb.Done(status="completed", message="over"))

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]:
        if request.name == "head-h" and not self.failed_once:
            self.failed_once = True
            raise TransportError(grpc.StatusCode.UNAVAILABLE, "connection reset")
        return super().download_tensor(request)


def _exact_counts(model: GlobalModel, data: LocalData, head: np.ndarray) -> np.ndarray:
    trainer = LocalTrainer(hostile_join_reply("fed", model, len(ROSTER)).plan, data)
    total, counts = trainer.evaluate(model.initial_vector, {"h": head}, split="test")
    return np.array([total, counts["none"], counts["h"]], dtype=np.float64)


def _released(tmp: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(tmp / "state" / "privacy.db")
    try:
        rows = conn.execute("SELECT kind, answer FROM site_releases WHERE state = 'released'")
        return [(str(k), str(a)) for k, a in rows]
    finally:
        conn.close()


def _play(
    tmp: Path, model: GlobalModel, data: LocalData, *, first: int, again: int
) -> tuple[ResentJobRing, np.ndarray]:
    head = np.zeros((model.num_classes, model.feature_dim))  # "always class 0"
    ring = ResentJobRing(model, head, first=first, again=again)
    run_target(target_settings(tmp), ring, data)
    return ring, _exact_counts(model, data, head)


def test_a_held_job_sent_again_with_another_spec_is_refused(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring, _ = _play(tmp_path, model, data, first=24, again=0)
    refused, masked = ring.failures
    assert refused.task_id == "eval"
    assert pb.FailureKind.Name(refused.kind) == "PROTOCOL_VIOLATION"
    assert "under another spec or purpose" in refused.reason
    # the held job keeps its first spec and has no input: its masked step is answered
    # as out of order, never with an input
    assert masked.task_id == JOB_ID.hex() and "before this site's input" in masked.reason
    # nothing of the input left: no masked input, no release
    assert "MASKED" not in ring.target_stages and ring.job is not None
    assert ring.job.result is None
    assert _released(tmp_path) == []


def test_a_held_job_sent_again_with_its_own_spec_is_continued_with_its_noise(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The honest case the rule keeps: a task that comes again after a failed download
    continues the held job, and the site's counts leave with their noise."""
    ring, exact = _play(tmp_path, model, data, first=16, again=16)
    assert ring.failures == [] and ring.job is not None
    read = ring.job.target_release()
    assert np.max(np.abs(read - exact)) > 1e-3  # the site's own noise is in it
    assert np.max(np.abs(read - exact)) < 20 * NOISE_SD
    assert _released(tmp_path) == [("evaluate", "input")]


def test_mutation_a_held_job_found_by_its_id_alone_reads_the_counts(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lookup before the rule (by job id alone): the coordinator reads the
    site's exact counts through its own noise plan at another scale."""

    def by_id_alone(self: SecureSteps, job: pb.SecAggJob) -> SecureSession | None:
        return self.jobs.get(crypto.JobSpec.from_bytes(job.spec).job_id)

    monkeypatch.setattr(SecureSteps, "held", by_id_alone)
    ring, exact = _play(tmp_path, model, data, first=24, again=0)
    assert ring.failures == [] and ring.job is not None
    assert np.max(np.abs(ring.job.target_release() - exact)) < 1e-5  # no noise left


# ---------------------------------------------------------------- a settled job asked again
class WithheldAgainRing(ResendingRing):
    """A training round whose every forward pass overflows (its input is withheld);
    once the site has answered the share step and done its local work, the same task
    again with its model published under another name (outside the task's context),
    then the masked step. Records when the site asked next after its share answer."""

    def __init__(self, model: GlobalModel) -> None:
        super().__init__(federation="fed", model=model)
        exploding = model.initial_vector * 1e30
        job = make_job(ROSTER, model.length + 2)
        self.script = [self.train(exploding, job)]
        self.renamed: pb.TensorRef | None = self.publish("global-0-renamed", exploding)
        self.first: pb.Instruction | None = None
        self.masked: list[pb.Instruction] = []
        self.handed_at: float | None = None
        self.shared_at: float | None = None
        self.next_poll_at: float | None = None
        """The first poll after the share answer (handed, shared: when the task was
        given, when its share answer came)."""

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        if request.stage == pb.SHARE and self.shared_at is None:
            self.shared_at = time.monotonic()
        return super().submit_secagg(request)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self.shared_at is not None and self.next_poll_at is None:
            self.next_poll_at = time.monotonic()
        if self.first is None:
            self.first = super().next_instruction(request)  # bound to its task, job started
            self.handed_at = time.monotonic()
            return self.first
        if self._steps:
            step = self._steps.pop(0)
            if step.secagg.stage == pb.MASKED and not self.masked and self.renamed is not None:
                self.masked.append(step)  # held back: the task comes again first
                again = pb.Instruction()
                again.CopyFrom(self.first)
                again.train.model.CopyFrom(self.renamed)  # same bytes, another name
                self.renamed = None
                return again
            return step
        if self.masked:
            return self.masked.pop(0)
        return pb.Instruction(done=pb.Done(status="completed", message="over"))


def test_a_withheld_job_asked_again_runs_no_local_work_again(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """Asked again, a job whose input is withheld is continued like one whose input
    is set — what it sent is sent again, nothing downloaded or computed — so the
    coordinator cannot tell the two apart before the masked step and abandon the job
    for free (14 abandoned jobs bisected a site's example count to its exact value
    before 2026-11-27)."""
    ring = WithheldAgainRing(model)
    run_target(target_settings(tmp_path), ring, data)
    assert "global-0-renamed" not in ring.downloads, ring.downloads
    (failure,) = ring.failures  # the refusal, at the masked step, once
    assert failure.reason == WITHHELD_TEXT
    assert _released(tmp_path) == [("update", "refusal")]


def test_mutation_a_withheld_job_asked_again_runs_again(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Continued only when its input is set (before the rule): the withheld job's task
    runs again, and the model under its new name is downloaded — the answer."""
    monkeypatch.setattr(SecureSteps, "settled", lambda _self, s: s.client.has_input)
    ring = WithheldAgainRing(model)
    run_target(target_settings(tmp_path), ring, data)
    assert "global-0-renamed" in ring.downloads


def test_a_withheld_input_waits_min_local_work_like_a_computed_one(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """With ``[policy] min_local_work_s`` a site speaks again no earlier than that
    long after its local work began, whatever the work's outcome; a failed local work
    (training that overflows) used to go back to the main loop at once. Asserted is
    the guard's lower bound only: ``time.sleep`` never returns early."""
    hold = 1.0
    ring = WithheldAgainRing(model)
    settings = target_settings(tmp_path, min_local_work_s=hold)
    run_target(settings, ring, data)
    assert ring.handed_at is not None and ring.next_poll_at is not None
    assert ring.next_poll_at - ring.handed_at >= hold
    (failure,) = ring.failures
    assert failure.reason == WITHHELD_TEXT


# ---------------------------------------------------------------- a withheld job across a restart
class Killed(BaseException):
    """The site's process dies here (what SIGKILL does to it)."""


class RestartRing(ResendingRing):
    """A secure training round around a site whose process dies between its local work
    and the job's masked step: the task, the site's keys and shares, its local work;
    then, instead of the masked step, the process is killed. The restarted process
    (another runner on the same state directory) joins, is handed its task again — as
    the service's coordinator does for a site that comes back (``SecureJob.rejoined``)
    — and then gets the masked step and the rest of the job."""

    def __init__(self, model: GlobalModel) -> None:
        super().__init__(federation="fed", model=model)
        self.job = make_job(ROSTER, model.length + 2)
        self.script = [self.train(model.initial_vector, self.job)]
        self.first: pb.Instruction | None = None
        self.masked: list[pb.Instruction] = []
        self.killed = False
        self.asked_again = False
        self.masked_uploads = 0

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self.first is None:
            self.first = super().next_instruction(request)  # bound to its task, job started
            return self.first
        if not self.killed and self._steps and self._steps[0].secagg.stage == pb.MASKED:
            self.masked.append(self._steps.pop(0))
            self.killed = True
            raise Killed("the site's process dies before the job's masked step")
        if self.killed and not self.asked_again:
            self.asked_again = True
            again = pb.Instruction()
            again.CopyFrom(self.first)
            return again
        if self.masked:
            return self.masked.pop(0)
        return super().next_instruction(request)

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        self.masked_uploads += 1
        return super().upload_masked(messages)


def _run_site(tmp: Path, ring: HostileRing, data: LocalData, log: list[str]) -> int:
    """Run one process of the target site on ``tmp``'s state directory (its job-id
    ledger on disk, as ``participant.main`` makes it) until it ends or dies."""
    settings = target_settings(tmp)
    ledger = SqliteJobLedger(settings.state_dir / "jobs.db")
    try:
        return ParticipantRunner(
            settings, ring, data, IDENTITIES[TARGET], ledger, DirectoryTrust(None), log=log.append
        ).run()
    finally:
        ledger.close()


def test_a_job_withheld_before_the_sites_restart_stays_withheld(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first process's local work fails (a failed allocation), so the job's input
    is withheld; it dies before the masked step. The second process, on the same state
    directory, restores the job withheld from its held record: it runs the local work
    again when the task comes again — as it must for a job whose input was set, which
    is not kept, so the coordinator sees the same downloads either way — but sends
    none of it: the masked step gets the charged withdrawal. Before 2026-11-27 the
    mark lived in the first process's memory, and the second sent the input its
    training now gave: a second outcome for one job (this test then fails: no
    failure report, an input in the ledger)."""
    ring = RestartRing(model)
    log: list[str] = []
    with monkeypatch.context() as patched:

        def out_of_memory(*_args: object, **_kwargs: object) -> None:
            raise MemoryError("cannot allocate the batch")

        patched.setattr(LocalTrainer, "train", out_of_memory)
        with pytest.raises(Killed):
            _run_site(tmp_path, ring, data, log)
    assert ring.killed and ring.failures == [] and _released(tmp_path) == []
    downloads_before = len(ring.downloads)
    assert _run_site(tmp_path, ring, data, log) == 0  # the restarted process
    assert ring.masked_uploads == 0 and ring.job.result is None  # no input left
    (failure,) = ring.failures
    assert failure.task_id == "train-0" and failure.reason == WITHHELD_TEXT
    assert pb.FailureKind.Name(failure.kind) == "BAD_INPUT"
    assert _released(tmp_path) == [("update", "refusal")]  # charged once
    assert "global-0" in ring.downloads[downloads_before:]  # as a set input's job would
    assert any(
        "its input was withheld before this site's restart (MemoryError)" in line for line in log
    ), log


# ---------------------------------------------------------------- plaintext task ids
def _evaluations(ring: HostileRing, model: GlobalModel, task_ids: list[str]) -> None:
    ref = ring.publish("model", model.initial_vector)
    for k, task_id in enumerate(task_ids):
        head = np.zeros((model.num_classes, model.feature_dim))
        head[k % model.num_classes, 0] = 1e-3 * (k + 1)  # another head each time
        ring.script.append(
            pb.Instruction(
                task_id=task_id,
                evaluate=pb.EvaluateTask(
                    model=ref,
                    heads=[pb.NamedTensorRef(name="h", tensor=ring.publish(f"head-{k}", head))],
                    split=pb.SPLIT_TEST,
                    round=0,
                ),
            )
        )


def _updates(ring: HostileRing, model: GlobalModel, task_ids: list[str], seeds: list[int]) -> None:
    ref = ring.publish("model", model.initial_vector)
    for task_id, seed in zip(task_ids, seeds, strict=True):
        ring.script.append(
            pb.Instruction(task_id=task_id, train=pb.TrainTask(model=ref, round=0, seed=seed))
        )


def _plaintext(
    tmp: Path,
    model: GlobalModel,
    data: LocalData,
    task_ids: list[str],
    *,
    seeds: list[int] | None = None,
) -> tuple[int, list[tuple[str, str]]]:
    """(answers that left, refusals as (task, rule)) of plaintext evaluations of
    other heads, or (with ``seeds``) of round 0's update trained with each seed."""
    ring = HostileRing(federation="fed", model=model)
    if seeds is None:
        _evaluations(ring, model, task_ids)
    else:
        _updates(ring, model, task_ids, seeds)
    run_target(dataclasses.replace(target_settings(tmp), allow_plaintext=True), ring, data)
    refusals = [(f.task_id, pb.PolicyRule.Name(f.rule)) for f in ring.failures]
    return len(ring.evaluations) + len(ring.uploads), refusals


def test_evaluations_under_one_plaintext_task_id_leave_once(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    answered, refusals = _plaintext(tmp_path, model, data, ["T"] * 6)
    assert answered == 1
    assert refusals == [("T", "RULE_RELEASE_REPEATED")] * 5


def test_a_rounds_update_trained_again_under_its_task_id_leaves_once(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The same task id with another seed: another value of the same release."""
    answered, refusals = _plaintext(tmp_path, model, data, ["R", "R"], seeds=[7, 8])
    assert answered == 1
    assert refusals == [("R", "RULE_RELEASE_REPEATED")]


def test_the_same_task_asked_again_sends_the_same_value_again(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """What a restarted coordinator does: the same task under the same id. The site
    trains again and sends the same bytes (nothing new leaves), so the round is not
    lost."""
    answered, refusals = _plaintext(tmp_path, model, data, ["R", "R"], seeds=[7, 7])
    assert answered == 2 and refusals == []


class KeepingRing(HostileRing):
    """Records each plaintext upload's bytes (header, then the tensor's data); with
    ``die``, the site's process is killed once the script is done (no ``Done``: the
    federation goes on)."""

    def __init__(self, *, federation: str, model: GlobalModel, die: bool = False) -> None:
        super().__init__(federation=federation, model=model)
        self.sent: list[bytes] = []
        self.die = die

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self.die and not self.script and not self._steps:
            raise Killed("the site's process dies")
        return super().next_instruction(request)

    def upload_tensor(self, messages: Iterable[pb.TensorUpload]) -> pb.UploadReceipt:
        parts = list(messages)
        header = parts[0].header
        self.sent.append(header.update.SerializeToString() + b"".join(p.data for p in parts[1:]))
        return super().upload_tensor(parts)


def _dpsgd_charges(tmp: Path) -> list[str]:
    conn = sqlite3.connect(tmp / "state" / "privacy.db")
    try:
        return [str(r[0]) for r in conn.execute("SELECT release_id FROM privacy_ledger")]
    finally:
        conn.close()


def test_a_local_dpsgd_update_asked_again_is_sent_again_not_trained_again(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a restarted coordinator does — the same task, its id and seed — with local
    DP-SGD and ``allow_plaintext``: training again draws fresh noise, another value
    the ledger refuses under the key (``RULE_RELEASE_REPEATED``), and the round went on
    without the site (this test fails so on the code before 2026-11-27). The bytes that
    left are now kept (``participant.sent_plaintext``) and sent again: the same bytes,
    one DP-SGD charge, one release — also after the site's own restart."""
    settings = dataclasses.replace(
        target_settings(tmp_path),
        allow_plaintext=True,
        privacy=PrivacySettings(dpsgd=True, dpsgd_noise_multiplier=1.0),
    )
    trained: list[int] = []
    train_dpsgd = LocalTrainer.train_dpsgd

    def counted(self: LocalTrainer, *args: Any, **kwargs: Any) -> Any:
        trained.append(1)
        return train_dpsgd(self, *args, **kwargs)

    monkeypatch.setattr(LocalTrainer, "train_dpsgd", counted)
    ring = KeepingRing(federation="fed", model=model, die=True)
    _updates(ring, model, ["R", "R"], [7, 7])  # the coordinator restarted between
    with pytest.raises(Killed):
        run_target(settings, ring, data)
    assert ring.failures == [], [(f.task_id, f.reason) for f in ring.failures]
    assert len(ring.sent) == 2 and ring.sent[0] == ring.sent[1]
    kept = tmp_path / "state" / "sent-plaintext" / "update.sent"
    assert kept.stat().st_mode & 0o777 == 0o600
    assert kept.parent.stat().st_mode & 0o777 == 0o700
    assert ring.sent[0][-64:] not in kept.read_bytes()  # sealed, not the bytes in the clear
    again = KeepingRing(federation="fed", model=model)  # the site's process restarted
    _updates(again, model, ["R"], [7])
    run_target(settings, again, data)
    assert again.failures == [] and again.sent == ring.sent[:1]
    assert len(trained) == 1  # trained once, for the first ask
    assert _dpsgd_charges(tmp_path) == ["local-dpsgd/fed/round-0"]  # charged once
    conn = sqlite3.connect(tmp_path / "state" / "privacy.db")
    try:
        rows = conn.execute("SELECT job, answer FROM site_releases WHERE state = 'released'")
        assert list(rows) == [("task-R", "input")]
    finally:
        conn.close()
    assert not kept.exists()  # the federation ended: nothing is kept


def test_mutation_a_ledger_without_the_key_check_counts_nothing_twice(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger before the rule (no key check, no value kept): six evaluations of
    other heads under one task id all leave, past the site's four per federation,
    and a round's update leaves twice."""
    ledger = release_ledger.ReleaseLedger
    consume = ledger.consume
    monkeypatch.setattr(ledger, "_check_key", lambda *_a, **_k: None)
    monkeypatch.setattr(
        ledger,
        "consume",
        lambda self, job, *, answer="input", value=None: consume(self, job, answer=answer),
    )
    answered, refusals = _plaintext(tmp_path, model, data, ["T"] * 6)
    assert answered == 6 and refusals == []
    answered, refusals = _plaintext(tmp_path / "b", model, data, ["R", "R"], seeds=[7, 8])
    assert answered == 2 and refusals == []
