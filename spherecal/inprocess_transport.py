"""An in-process :class:`spherecal.participant.transport.Transport` over the coordinator's
service core — the participant logic without sockets, for unit tests and debugging.

Every message is serialized and parsed again on the way in and out, so the
participant and the coordinator still share no Python objects (only protobuf bytes),
exactly as over gRPC; :class:`spherecal.coordinator.errors.ServiceError` becomes the same
:class:`spherecal.participant.transport.TransportError` the gRPC transport raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TypeVar

from google.protobuf.message import Message

from spherecal.coordinator.driver.evaluation_stage import CentralEvaluator
from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.server.traffic import Traffic
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Peer, Registry
from spherecal.coordinator.state.store import Store
from spherecal.coordinator.summary_schema import CoordinatorSummary
from spherecal.crypto import MemoryJobLedger, generate_identity
from spherecal.participant.data import load_local_data
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.transport import TransportError
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb

__all__ = ["InProcessFederation", "InProcessTransport"]

M = TypeVar("M", bound=Message)
R = TypeVar("R", bound=Message)


def _wire(message: M) -> M:
    return type(message).FromString(message.SerializeToString())


class InProcessTransport:
    def __init__(self, service: CoordinatorService, peer: Peer | None = None) -> None:
        self.service = service
        self.peer = peer or Peer(identity=None, address="inprocess")

    def _unary(self, fn: Callable[[M, Peer], R], request: M) -> R:
        try:
            return _wire(fn(_wire(request), self.peer))
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message, reason=exc.reason) from None

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        return self._unary(self.service.join, request)

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        return self._unary(self.service.heartbeat, request)

    def presence(self, request: pb.HeartbeatRequest) -> _InProcessPresence:
        return _InProcessPresence(self, request)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        return self._unary(self.service.next_instruction, request)

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]:
        try:
            for chunk in self.service.download_tensor(_wire(request), self.peer):
                yield _wire(chunk)
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message, reason=exc.reason) from None

    def upload_tensor(self, messages: Iterable[pb.TensorUpload]) -> pb.UploadReceipt:
        try:
            return _wire(self.service.upload_tensor((_wire(m) for m in messages), self.peer))
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message, reason=exc.reason) from None

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        return self._unary(self.service.submit_secagg, request)

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        try:
            return _wire(self.service.upload_masked((_wire(m) for m in messages), self.peer))
        except ServiceError as exc:
            raise TransportError(exc.code, exc.message, reason=exc.reason) from None

    def report_evaluation(self, request: pb.EvaluationReport) -> pb.Receipt:
        return self._unary(self.service.report_evaluation, request)

    def report_failure(self, request: pb.FailureReport) -> pb.Receipt:
        return self._unary(self.service.report_failure, request)

    def get_status(self, request: pb.StatusRequest) -> pb.StatusReply:
        return self._unary(self.service.get_status, request)

    def close(self) -> None:
        pass


class _InProcessPresence:
    """In-process stand-in for the presence stream: heartbeats at the interval."""

    def __init__(self, transport: InProcessTransport, request: pb.HeartbeatRequest) -> None:
        self._transport = transport
        self._request = request
        self._cancelled = threading.Event()

    def __iter__(self) -> Iterator[pb.HeartbeatReply]:
        while not self._cancelled.is_set():
            reply = self._transport.heartbeat(self._request)
            yield reply
            self._cancelled.wait(max(0.05, reply.interval_ms / 1000.0))

    def cancel(self) -> None:
        self._cancelled.set()


DEFAULT_STATE_DIR = ParticipantSettings.__dataclass_fields__["state_dir"].default


class InProcessFederation:
    """A coordinator core and participant runners in threads of one process.

    For unit tests and debugging: the same federation driver, service validation and
    participant logic as the real processes, minus sockets and process start-up.
    ``start()`` then ``join()``; the summary is in :attr:`summary`.
    """

    def __init__(
        self,
        settings: CoordinatorSettings,
        participants: Sequence[ParticipantSettings],
        *,
        quiet: bool = True,
    ) -> None:
        self.settings = settings
        self.messages: list[str] = []
        self._lock = threading.Lock()

        def say(message: str) -> None:
            with self._lock:
                self.messages.append(message)
            if not quiet:
                print(message, flush=True)

        self.say = say
        self.store = Store(settings.state_dir / "state.db")
        self.registry = Registry(
            settings.participants,
            self.store,
            require_certificates=False,
            heartbeat_timeout_s=settings.timeouts.heartbeat_timeout_s,
            clock_skew_s=settings.timeouts.clock_skew_s,
        )
        model = GlobalModel(settings.model.spec(settings.seed))
        evaluator = CentralEvaluator.from_settings(settings, model)
        self.federation = Federation(
            settings, self.store, self.registry, say=say, model=model, evaluator=evaluator
        )
        self.federation.prepare()
        self.traffic = Traffic()
        self.service = CoordinatorService(
            settings, self.registry, self.federation, self.store, self.traffic
        )
        self.runners: dict[str, ParticipantRunner] = {}
        self.exit_codes: dict[str, int] = {}
        for ps in participants:
            if ps.state_dir == DEFAULT_STATE_DIR:  # keep each one's ledgers apart, not in cwd
                ps = replace(
                    ps, state_dir=settings.state_dir.parent / f"participant-{ps.participant_id}"
                )
            identity = generate_identity()
            data = load_local_data(ps.data)
            self.runners[ps.participant_id] = ParticipantRunner(
                ps,
                InProcessTransport(self.service),
                data,
                identity,
                MemoryJobLedger(),
                DirectoryTrust(None),
                log=self._logger(ps.participant_id),
            )
        self._threads: list[threading.Thread] = []
        self._summary: CoordinatorSummary | None = None

    def _logger(self, pid: str) -> Callable[[str], None]:
        return lambda message: self.say(f"[{pid}] {message}")

    def _drive(self) -> None:
        try:
            self.federation.run()
            self.federation.linger()
        finally:
            summary = self.federation.summary()
            summary["bytes"] = self.traffic.snapshot()
            self._summary = summary

    def _participant(self, pid: str) -> None:
        self.exit_codes[pid] = self.runners[pid].run()

    def start(self) -> InProcessFederation:
        self._threads.append(threading.Thread(target=self._drive, name="driver", daemon=True))
        for pid in self.runners:
            self._threads.append(
                threading.Thread(target=self._participant, args=(pid,), name=pid, daemon=True)
            )
        for thread in self._threads:
            thread.start()
        return self

    def join(self, timeout: float = 300.0) -> CoordinatorSummary:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            raise TimeoutError("in-process federation did not finish in time")
        self.store.close()
        return self.summary

    @property
    def summary(self) -> CoordinatorSummary:
        """The coordinator's summary, once the driver has ended."""
        if self._summary is None:
            raise RuntimeError("no summary: the federation's driver has not ended, or it failed")
        return self._summary
