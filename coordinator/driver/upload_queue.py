"""Masked uploads that wait for a free upload slot instead of being refused.

A secure job takes at most ``max_in_flight`` incomplete masked uploads at once (each
holds up to one vector of coordinator memory: :mod:`spherecal.crypto.staging`). An
upload whose *first chunk* finds every slot taken is refused (``UPLOAD_SLOTS_BUSY``) and
its site retries after 0.2–0.7 s — while a slot may have freed a few milliseconds after
the refusal. Issue #24, measured on the CCVR statistics stage at l = 512, C = 100 (105 MB
per site, 2 slots, 4 sites): the second pair of uploads began 0.35 and 0.50 s after the
first pair's slots freed, each wave of a larger federation adding as much.

A site of this version opens its upload with a *header* (caller and job, no chunk).
Such an upload is not refused: its handler waits here, holding nothing but a thread and
the transport's flow-control window (the site's first chunk is not read until the
upload has its slot), and starts the moment a slot frees — in the order the uploads
began waiting. An upload whose first message already carries a chunk (a site of an
earlier version) is refused as before (its chunk is in the coordinator's memory), also
when the only free slot is given to a waiting upload (:meth:`UploadQueue.admit`). A wait
ends without a slot when the job leaves its masked stage or ends (the stage's deadline
bounds it) and when the site goes away (the transport cancels the call).

Every method is called with the job's lock free or held (an ``RLock``); the condition
shares that lock, so a slot freed in :meth:`SecureJob.end_upload
<spherecal.coordinator.driver.secure_job.SecureJob.end_upload>` and the check of the
slots here never interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from spherecal import crypto
from spherecal.coordinator.errors import ServiceError

__all__ = ["RECHECK_S", "UploadQueue"]

RECHECK_S = 0.25
"""How often a waiting upload looks again without being woken: catches a site that
went away (its call cancelled) while no slot freed."""


class UploadQueue:
    """The slots one job's header-first uploads hold and the uploads waiting for one."""

    def __init__(self, lock: threading.RLock, capacity: int) -> None:
        self._cond = threading.Condition(lock)
        self.capacity = capacity
        self._reserved: set[str] = set()
        """Participants whose waited-for upload holds a slot and has not ended."""
        self._queue: list[str] = []
        """Participants waiting for a slot, in the order they began to wait."""
        self.waits = 0
        """How many uploads had to wait (each counted once)."""

    def waiting(self) -> tuple[str, ...]:
        with self._cond:
            return tuple(self._queue)

    def wait(
        self,
        participant: str,
        *,
        in_use: Callable[[], frozenset[str]],
        check: Callable[[], None],
        cancelled: Callable[[], bool],
    ) -> None:
        """Return once ``participant`` holds a slot: ``in_use()`` (uploads the sum
        holds, earlier-version ones included) and the reserved slots leave one free and
        every upload that began waiting before it has its slot. ``check`` raises when
        the job can no longer take the upload (stage closed, job ended); a cancelled
        call raises ``CANCELLED``. Either way the participant leaves the queue."""
        with self._cond:
            try:
                while True:
                    check()
                    if cancelled():
                        raise ServiceError(
                            grpc.StatusCode.CANCELLED,
                            "the upload was cancelled while it waited for a slot",
                        )
                    busy = in_use() | self._reserved
                    if participant in busy:
                        self._reserved.add(participant)
                        return
                    queued = participant in self._queue
                    ahead = self._queue.index(participant) if queued else len(self._queue)
                    if ahead < self.capacity - len(busy):
                        self._reserved.add(participant)
                        return
                    if not queued:
                        self._queue.append(participant)
                        self.waits += 1
                    self._cond.wait(RECHECK_S)
            finally:
                if participant in self._queue:
                    self._queue.remove(participant)
                    self._cond.notify_all()  # the uploads behind it move up

    def admit(self, participant: str, in_use: frozenset[str]) -> None:
        """Before a chunk is summed: raise ``UploadSlotsBusy`` when it would start an
        upload (its sender has none in the sum, ``in_use``, and holds no slot) while
        every slot is in use or given to a waiting upload — so an upload that opened
        without a header (a site of an earlier version) cannot take the slot a waiting
        one was just given."""
        with self._cond:
            if participant in in_use or participant in self._reserved:
                return
            if len(in_use | self._reserved) >= self.capacity:
                raise crypto.UploadSlotsBusy(
                    f"all {self.capacity} upload slots are in use or given to waiting "
                    "uploads; retry when one frees up"
                )

    def release(self, participant: str) -> None:
        """``participant``'s upload ended (complete or not): its slot is free."""
        with self._cond:
            self._reserved.discard(participant)
            self._cond.notify_all()

    def wake(self) -> None:
        """The job left its masked stage or ended: every wait looks again (and ends)."""
        with self._cond:
            self._cond.notify_all()
