"""Typed service errors and the gRPC status each boundary failure maps to.

The service core raises :class:`ServiceError` (a status code plus a message safe to
show the caller); the gRPC layer turns it into ``context.abort``. Crypto's typed
errors are mapped by :func:`from_secagg` following ``crypto/_exceptions.py``: every
error from a ``receive_*``/``absorb*`` call means *that message was rejected and
nothing was stored*, so none of them harms the job for the others.

Status codes (what a client can rely on):

=====================  ==================================================================
INVALID_ARGUMENT       malformed bytes, wrong length / dtype / shape, NaN or Inf, a forged
                       share, a key that is not a valid point
UNAUTHENTICATED        no client certificate identity where mTLS is required, a certificate
                       naming someone else, an unknown or expired session, a bad join proof
PERMISSION_DENIED      a participant not on the roster, a signature that does not verify,
                       a key different from the one pinned for that participant
NOT_FOUND              an unknown task, job or tensor name
FAILED_PRECONDITION    the right message at the wrong stage (or for a closed/old job); the
                       federation has ended or cannot continue (``FederationFailed``); a
                       participant's privacy policy refuses the job (``PolicyViolation``)
ALREADY_EXISTS         a replay: the second upload / message of a kind sent once
RESOURCE_EXHAUSTED     an oversized chunk or message
UNAVAILABLE            every masked-upload slot is busy: retry shortly; the coordinator
                       cannot write its state directory (``StorageFailed``) and is stopping
ABORTED                the job has failed (too few survivors, a sum out of range); nothing
                       more is accepted
INTERNAL               a coordinator bug (logged with its traceback; never caused by input)
=====================  ==================================================================

Where a client must act on more than the code, :attr:`ServiceError.reason` adds a
typed ``pb.ErrorReason`` as trailing metadata (``spherecal.proto.error_detail``):
``SESSION_EXPIRED`` (join again), ``UPLOAD_SLOTS_BUSY`` (retry later),
``IDENTITY_IN_USE`` (another live process holds the identity: retry later). In the other
direction a participant's ``FailureReport`` carries a ``pb.FailureKind``
(:func:`failure_kind`); its ``reason`` is only ever logged. A report without a task id is
a site refusing the federation's plan as it leaves (``CoordinatorService._plan_refused``).

Every exception class of the project outside ``crypto`` (whose tree is in
``crypto/_exceptions.py``), by where it is raised — flat names that say what
happened (``tests/unit/coordinator/test_typed_failures.py`` checks this list is
complete)::

    Exception
    ├── ServiceError             coordinator: a request refused at the boundary (above)
    │   └── DifferentMaskedInput coordinator: a masked chunk unlike the one sent before
    ├── RuntimeError
    │   ├── FederationFailed     coordinator: the federation cannot go on (status failed)
    │   ├── StorageFailed        coordinator: a write to the state directory failed (fatal)
    │   ├── SimulationError      spherecal simulate: the processes gave no results
    │   └── ParticipantKilled    simulate engines: a participant killed by fault injection
    ├── ValueError
    │   ├── TensorFormatError    proto: a tensor header/payload not as announced
    │   ├── CertificateError     proto: a certificate without a usable identity
    │   ├── ConfigError          spherecal: a config file that cannot be used as written
    │   ├── PortInUse            coordinator: the listen port is held by another process
    │   ├── StateDamaged         coordinator: the state database fails its integrity check
    │   ├── StateConflict        coordinator: a new federation over a state dir in use
    │   ├── StateDirInUse        coordinator, participant: another live process holds the state dir
    │   ├── PlanChanged          participant: another plan for a federation whose plan it kept
    │   ├── BlobCorrupt          coordinator: a journaled sum's file missing or altered
    │   ├── UntrustedDirectory   participant: the key directory fails its checks
    │   ├── MembersNotPinned     participant: under TLS, no [tls] peer_keys and no say-so
    │   ├── CorruptClientState   participant: its stored SCAFFOLD c_k cannot be read
    │   ├── DataOutsideModel     participant: its data does not fit the plan's model
    │   ├── IdentityMissing      participant: a configured identity key that is not there
    │   ├── IdentityNotCertified participant: under TLS, a key its certificate does not bind
    │   ├── EmptyStatisticsError spherefed: calibration statistics with no samples
    │   ├── CustomExtractorError spherefed: a package.module:factory breaking the contract
    │   ├── SavedModelError      spherefed: a saved model directory that does not load
    │   ├── OutputPathError      spherecal: an output path that cannot be written
    │   ├── ReportError          spherecal report: a directory holding no run to draw
    │   ├── PreflightError       spherecal: a configured file or directory unusable
    │   ├── CoordinatorUnreachable  spherecal status: no coordinator answers (exit 4)
    │   ├── UnsupportedModel     spherefed: DP-SGD on a model Opacus cannot handle
    │   └── AggregateInvariantViolated  coordinator: an aggregate no honest sum gives
    │       └── IntegrityCheckFailed    coordinator: two sums disagree, or a sum over the bound
    ├── TransportError           participant: a call failed (code, message, reason)
    ├── PrivacyRefused           participant: its own privacy policy refuses a task
    │   ├── NoiseRequired        statistics without the DP noise it demands
    │   ├── PlaintextRefused     a plaintext upload/report (also a PermissionError)
    │   ├── ReleaseRepeated      a release already left under its key (round, moments, evaluation)
    │   ├── RoundOutsidePlan     a training task for a round the joined plan does not have
    │   ├── EvaluationsExhausted more evaluations in one federation than the site answers
    │   ├── AttemptsExhausted    more started jobs for one purpose than it admits unreleased
    │   ├── TaskNotBound         a secure job not bound to the task it came with
    │   └── EvaluationRefused    evaluation heads it does not accept
    ├── ParticipantExit          participant: stop the process with an exit code
    │   └── PlanRefused          the site refuses the federation's plan (exit 2; it tells
    │                            the coordinator, which ends its session)
    ├── InputWithheld            participant: a refusal that depends on its data, sent at the
    │                            job's masked step as one kind and one sentence (its cause kept)
    ├── HeldJobError             participant: a held job (its state after a restart) unusable
    │   └── CorruptHeldJob       a held-job file altered, truncated, moved or foreign
    ├── AuditError               spherecal audit: a database it cannot read
    ├── SiteAuditError           spherecal audit --site: no release ledger there
    └── LedgerError              spherefed: the privacy ledger refuses a charge
        ├── DuplicateRelease     a release id charged twice
        └── BudgetExceeded       a release would cross the budget (every number kept)

Undecodable request bytes are answered INVALID_ARGUMENT by the transport's request
deserializers (``spherecal.coordinator.server.grpc_server``) before any handler runs. Every
exception
class that can reach the RPC boundary has an explicit entry in :data:`ERROR_CODES`
(a test walks every ``crypto.SecAggError`` subclass); :func:`status_for` returns None
for anything else, which the transport answers INTERNAL *and logs loudly*, so no
unmapped error silently becomes a plausible-looking code.
"""

from __future__ import annotations

import logging
from typing import cast

import grpc

from spherecal import crypto
from spherecal.crypto.dp import NoiseTooLarge, RingOverflowRisk
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import TensorFormatError
from spherecal.proto.error_detail import error_metadata
from spherecal.proto.identity import CertificateError

__all__ = [
    "DOCUMENTED_CODES",
    "ERROR_CODES",
    "FederationFailed",
    "ServiceError",
    "StorageFailed",
    "failure_kind",
    "from_secagg",
    "policy_rule",
    "status_for",
]

log = logging.getLogger("spherecal.coordinator")

#: The codes the module docstring documents (a client can rely on exactly these).
DOCUMENTED_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
    }
)


class FederationFailed(RuntimeError):
    """The federation cannot continue (a round failed every attempt, a stop was
    requested, the state directory cannot be resumed); the driver records it and
    announces ``Done(status="failed")``."""


class StorageFailed(RuntimeError):
    """A write to the state directory failed (disk full, I/O error, read-only file
    system, a database SQLite can no longer write). Fatal by design: a coordinator
    that cannot record progress must not go on computing what it cannot keep, nor
    wait forever; it stops within seconds, tells the participants it is stopping,
    and a restart after the fault is fixed resumes from what was committed
    (``spherecal.coordinator.state.storage_faults``)."""

    def __init__(self, path: str, cause: str = "the write failed") -> None:
        super().__init__(f"cannot write {path}: {cause}")
        self.path = path
        self.cause = cause


class ServiceError(Exception):
    """A request refused at the boundary, with the gRPC status to answer."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: pb.ErrorReason = pb.ERROR_REASON_UNSPECIFIED,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        """A typed reason where the client must act on more than the code
        (``spherecal.proto.error_detail``): sent as trailing metadata."""

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        """What the gRPC layer sets before ``abort`` (``spherecal.proto.error_detail``)."""
        return error_metadata(self.reason)

    def __repr__(self) -> str:
        return f"ServiceError({self.code.name}, {self.message!r})"


_SECAGG_CODES: tuple[tuple[type[crypto.SecAggError], grpc.StatusCode], ...] = (
    # A job spec or DP plan the coordinator itself built is invalid: its bug or its
    # configuration, never the caller's input.
    (RingOverflowRisk, grpc.StatusCode.INTERNAL),
    (NoiseTooLarge, grpc.StatusCode.INTERNAL),
    (crypto.InvalidSpec, grpc.StatusCode.INTERNAL),
    (crypto.MalformedMessage, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.WrongLength, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.EncodingOverflow, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.WrongRecipient, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.BadKey, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.ForgedShare, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.UnexpectedShare, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.OverlappingReveal, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.BadComplaint, grpc.StatusCode.INVALID_ARGUMENT),
    (crypto.KeySubstitution, grpc.StatusCode.PERMISSION_DENIED),
    # A participant's privacy policy refuses the job as specified (spherecal.crypto.policy).
    (crypto.ConsistencyRoundRequired, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.ThresholdTooLow, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.TooFewParticipants, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.TooFewInputs, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.DoubleReveal, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.PolicyViolation, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.SenderMismatch, grpc.StatusCode.UNAUTHENTICATED),
    (crypto.UnknownParticipant, grpc.StatusCode.PERMISSION_DENIED),
    (crypto.BadSignature, grpc.StatusCode.PERMISSION_DENIED),
    (crypto.WrongJob, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.Excluded, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.OutOfStage, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.InconsistentSurvivors, grpc.StatusCode.FAILED_PRECONDITION),
    (crypto.DuplicateMessage, grpc.StatusCode.ALREADY_EXISTS),
    (crypto.JobReplayed, grpc.StatusCode.ALREADY_EXISTS),
    (crypto.UploadSlotsBusy, grpc.StatusCode.UNAVAILABLE),
    (crypto.JobAborted, grpc.StatusCode.ABORTED),
    (crypto.TooFewSurvivors, grpc.StatusCode.ABORTED),
    (crypto.AggregateOutOfRange, grpc.StatusCode.ABORTED),
)


#: Every exception class that may reach the RPC boundary, with its status code
#: (:class:`ServiceError` carries its own code).
ERROR_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    *_SECAGG_CODES,
    (TensorFormatError, grpc.StatusCode.INVALID_ARGUMENT),
    (CertificateError, grpc.StatusCode.UNAUTHENTICATED),
    # The federation cannot continue (stopped, failed): nothing can be done for a caller.
    (FederationFailed, grpc.StatusCode.FAILED_PRECONDITION),
    # The coordinator cannot keep state and is stopping: come back after its restart.
    (StorageFailed, grpc.StatusCode.UNAVAILABLE),
)


def from_secagg(exc: crypto.SecAggError) -> ServiceError:
    """The :class:`ServiceError` for a rejected secure-aggregation message."""
    reason = pb.UPLOAD_SLOTS_BUSY if isinstance(exc, crypto.UploadSlotsBusy) else None
    for kind, code in _SECAGG_CODES:
        if isinstance(exc, kind):
            return ServiceError(
                code, f"{type(exc).__name__}: {exc}", reason=reason or pb.ERROR_REASON_UNSPECIFIED
            )
    # A SecAggError subclass added to crypto without an entry here: say so loudly
    # (a test walks every subclass, so this is a bug caught before release).
    log.error("unmapped secure-aggregation error %s answered INTERNAL", type(exc).__name__)
    return ServiceError(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def failure_kind(report: pb.FailureReport) -> pb.FailureKind:
    """The typed meaning of a participant's ``FailureReport``.

    ``FAILURE_KIND_UNSPECIFIED`` (a sender that names no kind) counts as
    ``INTERNAL_ERROR``; a number outside the enum is refused (INVALID_ARGUMENT), never
    guessed at — and never recovered from the human-readable ``reason``.
    """
    kind = report.kind
    if kind not in pb.FailureKind.values():
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown failure kind {int(kind)}")
    return pb.INTERNAL_ERROR if kind == pb.FAILURE_KIND_UNSPECIFIED else kind


def status_for(exc: BaseException) -> ServiceError | None:
    """The documented status for an exception at the RPC boundary; None if unmapped
    (the transport then answers INTERNAL and logs the traceback)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, crypto.SecAggError):
        return from_secagg(exc)
    for kind, code in ERROR_CODES:
        if isinstance(exc, kind):
            return ServiceError(code, f"{type(exc).__name__}: {exc}")
    return None


def policy_rule(report: pb.FailureReport) -> pb.PolicyRule:
    """The policy rule of a ``POLICY_REFUSAL`` report (unknown values read as
    ``RULE_UNSPECIFIED``; the rule is recorded, never acted on)."""
    rule = int(report.rule)
    if report.kind != pb.POLICY_REFUSAL or rule not in pb.PolicyRule.values():
        return pb.RULE_UNSPECIFIED
    return cast("pb.PolicyRule", rule)
