"""Bytes on the wire per participant and per stage, as the coordinator sees them.

Counted from the serialized size of every protobuf message the coordinator receives
from (``received``) or sends to (``sent``) a participant, so the numbers include
framing inside the messages but not HTTP/2 or TLS overhead. Counting on the
coordinator's side means a participant killed mid-run still has its bytes reported.
"""

from __future__ import annotations

import threading
from collections import defaultdict

__all__ = ["Traffic"]


class Traffic:
    """Thread-safe byte counters: (participant, stage) → sent, received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, list[int]]] = defaultdict(
            lambda: defaultdict(lambda: [0, 0])
        )

    def received(self, participant: str, stage: str, nbytes: int) -> None:
        with self._lock:
            self._data[participant][stage][1] += int(nbytes)

    def sent(self, participant: str, stage: str, nbytes: int) -> None:
        with self._lock:
            self._data[participant][stage][0] += int(nbytes)

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{participant: {stage: {"sent": n, "received": n}}}`` plus a ``total`` stage."""
        with self._lock:
            out: dict[str, dict[str, dict[str, int]]] = {}
            for pid in sorted(self._data):
                stages = self._data[pid]
                entry = {s: {"sent": v[0], "received": v[1]} for s, v in sorted(stages.items())}
                entry["total"] = {
                    "sent": sum(v[0] for v in stages.values()),
                    "received": sum(v[1] for v in stages.values()),
                }
                out[pid] = entry
            return out
