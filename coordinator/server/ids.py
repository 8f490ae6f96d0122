"""Task and job identifiers as they arrive on the wire: checked exactly.

An id is compared byte for byte with the coordinator's own, so it must be exactly
lowercase hex — ``bytes.fromhex`` alone would accept ``" ab cd"`` (whitespace) and
``"AB"`` (case), and a lenient parse lets one id name two tasks in the logs.
"""

from __future__ import annotations

import re

import grpc

from spherecal.coordinator.errors import ServiceError

__all__ = ["check_hex_id"]

#: Task and job ids are lowercase hex, matched exactly: no whitespace, no case folding.
_HEX_ID = re.compile(r"(?:[0-9a-f]{2}){1,64}")


def check_hex_id(text: str, what: str) -> str:
    """``text`` if it is a well-formed task/job id, else INVALID_ARGUMENT (why: an id is
    compared exactly; ``bytes.fromhex`` alone would accept ``" ab cd"``)."""
    if _HEX_ID.fullmatch(text) is None:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{what} must be 2-128 lowercase hex digits, got {text[:32]!r}",
        )
    return text
