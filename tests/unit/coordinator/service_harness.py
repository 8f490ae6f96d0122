"""A coordinator service core in-process, with hand-driven participants."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Self

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.server.traffic import Traffic
from spherecal.coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    ModelSettings,
    SecAggSettings,
    ServerSettings,
    Timeouts,
    TrainingSettings,
)
from spherecal.coordinator.state.registry import Peer, Registry
from spherecal.coordinator.state.store import Store
from spherecal.crypto import JobSpec, KeyRoster, SecAggParticipant, generate_identity
from spherecal.participant.failures import failure_kind, policy_rule, wire_reason
from spherecal.proto import spherecal_pb2 as pb
from tests.joins import DIGITS, signed_join


def settings_for(tmp: Path, *, secure: bool, n: int = 3, rounds: int = 1) -> CoordinatorSettings:
    return CoordinatorSettings(
        participants=tuple(f"p{k}" for k in range(n)),
        model=ModelSettings(extractor="mlp"),
        training=TrainingSettings(rounds=rounds, min_participants=2),
        calibration=CalibrationSettings(methods=("ffc",)),
        secagg=SecAggSettings(updates=secure, statistics=secure, chunk_entries=4096),
        server=ServerSettings(insecure=True, max_chunk_bytes=64 * 1024),
        timeouts=Timeouts(
            heartbeat_interval_s=0.2,
            heartbeat_timeout_s=30,
            long_poll_s=0.2,
            linger_s=1,
            round_s=60,
            stage_s=60,
        ),
        state_dir=tmp / "state",
        out_dir=tmp / "out",
    )


class Harness:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.store = Store(settings.state_dir / "state.db")
        self.registry = Registry(
            settings.participants,
            self.store,
            require_certificates=False,
            heartbeat_timeout_s=settings.timeouts.heartbeat_timeout_s,
            clock_skew_s=60,
        )
        self.model = GlobalModel(settings.model.spec(settings.seed))
        self.federation = Federation(
            settings, self.store, self.registry, say=lambda m: None, model=self.model
        )
        self.federation.prepare()
        self.service = CoordinatorService(
            settings, self.registry, self.federation, self.store, Traffic()
        )
        self.keys: dict[str, Ed25519PrivateKey] = {
            p: generate_identity() for p in settings.participants
        }
        self.sessions: dict[str, str] = {}
        self.thread = threading.Thread(target=self.federation.run, daemon=True)

    def start(self) -> Harness:
        self.thread.start()
        return self

    def close(self) -> None:
        self.federation.stop("test over")
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()
        self.store.close()

    # ----------------------------------------------------------- requests
    def join_request(self, pid: str, key: Ed25519PrivateKey | None = None) -> pb.JoinRequest:
        return signed_join(pid, key or self.keys[pid])

    def join(self, pid: str) -> str:
        reply = self.service.join(self.join_request(pid), Peer())
        self.sessions[pid] = reply.session
        return reply.session

    def caller(self, pid: str) -> pb.Caller:
        return pb.Caller(participant_id=pid, session=self.sessions.get(pid, ""))

    def poll(self, pid: str, kinds: Iterable[str], timeout: float = 30.0) -> pb.Instruction:
        wanted = set(kinds)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            instruction = self.service.next_instruction(
                pb.InstructionRequest(caller=self.caller(pid), wait_ms=200), Peer()
            )
            if instruction.WhichOneof("kind") in wanted:
                return instruction
        raise TimeoutError(f"{pid} got none of {wanted}")


def shared_secure_round(
    harness: Harness, ids: tuple[str, ...]
) -> tuple[JobSpec, dict[str, SecAggParticipant]]:
    """Join ``ids``, take round 1's secure job and drive it through the advertise and
    share stages with real protocol participants (zero inputs): the job then waits for
    the masked uploads. Returns the job's spec and each participant's state machine."""
    for pid in ids:
        harness.join(pid)
    train = {p: harness.poll(p, {"train"}) for p in ids}
    job = JobSpec.from_bytes(train[ids[0]].train.secure.spec)
    directory = {
        e.participant_id: e.identity_public_key for e in train[ids[0]].train.secure.directory
    }
    clients: dict[str, SecAggParticipant] = {}
    for pid in ids:
        client = SecAggParticipant(job, pid, harness.keys[pid], directory)
        client.set_input(np.zeros(job.length))
        harness.service.submit_secagg(
            pb.SecAggSubmission(
                caller=harness.caller(pid),
                job_id=job.job_id,
                stage=pb.ADVERTISE,
                message=client.advertise_keys().to_bytes(),
            ),
            Peer(),
        )
        clients[pid] = client
    for pid, client in clients.items():
        step = harness.poll(pid, {"secagg"}).secagg
        assert step.stage == pb.SHARE
        shares = client.share_keys(KeyRoster.from_bytes(step.message))
        harness.service.submit_secagg(
            pb.SecAggSubmission(
                caller=harness.caller(pid),
                job_id=job.job_id,
                stage=pb.SHARE,
                message=shares.to_bytes(),
            ),
            Peer(),
        )
    return job, clients


def code_of(fn) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(ServiceError) as info:
        result = fn()
        if hasattr(result, "__next__"):
            list(result)
    return info.value.code


__all__ = ["DIGITS", "Harness", "code_of", "replace", "settings_for"]


class ScriptedSites:
    """Every roster member joins and polls on a thread of its own; each instruction
    goes to :meth:`handle` (subclasses script the answers) until ``done``."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._site, args=(pid,), daemon=True)
            for pid in harness.settings.participants
        ]

    def start(self) -> Self:
        for pid in self.harness.settings.participants:
            self.harness.join(pid)
        for thread in self.threads:
            thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)

    def handle(self, pid: str, instruction: pb.Instruction) -> None:
        """Answer one instruction (not ``done``) as site ``pid``."""
        raise NotImplementedError

    def refuse(self, pid: str, task_id: str, error: BaseException) -> None:
        """Withdraw from ``task_id`` with ``error``, typed as a participant does
        (``participant.failures``)."""
        self.harness.service.report_failure(
            pb.FailureReport(
                caller=self.harness.caller(pid),
                task_id=task_id,
                reason=wire_reason(error),
                kind=failure_kind(error),
                rule=policy_rule(error),
            ),
            Peer(),
        )

    def _site(self, pid: str) -> None:
        service = self.harness.service
        while not self.stop.is_set():
            try:
                instruction = service.next_instruction(
                    pb.InstructionRequest(caller=self.harness.caller(pid), wait_ms=200), Peer()
                )
            except ServiceError:
                continue
            if instruction.WhichOneof("kind") == "done":
                return
            self.handle(pid, instruction)
