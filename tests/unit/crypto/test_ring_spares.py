"""Reused encoded-input buffers (``ring.borrow``/``ring.give_back``, issue #24): a spare
serves by byte capacity, is zero whenever it is spare, is never on two loans at once,
and comes back whole, once."""

from __future__ import annotations

import gc
import random
import threading

import numpy as np
import numpy.typing as npt
import pytest

from spherecal.crypto import ring
from spherecal.crypto._exceptions import WrongLength
from spherecal.crypto.ring import borrow, encode, encode_into, give_back
from spherecal.crypto.simulation import run_protocol
from spherecal.crypto.spec import JobSpec

U64, U32 = np.dtype("<u8"), np.dtype("<u4")


pytestmark = pytest.mark.usefixtures("fresh_ring_pool")  # tests/conftest.py


def _address(array: npt.NDArray[np.unsignedinteger]) -> int:
    return int(array.__array_interface__["data"][0])


def test_a_given_back_buffer_is_zeroed_and_serves_the_next_borrow() -> None:
    first = borrow(1003, 32)
    encode_into(first, np.full(1003, 0.5), scale_bits=4, bound=1.0)
    assert first.any()
    give_back(first)
    (spare,) = ring._spare
    assert spare.nbytes == 1003 * 4 and not spare.any()  # the encoded input is gone
    again = borrow(1003, 32)
    assert again.dtype == U32 and again.shape == (1003,)
    assert np.shares_memory(again, spare) and not again.any()
    assert not ring._spare  # on loan now, not spare


def test_a_spare_serves_by_capacity_across_rings_and_lengths() -> None:
    """A 64-bit buffer hosts a 32-bit input of the same length (or twice the length),
    a larger buffer a smaller vector; a request larger than every spare gets new memory."""
    wide = borrow(1000, 64)
    address = _address(wide)
    give_back(wide)
    narrow = borrow(1000, 32)
    assert narrow.dtype == U32 and narrow.shape == (1000,) and _address(narrow) == address
    give_back(narrow)
    assert ring._spare[0].nbytes == 8000  # the whole buffer came back, not the view
    double = borrow(2000, 32)
    assert double.shape == (2000,) and _address(double) == address
    give_back(double)
    small = borrow(10, 64)
    assert small.shape == (10,) and _address(small) == address
    give_back(small)
    bigger = borrow(1001, 64)  # 8,008 bytes: no spare holds them
    assert _address(bigger) != address and len(ring._spare) == 1
    give_back(bigger)
    assert sorted(s.nbytes for s in ring._spare) == [8000, 8008]


def test_the_smallest_spare_that_fits_is_taken() -> None:
    large, small = borrow(4096, 64), borrow(512, 64)
    large_at, small_at = _address(large), _address(small)
    give_back(large)
    give_back(small)
    assert _address(borrow(300, 64)) == small_at  # best fit, not the oldest
    assert _address(borrow(300, 64)) == large_at  # the next fitting one


def _borrow_together(
    threads: int,
) -> tuple[list[npt.NDArray[np.unsignedinteger]], list[bool]]:
    """``threads`` threads borrow at once (a barrier holds every loan live together),
    each writes its own pattern and checks it, then gives its loan back."""
    barrier = threading.Barrier(threads)
    held: list[npt.NDArray[np.unsignedinteger]] = [np.empty(0, dtype=U64)] * threads
    intact = [False] * threads

    def work(i: int) -> None:
        buffer = borrow(2048 + 64 * i, 64 if i % 2 else 32)
        buffer.fill(i + 1)
        held[i] = buffer
        barrier.wait()  # every loan is live here
        intact[i] = bool(np.all(buffer == i + 1))
        barrier.wait()
        give_back(buffer)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return held, intact


def test_concurrent_borrows_never_share_memory() -> None:
    """No two live loans overlap: first from new memory, then every loan from a spare."""
    threads = 8
    for _ in range(2):
        held, intact = _borrow_together(threads)
        assert all(intact)
        for i in range(threads):
            for j in range(i + 1, threads):
                assert not np.shares_memory(held[i], held[j])
        assert len(ring._spare) == threads and not ring._lent
        assert all(not spare.any() for spare in ring._spare)


def test_a_view_comes_back_whole_and_once() -> None:
    base_bytes = 8 * 4096
    wide = borrow(4096, 64)
    give_back(wide)
    view = borrow(1000, 32)  # a view of the first 4,000 bytes of that buffer
    view.fill(0xFFFFFFFF)
    give_back(view)
    assert [s.nbytes for s in ring._spare] == [base_bytes] and not ring._spare[0].any()
    with pytest.raises(ValueError, match="not on loan"):
        give_back(view)  # a second give-back must not make the buffer spare twice
    assert len(ring._spare) == 1
    a, b = borrow(1000, 32), borrow(1000, 32)
    assert not np.shares_memory(a, b)
    # the stale view's give-back, while its buffer is on another loan, is refused too
    with pytest.raises(ValueError, match="not on loan"):
        give_back(view)
    assert not np.shares_memory(a, borrow(1000, 32))


def test_only_a_lent_array_is_taken_back() -> None:
    with pytest.raises(ValueError, match="not on loan"):
        give_back(np.zeros(16, dtype=U64))
    lent = borrow(16, 64)
    with pytest.raises(ValueError, match="not on loan"):
        give_back(lent[:8])  # a slice of a loan is not the loan
    assert not ring._spare
    give_back(lent)
    with pytest.raises(WrongLength):
        borrow(-1, 64)


def test_mutation_a_buffer_spare_twice_would_be_lent_to_two_borrowers() -> None:
    """Mutation check of the once-only rule: were a buffer put back while on loan (what
    the refused second give-back would do), the next two borrowers would share it."""
    first = borrow(256, 64)
    give_back(first)
    lent = borrow(256, 64)
    ring._spare.append(ring._lent[id(lent)][1])  # the weakened rule: spare while lent
    assert np.shares_memory(lent, borrow(256, 64))


def test_a_dropped_loan_takes_its_buffer_with_it() -> None:
    lent = borrow(512, 64)
    assert len(ring._lent) == 1
    del lent
    gc.collect()
    assert not ring._lent and not ring._spare  # freed, never spare (never zeroed)


def test_the_spares_stay_bounded() -> None:
    loans = [borrow(7 + i, 64) for i in range(ring.SPARE_BUFFERS + 3)]
    for loan in loans:
        give_back(loan)
    assert len(ring._spare) == ring.SPARE_BUFFERS
    assert min(s.nbytes for s in ring._spare) == 8 * (7 + 3)  # the oldest went first


def test_a_site_alternating_rings_reuses_its_buffers_with_exact_sums() -> None:
    """A 64-bit statistics job, then a 32-bit update job of the same length: the second
    job's encoded inputs live in the first job's buffers (no new allocation), and its
    sum is exact against an independent numpy computation."""
    ids = [f"p{i}" for i in range(5)]
    rng = np.random.default_rng(3)
    inputs = {p: rng.uniform(-1.0, 1.0, 600) for p in ids}

    def job(bits: int) -> tuple[JobSpec, npt.NDArray[np.unsignedinteger]]:
        spec = JobSpec.create(ids, threshold=3, length=600, bound=1.0, ring_bits=bits)
        report = run_protocol(spec, inputs, drop={"p1": "masked"}, rng=random.Random(bits))
        return spec, report.result.ring_sum

    job(64)
    after_64 = sorted(_address(s) for s in ring._spare)
    assert len(after_64) == 4 and all(s.nbytes == 600 * 8 for s in ring._spare)
    spec, ring_sum = job(32)
    assert sorted(_address(s) for s in ring._spare) == after_64  # the same memory
    assert ring_sum.dtype == U32
    expected = np.zeros(600, dtype=U32)
    for p in ids:
        if p != "p1":
            expected += encode(inputs[p], scale_bits=spec.scale_bits, bound=1.0, ring_bits=32)
    assert np.array_equal(ring_sum, expected)
