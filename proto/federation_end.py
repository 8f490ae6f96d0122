"""How the coordinator tells a caller that the federation has ended.

A participant that (re)joins after the end gets FAILED_PRECONDITION whose details
start with :data:`ENDED_PREFIX` and name the final status; it stops at once with a
clear message instead of retrying (issue #10). Both sides use these two functions,
so the wording is the contract, in one place.
"""

from __future__ import annotations

import re

__all__ = ["ENDED_PREFIX", "ended_details", "ended_status"]

ENDED_PREFIX = "federation has ended"
_PATTERN = re.compile(r"^federation has ended \(([a-z]+)\)")


def ended_details(federation_id: str, status: str, message: str) -> str:
    """The status details for a request that arrives after the end."""
    return f"{ENDED_PREFIX} ({status}): federation {federation_id}: {message}"[:500]


def ended_status(details: str) -> str | None:
    """The final status named by ``details`` if it says the federation ended."""
    match = _PATTERN.match(details)
    return match.group(1) if match else None
