"""Record of job ids a participant has taken part in, to refuse replays.

Why: a coordinator that re-runs a job id with the same participant could collect
two masked uploads under related conditions, or replay old protocol messages
(Bonawitz et al. 2017 assume fresh keys per execution). Each :class:`SecAggParticipant`
claims ``(participant id, job id)`` before generating keys; a second claim raises
:class:`JobReplayed`.

``crypto`` does no I/O, so the default ledger lives in memory for the life of the
process. The participant process should pass a persistent implementation (e.g. a
SQLite table) so the guarantee survives restarts; anything with a ``claim`` method
of this signature works.
"""

from __future__ import annotations

import threading
from typing import Protocol

from spherecal.crypto._exceptions import JobReplayed

__all__ = ["JobLedger", "MemoryJobLedger", "default_ledger"]


class JobLedger(Protocol):
    def claim(self, participant_id: str, job_id: bytes) -> None:
        """Record the pair, or raise :class:`JobReplayed` if it was recorded before."""
        ...


class MemoryJobLedger:
    """Thread-safe in-memory ledger."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, bytes]] = set()
        self._lock = threading.Lock()

    def claim(self, participant_id: str, job_id: bytes) -> None:
        key = (participant_id, bytes(job_id))
        with self._lock:
            if key in self._seen:
                raise JobReplayed(
                    f"participant {participant_id!r} already ran job {job_id.hex()[:32]}; "
                    "a job id is never run twice"
                )
            self._seen.add(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._seen


_DEFAULT = MemoryJobLedger()


def default_ledger() -> MemoryJobLedger:
    """The process-wide ledger used when none is given."""
    return _DEFAULT
