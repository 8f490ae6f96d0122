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
                       federation has ended or cannot continue (``FederationFailed``)
ALREADY_EXISTS         a replay: the second upload / message of a kind sent once
RESOURCE_EXHAUSTED     an oversized chunk or message
UNAVAILABLE            every masked-upload slot is busy: retry shortly
ABORTED                the job has failed (too few survivors); nothing more is accepted
INTERNAL               a coordinator bug (logged with its traceback; never caused by input)
=====================  ==================================================================

Undecodable request bytes are answered INVALID_ARGUMENT by the transport's request
deserializers (``coordinator.grpc_server``) before any handler runs. Every exception
class that can reach the RPC boundary has an explicit entry in :data:`ERROR_CODES`
(a test walks every ``crypto.SecAggError`` subclass); :func:`status_for` returns None
for anything else, which the transport answers INTERNAL *and logs loudly*, so no
unmapped error silently becomes a plausible-looking code.
"""

from __future__ import annotations

import logging

import grpc

import crypto
from crypto.dp import NoiseTooLarge, RingOverflowRisk
from proto.codec import TensorFormatError
from proto.identity import CertificateError

__all__ = [
    "DOCUMENTED_CODES",
    "ERROR_CODES",
    "FederationFailed",
    "ServiceError",
    "from_secagg",
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


class ServiceError(Exception):
    """A request refused at the boundary, with the gRPC status to answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

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
)


#: Every exception class that may reach the RPC boundary, with its status code
#: (:class:`ServiceError` carries its own code).
ERROR_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    *_SECAGG_CODES,
    (TensorFormatError, grpc.StatusCode.INVALID_ARGUMENT),
    (CertificateError, grpc.StatusCode.UNAUTHENTICATED),
    # The federation cannot continue (stopped, failed): nothing can be done for a caller.
    (FederationFailed, grpc.StatusCode.FAILED_PRECONDITION),
)


def from_secagg(exc: crypto.SecAggError) -> ServiceError:
    """The :class:`ServiceError` for a rejected secure-aggregation message."""
    for kind, code in _SECAGG_CODES:
        if isinstance(exc, kind):
            return ServiceError(code, f"{type(exc).__name__}: {exc}")
    # A SecAggError subclass added to crypto without an entry here: say so loudly
    # (a test walks every subclass, so this is a bug caught before release).
    log.error("unmapped secure-aggregation error %s answered INTERNAL", type(exc).__name__)
    return ServiceError(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


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
