"""How the coordinator tells a caller that the federation has ended.

A coordinator process that stops before the end (SIGTERM, a storage fault) answers
``Done(status=STOPPING_STATUS)`` to the polls it still holds and UNAVAILABLE to
joins: the federation resumes when it is restarted, so the participant waits.

A participant that (re)joins after the end gets FAILED_PRECONDITION whose details
start with :data:`ENDED_PREFIX` and name the final status; it stops at once with a
clear message instead of retrying (issue #10). Both sides use these two functions,
so the wording is the contract, in one place.
"""

from __future__ import annotations

import re

__all__ = [
    "ENDED_PREFIX",
    "STOPPING_STATUS",
    "SUCCESSFUL_STATUSES",
    "ended_details",
    "ended_status",
]

ENDED_PREFIX = "federation has ended"
#: Final statuses after which the federation's outputs exist: ``degraded`` means it
#: reached its end with less than was asked (the summary says what), ``failed`` that
#: it stopped. Processes exit 0 on these, 1 on ``failed``.
SUCCESSFUL_STATUSES = frozenset({"completed", "degraded"})
#: ``Done.status`` of a coordinator *process* that is stopping (SIGTERM, a storage
#: fault) while its federation is not over: a restart resumes it, so a participant
#: waits for it to come back (bounded by its ``give_up_s``) instead of exiting.
STOPPING_STATUS = "stopping"
_PATTERN = re.compile(r"^federation has ended \(([a-z]+)\)")


def ended_details(federation_id: str, status: str, message: str) -> str:
    """The status details for a request that arrives after the end."""
    return f"{ENDED_PREFIX} ({status}): federation {federation_id}: {message}"[:500]


def ended_status(details: str) -> str | None:
    """The final status named by ``details`` if it says the federation ended."""
    match = _PATTERN.match(details)
    return match.group(1) if match else None
