"""How a participant talks to its coordinator, abstracted from gRPC.

The participant's logic (``spherecal.participant.runner``) only sees this :class:`Transport`
protocol, so the same logic runs over real gRPC (``spherecal.participant.grpc_transport``) in
deployments and integration tests, and in-process against the coordinator's service
core in unit tests (``spherecal.inprocess_transport``) — like httpx's swappable transports.

Failures surface as :class:`TransportError` carrying a gRPC status code, whatever
the transport; :data:`RETRYABLE` are the codes worth retrying after a backoff
(coordinator unreachable or restarting, upload slots busy).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import grpc

from spherecal.proto import spherecal_pb2 as pb

__all__ = ["RETRYABLE", "PresenceStream", "Transport", "TransportError"]

RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class TransportError(Exception):
    """A call that failed, with the status code the coordinator (or the network) gave."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: pb.ErrorReason = pb.ERROR_REASON_UNSPECIFIED,
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        """The coordinator's typed reason (``spherecal.proto.error_detail``), if it sent one."""

    @property
    def retryable(self) -> bool:
        # IDENTITY_IN_USE: another live process holds this identity's session; the
        # first keeps it, and this one may join once that process is gone.
        return self.code in RETRYABLE or self.reason == pb.IDENTITY_IN_USE

    @property
    def session_expired(self) -> bool:
        return self.reason == pb.SESSION_EXPIRED

    @property
    def slots_busy(self) -> bool:
        """Every masked-upload slot was busy: the coordinator asks again later."""
        return self.reason == pb.UPLOAD_SLOTS_BUSY


class PresenceStream(Protocol):
    """Replies while the stream lives; ``cancel()`` (from any thread) ends it."""

    def __iter__(self) -> Iterator[pb.HeartbeatReply]: ...

    def cancel(self) -> None: ...


class Transport(Protocol):
    def join(self, request: pb.JoinRequest) -> pb.JoinReply: ...

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply: ...

    def presence(self, request: pb.HeartbeatRequest) -> PresenceStream:
        """Open the long-lived presence stream (see ``spherecal.proto``)."""
        ...

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction: ...

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]: ...

    def upload_tensor(self, messages: Iterable[pb.TensorUpload]) -> pb.UploadReceipt: ...

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt: ...

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt: ...

    def report_evaluation(self, request: pb.EvaluationReport) -> pb.Receipt: ...

    def report_failure(self, request: pb.FailureReport) -> pb.Receipt: ...

    def get_status(self, request: pb.StatusRequest) -> pb.StatusReply: ...

    def close(self) -> None: ...


class StubCalls:
    """The protocol's plain calls, written once for every gRPC transport: each is one
    call of the coordinator stub ``_stub`` through the transport's ``_unary`` (which
    maps gRPC errors to :class:`TransportError`; a synchronous channel and the shared
    event-loop channel implement it differently). Uploads get ten times the call
    timeout: they stream a whole model or masked vector."""

    _stub: Any
    _timeout: float

    def _unary(self, fn: Any, request: object, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        return self._unary(self._stub.Join, request)

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        return self._unary(self._stub.Heartbeat, request, timeout=10.0)

    def upload_tensor(self, messages: Iterable[pb.TensorUpload]) -> pb.UploadReceipt:
        return self._unary(self._stub.UploadTensor, iter(messages), timeout=self._timeout * 10)

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        return self._unary(self._stub.SubmitSecAgg, request)

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        return self._unary(self._stub.UploadMasked, iter(messages), timeout=self._timeout * 10)

    def report_evaluation(self, request: pb.EvaluationReport) -> pb.Receipt:
        return self._unary(self._stub.ReportEvaluation, request)

    def report_failure(self, request: pb.FailureReport) -> pb.Receipt:
        return self._unary(self._stub.ReportFailure, request)

    def get_status(self, request: pb.StatusRequest) -> pb.StatusReply:
        return self._unary(self._stub.GetStatus, request)
