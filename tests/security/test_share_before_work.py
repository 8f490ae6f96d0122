"""A real participant runner answers a secure job's share stage *before* its local
work (issue #9, timing): key sharing does not depend on the data, so its time must
not follow the training or statistics whose duration does.

The double extends the hostile coordinator of ``test_malicious_coordinator_service``
with one honest behaviour: when the runner advertises, a real
:class:`crypto.SecAggServer` takes that advertisement and those of the four other
participants (real :class:`crypto.SecAggParticipant` s) and the next instruction is
the job's share step, carrying the real key roster. The order of what the runner
sends and fetches — advertisement, shares, the model download that starts its
local work — is recorded; the assertions are about that order, never about time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.participant.data import load_local_data
from spherecal.participant.policy import PolicySettings
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from tests.security.test_malicious_coordinator_service import (
    IDENTITIES,
    ME,
    PEERS,
    HostileCoordinator,
    _job,
    _settings,
    _train,
)


class SharingCoordinator(HostileCoordinator):
    """Gives the share step of each job in ``answer`` once the runner advertised in
    it (after ``share_after_s``, answering Wait until then); other jobs get no share
    step, so the runner's next instruction is the script's next task."""

    def __init__(self, *, share_after_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.share_after_s = share_after_s
        self.answer: dict[bytes, str] = {}  # job id -> task id
        self.events: list[str] = []
        self._step: pb.Instruction | None = None
        self._ready_at = 0.0

    def secure_train(self, model: GlobalModel, task_id: str, *, answer: bool) -> pb.Instruction:
        instruction = _train(self, model, task_id, _job("update", model.length + 2))
        if answer:
            spec = crypto.JobSpec.from_bytes(instruction.train.secure.spec)
            self.answer[spec.job_id] = task_id
        return instruction

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]:
        self.events.append(f"download {request.name}")
        return super().download_tensor(request)

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        self.events.append(f"submit {pb.SecAggStage.Name(request.stage)}")
        job_id = bytes(request.job_id)
        if request.stage == pb.ADVERTISE and job_id in self.answer:
            self._step = self._share_step(job_id, request.message)
            self._ready_at = time.monotonic() + self.share_after_s
        return super().submit_secagg(request)

    def _share_step(self, job_id: bytes, advertisement: bytes) -> pb.Instruction:
        (job,) = [
            i.train.secure
            for i in self.instructions
            if crypto.JobSpec.from_bytes(i.train.secure.spec).job_id == job_id
        ]
        spec = crypto.JobSpec.from_bytes(job.spec)
        keys = {e.participant_id: bytes(e.identity_public_key) for e in job.directory}
        server = crypto.SecAggServer(spec, keys)
        server.receive(crypto.AdvertiseKeys.from_bytes(advertisement), sender=ME)
        for peer in PEERS:
            if peer != ME:
                client = crypto.SecAggParticipant(
                    spec, peer, IDENTITIES[peer], keys, ledger=MemoryJobLedger()
                )
                server.receive(client.advertise_keys(), sender=peer)
        server.close_stage()
        roster = server.roster_for(ME).to_bytes()
        step = pb.SecAggStep(job_id=job_id, stage=pb.SHARE, message=roster)
        return pb.Instruction(task_id=self.answer[job_id], secagg=step)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self._step is not None:
            left = self._ready_at - time.monotonic()
            if left > 0:
                time.sleep(min(left, request.wait_ms / 1000.0))
                return pb.Instruction(wait=pb.Wait(retry_after_ms=50, reason="sharing"))
            step, self._step = self._step, None
            return step
        return super().next_instruction(request)

    def play(self, script: list[pb.Instruction]) -> None:
        self.instructions = list(script)
        self.script = list(script)


def _run(settings: ParticipantSettings, coordinator: HostileCoordinator) -> tuple[int, list[str]]:
    lines: list[str] = []
    runner = ParticipantRunner(
        settings,
        coordinator,
        load_local_data(settings.data),
        IDENTITIES[ME],
        MemoryJobLedger(),
        DirectoryTrust(None),
        log=lines.append,
    )
    return runner.run(), lines


def _index(lines: list[str], text: str) -> int:
    (found,) = [i for i, line in enumerate(lines) if text in line]
    return found


def test_shares_are_answered_before_the_local_work(tmp_path: Path, model: GlobalModel) -> None:
    coordinator = SharingCoordinator(federation="fed", model=model, script=[])
    coordinator.play([coordinator.secure_train(model, "t1", answer=True)])
    code, lines = _run(_settings(tmp_path), coordinator)
    assert code == 0
    assert coordinator.failures == []
    # the model download is what starts the local work: it follows the shares
    assert coordinator.events == ["submit ADVERTISE", "submit SHARE", "download global-t1"]
    assert _index(lines, "shared keys before the local work") < _index(lines, "trained")


def test_a_coordinator_that_moved_on_gets_no_local_work_for_the_old_job(
    tmp_path: Path, model: GlobalModel
) -> None:
    """The first job never reaches its share stage (the coordinator retries with a
    new job): its local work is skipped, the retry is served, nothing is refused."""
    coordinator = SharingCoordinator(federation="fed", model=model, script=[])
    coordinator.play(
        [
            coordinator.secure_train(model, "t1", answer=False),
            coordinator.secure_train(model, "t2", answer=True),
        ]
    )
    code, lines = _run(_settings(tmp_path), coordinator)
    assert code == 0
    assert coordinator.failures == []
    assert coordinator.events == [
        "submit ADVERTISE",
        "submit ADVERTISE",
        "submit SHARE",
        "download global-t2",
    ]
    assert _index(lines, "moved on before its share stage") < _index(lines, "trained")


def test_when_the_share_step_is_late_the_work_runs_first_and_shares_follow(
    tmp_path: Path, model: GlobalModel
) -> None:
    """Bounded wait: past ``share_wait_s`` the participant does its local work and
    answers the share step afterwards (logged: its timing is then not hidden);
    ``share_wait_s = 0`` is that order always, and is logged as a weakening."""
    for wait_s in (0.3, 0.0):
        coordinator = SharingCoordinator(
            federation="fed", model=model, share_after_s=1.5, script=[]
        )
        coordinator.play([coordinator.secure_train(model, "t1", answer=True)])
        settings = replace(
            _settings(tmp_path / str(wait_s)), policy=PolicySettings(share_wait_s=wait_s)
        )
        code, lines = _run(settings, coordinator)
        assert code == 0, wait_s
        assert coordinator.failures == [], wait_s
        assert coordinator.events == [
            "submit ADVERTISE",
            "download global-t1",
            "submit SHARE",
        ], wait_s
        late = [line for line in lines if "no share step within share_wait_s" in line]
        weakened = [line for line in lines if "policy weakened: share_wait_s = 0" in line]
        assert (len(late), len(weakened)) == ((1, 0) if wait_s else (0, 1)), (wait_s, lines)


def test_the_runner_answers_exactly_the_roster_it_was_sent(
    tmp_path: Path, model: GlobalModel
) -> None:
    """The early share answer is the real protocol message: a ShareKeys from ``p0``
    for the job, with one encrypted share for every holder of the complete graph."""
    coordinator = SharingCoordinator(federation="fed", model=model, script=[])
    coordinator.play([coordinator.secure_train(model, "t1", answer=True)])
    assert _run(_settings(tmp_path), coordinator)[0] == 0
    (share,) = [s for s in coordinator.secagg if s.stage == pb.SHARE]
    message = crypto.ShareKeys.from_bytes(share.message)
    assert message.sender == ME
    assert sorted(s.receiver for s in message.shares) == sorted(PEERS)
    assert all(bytes(a.job_id) == bytes(share.job_id) for a in coordinator.secagg)
