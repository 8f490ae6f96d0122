"""One pass per upload into the sum, and an abandoned upload leaves no trace (issue #24).

Chunks are added into the accumulator as they arrive; an upload that does not
complete is subtracted again. Checked against an independent numpy sum of exactly
the complete uploads, bit for bit, in both rings, with uploads interleaved, chunks
out of order and an abandoned upload that was the first to reach a range.
"""

from __future__ import annotations

import numpy as np
import pytest

from spherecal.crypto import JobSpec, UploadSlotsBusy
from spherecal.crypto.staging import StagedSum


def _spec(length: int, chunk: int, ring_bits: int) -> JobSpec:
    return JobSpec.create(
        participants=["a", "b", "c", "d"],
        threshold=3,
        length=length,
        bound=1.0,
        chunk_size=chunk,
        ring_bits=ring_bits,
    )


def _chunks(spec: JobSpec, words: np.ndarray) -> list[bytes]:
    return [words[a:b].tobytes() for a, b in (spec.chunk_bounds(i) for i in range(spec.n_chunks))]


@pytest.mark.parametrize("ring_bits", [32, 64])
def test_abandoned_uploads_leave_the_sum_exactly_the_complete_ones(ring_bits: int) -> None:
    spec = _spec(length=37, chunk=8, ring_bits=ring_bits)
    rng = np.random.default_rng(ring_bits)
    top = 2**ring_bits
    inputs = {
        p: rng.integers(0, top, size=spec.length, dtype=np.uint64).astype(spec.dtype)
        for p in "abcd"
    }
    chunks = {p: _chunks(spec, v) for p, v in inputs.items()}
    staged = StagedSum(spec, max_in_flight=3)
    # "d" is first into chunks 4 and 0, then abandoned; "c" arrives interleaved and
    # out of order, is abandoned after 3 chunks, and later re-sends everything.
    staged.add_chunk("d", 4, chunks["d"][4])
    staged.add_chunk("d", 0, chunks["d"][0])
    for index in (3, 1, 0):
        staged.add_chunk("c", index, chunks["c"][index])
    for index in range(spec.n_chunks):
        staged.add_chunk("a", index, chunks["a"][index])
    assert staged.abandon("d") and not staged.abandon("d")
    assert staged.abandon("c")
    for index in reversed(range(spec.n_chunks)):
        staged.add_chunk("c", index, chunks["c"][index])
    staged.add_chunk("b", 2, chunks["b"][2])  # incomplete at the close: a dropout
    assert staged.close() == {"a", "c"}
    expected = (inputs["a"].astype(np.uint64) + inputs["c"]).astype(spec.dtype)
    assert staged.total.dtype == spec.dtype
    assert np.array_equal(staged.total, expected)
    assert staged.memory_bytes() == staged.total.nbytes


def test_a_range_no_complete_upload_reached_is_zero() -> None:
    spec = _spec(length=16, chunk=4, ring_bits=64)
    staged = StagedSum(spec, max_in_flight=2)
    words = np.arange(1, 17, dtype=np.uint64)
    staged.add_chunk("a", 1, words[4:8].tobytes())  # only chunk 1, then the stage closes
    assert staged.close() == frozenset()
    assert np.array_equal(staged.total, np.zeros(16, dtype=np.uint64))


def test_a_writable_buffer_changed_after_sending_cannot_corrupt_the_subtraction() -> None:
    spec = _spec(length=8, chunk=4, ring_bits=64)
    staged = StagedSum(spec, max_in_flight=2)
    good = np.full(8, 5, dtype=np.uint64)
    staged.add_chunk("a", 0, good[:4].tobytes())
    buffer = bytearray(np.full(4, 7, dtype=np.uint64).tobytes())
    staged.add_chunk("b", 0, buffer)
    buffer[:] = bytes(len(buffer))  # the sender's buffer is reused
    staged.add_chunk("a", 1, good[4:].tobytes())
    assert staged.abandon("b")
    staged.close()
    assert np.array_equal(staged.total, good)


def test_in_flight_uploads_are_bounded_and_hold_only_their_chunks() -> None:
    spec = _spec(length=16, chunk=4, ring_bits=32)
    staged = StagedSum(spec, max_in_flight=1)
    words = np.arange(16, dtype=np.uint32)
    staged.add_chunk("a", 0, words[:4].tobytes())
    assert staged.memory_bytes() == 16 * 4 + 4 * 4
    with pytest.raises(UploadSlotsBusy):
        staged.add_chunk("b", 0, words[:4].tobytes())
    assert staged.uploading() == {"a"}
    for index in (1, 2, 3):
        staged.add_chunk("a", index, words[4 * index : 4 * index + 4].tobytes())
    assert staged.memory_bytes() == 16 * 4
    staged.add_chunk("b", 0, words[:4].tobytes())  # the slot freed up
    assert staged.uploading() == {"b"}


def test_a_restored_sum_is_kept_whole() -> None:
    """``SecAggServer.restore_masked`` replaces the sum: later reads must not zero it."""
    spec = _spec(length=12, chunk=4, ring_bits=64)
    staged = StagedSum(spec, max_in_flight=2)
    staged.add_chunk("a", 1, np.ones(4, dtype=np.uint64).tobytes())
    staged.abandon_all()
    restored = np.arange(12, dtype=np.uint64)
    staged.total = restored.copy()
    staged.completed = {"a", "b"}
    assert staged.close() == {"a", "b"}
    assert np.array_equal(staged.total, restored)
