"""Streaming the masked uploads into one sum: O(vector) memory, no partial inputs in it.

Masked chunks are added in place into one preallocated accumulator of the job's ring
words (``uint32`` or ``uint64``), so memory is O(vector length), not O(participants ×
length). A participant whose upload is incomplete at the deadline is a dropout, and
its partial chunks must not stay in the sum. Each chunk is added into the accumulator
*as it arrives* — one pass over the upload, reading the received bytes in place (issue
#24: before, each chunk was copied into a staging slot and the slot added once
complete, two passes plus a slot's first-touch page faults) — and the upload keeps a
reference to the chunks it added until it completes. An abandoned upload subtracts
exactly those chunks again (ring arithmetic wraps, so ``(Σ + c) − c = Σ`` bit for bit)
and the sum is as if it never started. At most ``max_in_flight`` uploads are
incomplete at once, so the chunks held are at most ``max_in_flight`` vectors: total
memory ``(1 + max_in_flight) × w/8 × length`` bytes at worst, as with staging slots, and
only while uploads are in flight. A further upload is refused with
:class:`UploadSlotsBusy` (retry later, nothing stored). Re-uploading after an abandoned
attempt is safe: the participant's chunks are deterministic, so the server sees
identical bytes.

The accumulator is not zeroed in advance: the first chunk to reach a range is copied
there (one write per page instead of a read of the zero page and a write), later ones
added.

:class:`StagedSum` knows nothing of stages or senders' eligibility: the
:class:`~spherecal.crypto.server.SecAggServer` checks those first and owns one while its ``MASKED``
stage is open (and the accumulator until ``finish``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    received: npt.NDArray[np.bool_]
    count: int = 0
    #: (start, words) of every chunk already added into the sum, to subtract if abandoned
    added: list[tuple[int, npt.NDArray[np.unsignedinteger]]] = field(default_factory=list)


class StagedSum:
    """The running sum of complete masked inputs and of the chunks of incomplete ones,
    which an abandoned upload takes out again.

    Every method either changes the state completely or raises a typed error and
    changes nothing.
    """

    def __init__(self, spec: JobSpec, *, max_in_flight: int) -> None:
        self.spec = spec
        self.max_in_flight = max_in_flight
        self._total: npt.NDArray[np.unsignedinteger] = np.empty(spec.length, dtype=spec.dtype)
        self._written = np.zeros(spec.n_chunks, dtype=np.bool_)  # chunk ranges holding a sum
        self._uploads: dict[str, _Upload] = {}
        self.completed: set[str] = set()

    @property
    def total(self) -> npt.NDArray[np.unsignedinteger]:
        """The sum of every complete upload (once no upload is in flight: only those)."""
        self._write_zeros()
        return self._total

    @total.setter
    def total(self, value: npt.NDArray[np.unsignedinteger]) -> None:
        self._total = value
        self._written[:] = True

    def _write_zeros(self) -> None:
        for index in np.flatnonzero(~self._written):
            start, stop = self.spec.chunk_bounds(int(index))
            self._total[start:stop] = 0
        self._written[:] = True

    def memory_bytes(self) -> int:
        """Bytes held in vectors (the accumulator + chunks of uploads in flight)."""
        held = sum(words.nbytes for u in self._uploads.values() for _, words in u.added)
        return self._total.nbytes + held

    def uploading(self) -> frozenset[str]:
        """Participants with an incomplete upload in the sum."""
        return frozenset(self._uploads)

    def add_chunk(self, sender: str, index: int, data: bytes | bytearray | memoryview) -> None:
        """Add chunk ``index`` of ``sender``'s input into :attr:`total`; the upload is
        complete once every chunk arrived. ``sender`` must already be checked as
        eligible. ``data`` is read in place and must stay unchanged until the upload
        completes (``bytes`` do)."""
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
            if len(self._uploads) >= self.max_in_flight:
                raise UploadSlotsBusy(
                    f"all {self.max_in_flight} upload slots are in use; retry when one frees up"
                )
            upload = _Upload(received=np.zeros(self.spec.n_chunks, dtype=np.bool_))
            self._uploads[sender] = upload
        # Zero-copy read of the upload: one pass adds it into the sum.
        words = np.frombuffer(view, dtype=self.spec.dtype)
        part = self._total[start:stop]
        if self._written[index]:
            np.add(part, words, out=part)
        else:
            np.copyto(part, words)
            self._written[index] = True
        upload.received[index] = True
        upload.count += 1
        if upload.count == self.spec.n_chunks:
            self.completed.add(sender)
            del self._uploads[sender]
        else:  # held to subtract if abandoned: a copy only if the sender's buffer may change
            upload.added.append((start, words if view.readonly else words.copy()))

    def abandon(self, participant: str) -> bool:
        """Take an incomplete upload's chunks out of the sum; returns whether there was one."""
        upload = self._uploads.pop(participant, None)
        if upload is None:
            return False
        for start, words in upload.added:
            part = self._total[start : start + words.shape[0]]
            np.subtract(part, words, out=part)
        return True

    def abandon_all(self) -> None:
        """Discard every incomplete upload (a restored journal replaces the sum)."""
        for participant in list(self._uploads):
            self.abandon(participant)

    def close(self) -> frozenset[str]:
        """End uploading: take every incomplete upload out (a dropout) and release the
        chunks held; returns who is in :attr:`total`."""
        for participant in list(self._uploads):
            self.abandon(participant)
        self._write_zeros()
        return frozenset(self.completed)
