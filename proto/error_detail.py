"""Typed reasons for a refused call, carried next to the gRPC status.

A gRPC status has a code (coarse: UNAUTHENTICATED covers both an expired session
and a revoked certificate) and a message (English, for people). Where a client must
act differently on the same code — join again after an expired session, retry later
when every upload slot is busy — the coordinator adds an :class:`pb.ErrorDetail` as
binary trailing metadata under :data:`ERROR_DETAIL_KEY`, and the client branches on
its :class:`pb.ErrorReason`, never on the message text.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import DecodeError

from spherecal.proto import spherecal_pb2 as pb

__all__ = ["ERROR_DETAIL_KEY", "error_metadata", "reason_from_metadata"]

ERROR_DETAIL_KEY = "spherecal-error-bin"
"""Trailing-metadata key (``-bin``: gRPC carries the value as raw bytes)."""


def error_metadata(reason: pb.ErrorReason) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata that says ``reason`` (empty for no reason)."""
    if reason == pb.ERROR_REASON_UNSPECIFIED:
        return ()
    return ((ERROR_DETAIL_KEY, pb.ErrorDetail(reason=reason).SerializeToString()),)


def reason_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> pb.ErrorReason:
    """The reason in trailing ``metadata``; ``ERROR_REASON_UNSPECIFIED`` when there is
    none, it does not parse, or it names a reason this build does not know."""
    for key, value in metadata or ():
        if key != ERROR_DETAIL_KEY or not isinstance(value, bytes):
            continue
        try:
            reason = pb.ErrorDetail.FromString(value).reason
        except DecodeError:
            return pb.ERROR_REASON_UNSPECIFIED
        return reason if reason in pb.ErrorReason.values() else pb.ERROR_REASON_UNSPECIFIED
    return pb.ERROR_REASON_UNSPECIFIED
