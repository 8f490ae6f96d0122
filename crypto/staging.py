"""Streaming the masked uploads into one sum: O(vector) memory, no partial inputs in it.

Masked chunks are added in place into one preallocated accumulator of the job's ring
words (``uint32`` or ``uint64``), so memory
is O(vector length), not O(participants × length). A participant whose upload is
incomplete at the deadline is a dropout, and its partial chunks must not stay in the sum
— but they cannot be subtracted later without its input. So each uploading participant
is given one of ``max_in_flight`` staging slots (a vector each); chunks are written there
(any order) and the slot is added into the accumulator only when the upload is complete.
An abandoned upload just frees its slot. Total memory is ``(1 + max_in_flight) × w/8 ×
length`` bytes; when all slots are busy a new upload is refused with
:class:`UploadSlotsBusy` (retry later, nothing stored). Re-uploading after an abandoned
attempt is safe: the participant's chunks are deterministic, so the server sees
identical bytes.

:class:`StagedSum` knows nothing of stages or senders' eligibility: the
:class:`~spherecal.crypto.server.SecAggServer` checks those first and owns one while its ``MASKED``
stage is open (and the accumulator until ``finish``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spherecal.crypto._exceptions import (
    DuplicateMessage,
    MalformedMessage,
    UploadSlotsBusy,
    WrongLength,
)
from spherecal.crypto.spec import JobSpec

__all__ = ["StagedSum"]


@dataclass
class _Upload:
    slot: int
    received: npt.NDArray[np.bool_]
    count: int = 0


class StagedSum:
    """The running sum of complete masked inputs plus the staging slots of incomplete ones.

    Every method either changes the state completely or raises a typed error and
    changes nothing.
    """

    def __init__(self, spec: JobSpec, *, max_in_flight: int) -> None:
        self.spec = spec
        self.max_in_flight = max_in_flight
        self.total: npt.NDArray[np.unsignedinteger] = np.zeros(spec.length, dtype=spec.dtype)
        self._slots: list[npt.NDArray[np.unsignedinteger]] = []
        self._free_slots: list[int] = []
        self._uploads: dict[str, _Upload] = {}
        self.completed: set[str] = set()

    def memory_bytes(self) -> int:
        """Bytes held in vectors (accumulator + staging slots)."""
        return self.total.nbytes + sum(slot.nbytes for slot in self._slots)

    def uploading(self) -> frozenset[str]:
        """Participants with an incomplete upload in a staging slot."""
        return frozenset(self._uploads)

    def add_chunk(self, sender: str, index: int, data: bytes | bytearray | memoryview) -> None:
        """Stage chunk ``index`` of ``sender``'s input; add the slot into :attr:`total`
        once every chunk arrived. ``sender`` must already be checked as eligible."""
        if sender in self.completed:
            raise DuplicateMessage(f"{sender!r} already uploaded its complete masked input")
        if not 0 <= index < self.spec.n_chunks:
            raise MalformedMessage(f"chunk index {index} out of range 0..{self.spec.n_chunks - 1}")
        start, stop = self.spec.chunk_bounds(index)
        view = memoryview(data).cast("B")
        size = self.spec.entry_bytes
        if len(view) != size * (stop - start):
            raise WrongLength(
                f"chunk {index} must carry {stop - start} entries "
                f"({size * (stop - start)} bytes), got {len(view)} bytes"
            )
        upload = self._uploads.get(sender)
        if upload is not None and upload.received[index]:
            raise DuplicateMessage(f"{sender!r} already sent chunk {index}")
        if upload is None:
            upload = _Upload(
                slot=self._take_slot(), received=np.zeros(self.spec.n_chunks, dtype=np.bool_)
            )
            self._uploads[sender] = upload
        slot = self._slots[upload.slot]
        # Zero-copy read of the upload: one pass writes it into the slot.
        slot[start:stop] = np.frombuffer(view, dtype=self.spec.dtype)
        upload.received[index] = True
        upload.count += 1
        if upload.count == self.spec.n_chunks:
            np.add(self.total, slot, out=self.total)
            self.completed.add(sender)
            del self._uploads[sender]
            self._free_slots.append(upload.slot)

    def _take_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        if len(self._slots) < self.max_in_flight:
            self._slots.append(np.empty(self.spec.length, dtype=self.spec.dtype))
            return len(self._slots) - 1
        raise UploadSlotsBusy(
            f"all {self.max_in_flight} upload slots are in use; retry when one frees up"
        )

    def abandon(self, participant: str) -> bool:
        """Discard an incomplete upload; returns whether there was one."""
        upload = self._uploads.pop(participant, None)
        if upload is None:
            return False
        self._free_slots.append(upload.slot)
        return True

    def abandon_all(self) -> None:
        """Discard every incomplete upload (a restored journal replaces the sum)."""
        for participant in list(self._uploads):
            self.abandon(participant)

    def close(self) -> frozenset[str]:
        """End uploading: drop every incomplete upload (a dropout) and free the staging
        memory; returns who is in :attr:`total`."""
        self._uploads = {}
        self._slots = []
        self._free_slots = []
        return frozenset(self.completed)
