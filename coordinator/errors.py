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
FAILED_PRECONDITION    the right message at the wrong stage (or for a closed/old job)
ALREADY_EXISTS         a replay: the second upload / message of a kind sent once
RESOURCE_EXHAUSTED     an oversized chunk or message
UNAVAILABLE            every masked-upload slot is busy: retry shortly
ABORTED                the job has failed (too few survivors); nothing more is accepted
=====================  ==================================================================
"""

from __future__ import annotations

import grpc

import crypto

__all__ = ["FederationFailed", "ServiceError", "from_secagg"]


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


def from_secagg(exc: crypto.SecAggError) -> ServiceError:
    """The :class:`ServiceError` for a rejected secure-aggregation message."""
    for kind, code in _SECAGG_CODES:
        if isinstance(exc, kind):
            return ServiceError(code, f"{type(exc).__name__}: {exc}")
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{type(exc).__name__}: {exc}")
