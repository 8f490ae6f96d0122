"""A masked upload sent again: the identical bytes are delivered, different ones refused.

Why (issue #20): a site killed during its masked upload stores the masked chunks
before the first byte leaves (``participant.held_jobs``) and, restarted, streams
them again for the same job. Its cut stream was never summed (``crypto.staging``
takes an abandoned upload's chunks out again), so the new one is summed as any
first upload; a site whose whole input already arrived (its receipt was lost)
sends it again and must hear "delivered" (``ALREADY_EXISTS``, as for a repeated
message). Neither may carry a *different* masked input: under the same masks, two
masked inputs reveal the difference of the two inputs to whoever holds both, and
an input swapped after a cut upload is not the one the site's ledger charged. So
the masked stage keeps the SHA-256 of every chunk it received, per participant and
chunk index (32 bytes a chunk, dropped when the stage closes — the sum never holds
an upload), and refuses any chunk whose bytes differ from one received before with
:class:`DifferentMaskedInput`, a typed refusal the service logs and audits. A
repeat of a complete upload is read to its end and compared, never summed.

Not thread-safe: the job's lock guards it (``secure_job.SecureJob``).
"""

from __future__ import annotations

import hmac

import grpc

from spherecal.coordinator.errors import ServiceError

__all__ = ["DifferentMaskedInput", "MaskedDigests"]


class DifferentMaskedInput(ServiceError):
    """A participant sent a masked chunk that differs from the one it sent before for
    the same job and index."""

    def __init__(self, message: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, message)


class MaskedDigests:
    """Per participant: the digest of each masked chunk received in one job's masked
    stage, and which repeats of a complete upload are being compared."""

    def __init__(self, n_chunks: int) -> None:
        self.n_chunks = n_chunks
        self._seen: dict[str, dict[int, bytes]] = {}
        self._repeating: dict[str, set[int]] = {}

    def begin_repeat(self, participant: str) -> bool:
        """``participant``'s input is complete and it starts uploading again: True
        when every chunk's digest is known, so the repeat is compared (not summed);
        False when it cannot be compared (then it is answered as delivered at once)."""
        if len(self._seen.get(participant, {})) != self.n_chunks:
            return False
        self._repeating[participant] = set()
        return True

    def admit(self, participant: str, index: int, digest: bytes, label: str) -> bool:
        """Check one chunk before it is summed: :class:`DifferentMaskedInput` if it
        differs from one received before; False for a chunk of a compared repeat
        (nothing to sum), with ``ALREADY_EXISTS`` once the whole repeat matched;
        True for a chunk to sum."""
        known = self._seen.get(participant, {}).get(index)
        if known is not None and not hmac.compare_digest(known, digest):
            self._repeating.pop(participant, None)
            raise DifferentMaskedInput(
                f"{label}: masked chunk {index} from {participant!r} differs from the one "
                "it sent before; a job takes one masked input per participant"
            )
        compared = self._repeating.get(participant)
        if compared is None:
            return True
        compared.add(index)
        if len(compared) == self.n_chunks:
            del self._repeating[participant]
            raise ServiceError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"{label} already has this masked input from {participant!r} (identical)",
            )
        return False

    def record(self, participant: str, index: int, digest: bytes) -> None:
        """A chunk was summed."""
        self._seen.setdefault(participant, {})[index] = digest

    def end(self, participant: str) -> bool:
        """The stream ended; True if it was a compared repeat (nothing was summed)."""
        return self._repeating.pop(participant, None) is not None

    def clear(self) -> None:
        """The masked stage closed: nothing more is compared."""
        self._seen.clear()
        self._repeating.clear()
