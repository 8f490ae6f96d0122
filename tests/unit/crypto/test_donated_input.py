"""A donated input (issue #24): ``SecAggParticipant.set_input(..., donate=True)`` encodes
a 64-bit job's float vector in its own memory (``ring.adopt``) instead of a second buffer
of its size — the same words, so the same masked chunks and the exact sum; a refusal
leaves the vector whole and names the right count; and where the vector cannot host the
encoding (another dtype, strided, read-only, a 32-bit ring, a prepared buffer) it is
copied exactly as without ``donate``."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from spherecal.crypto import native, participant, ring
from spherecal.crypto._exceptions import EncodingOverflow, WrongLength
from spherecal.crypto.ring import adopt, borrow, encode, encode_into, give_back

from .helpers import Net, advertised_client

pytestmark = pytest.mark.usefixtures("fresh_ring_pool")  # tests/conftest.py


@pytest.fixture(params=["native", "numpy"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both encoders: the native kernel where it is built, and the numpy path."""
    if request.param == "numpy":
        monkeypatch.setattr(native, "KERNEL", None)
    elif native.KERNEL is None:
        pytest.skip("the native kernel is not built here")
    return str(request.param)


def _shared(net: Net) -> Net:
    net.advertise()
    net.share()
    return net


def test_a_donated_vector_holds_its_own_encoding_and_the_sum_is_exact(engine: str) -> None:
    net = _shared(Net(4, length=5000, chunk_size=1024))
    donor = net.clients["p01"]
    vector = net.inputs["p01"].copy()  # the copy is what is given up
    expected = encode(net.inputs["p01"], scale_bits=net.spec.scale_bits, bound=1.0)
    donor.set_input(vector, donate=True)
    assert donor._encoded is not None
    assert np.shares_memory(donor._encoded, vector)  # no second buffer
    assert np.array_equal(donor._encoded, expected)  # the same words as a copy gives
    assert vector.view(ring.RING_DTYPE).tobytes() == expected.tobytes()
    for p in net.ids:
        if p != "p01":
            net.clients[p].set_input(net.inputs[p])
    net.masked()
    result = net.unmask()
    exact = sum(
        (encode(net.inputs[p], scale_bits=net.spec.scale_bits, bound=1.0) for p in net.ids),
        start=np.zeros(5000, dtype=ring.RING_DTYPE),
    )
    assert np.array_equal(result.ring_sum, exact)
    # the job's end gives the loan back: zeroed, and never a spare (the donor can
    # still reach that memory), while the copying participants' buffers are
    assert not ring._lent and not ring._adopted
    assert len(ring._spare) == 3
    assert not any(np.shares_memory(spare, vector) for spare in ring._spare)
    assert not vector.any()


def test_the_masked_chunks_of_a_donated_input_are_those_of_a_copied_one() -> None:
    """The chunks depend on the encoded words alone: a donor's chunks are unchanged
    when its encoding is then copied into a borrowed buffer."""
    net = _shared(Net(3, length=3000, chunk_size=1000))
    donor = net.clients["p00"]
    vector = net.inputs["p00"].copy()
    donor.set_input(vector, donate=True)
    net.clients["p01"].set_input(net.inputs["p01"])
    net.clients["p02"].set_input(net.inputs["p02"])
    net.deliver_bundles()
    donated = [donor.masked_chunk(i).to_bytes() for i in range(net.spec.n_chunks)]
    assert donor._encoded is not None
    copied = borrow(3000)
    encode_into(copied, net.inputs["p00"], scale_bits=net.spec.scale_bits, bound=1.0)
    donor._encoded = copied
    assert [donor.masked_chunk(i).to_bytes() for i in range(net.spec.n_chunks)] == donated


def test_a_refused_donated_vector_is_left_whole_and_counted_right(engine: str) -> None:
    """Out of bound late in the vector, after thousands of negative entries: the
    refusal names exactly the entries out of bound (an encoding written before the check
    would turn the negative words into NaN bit patterns and inflate the count), the
    vector is unchanged until the loan ends, and then it is zeroed and spare."""
    net = _shared(Net(3, length=6000))
    client = net.clients["p00"]
    vector = np.full(6000, -0.5)
    vector[-3:] = 7.0
    before = vector.copy()
    seen: list[np.ndarray] = []
    real_give_back = ring.give_back

    def watch(buffer: np.ndarray) -> None:
        seen.append(np.array(buffer.view(np.float64), copy=True))
        real_give_back(buffer)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(participant, "give_back", watch)
        with pytest.raises(EncodingOverflow, match=r"encode: 3 of 6000 entries"):
            client.set_input(vector, donate=True)
    (at_refusal,) = seen
    assert np.array_equal(at_refusal, before)  # nothing was written before the check
    assert not ring._lent and client._encoded is None
    assert not vector.any()  # given up: zeroed with the loan
    assert not any(np.shares_memory(spare, vector) for spare in ring._spare)
    client.set_input(net.inputs["p00"])  # the job goes on with a valid input


def test_mutation_encoding_in_place_tile_by_tile_would_corrupt_the_refused_vector() -> None:
    """Why ``encode_into`` ignores ``scratch`` for a vector encoded in its own memory:
    the kernel's one-pass mode encodes each tile before checking the next, so an entry
    out of bound late in the vector leaves the earlier ones overwritten."""
    kernel = native.KERNEL
    if kernel is None:
        pytest.skip("the native kernel is not built here")
    vector = np.full(6000, -0.5)
    vector[-1] = 7.0
    before = vector.copy()
    assert not kernel.encode(vector.view(ring.RING_DTYPE), vector, 2.0**20, 1.0, True)
    assert not np.array_equal(vector, before)  # the weakened rule loses the vector
    vector = before.copy()
    with pytest.raises(EncodingOverflow):
        encode_into(vector.view(ring.RING_DTYPE), vector, scale_bits=20, bound=1.0, scratch=True)
    assert np.array_equal(vector, before)  # the rule: checked whole, nothing written


@pytest.mark.parametrize(
    "make",
    [
        lambda v: v.astype(np.float32),  # another dtype
        lambda v: np.repeat(v, 2)[::2],  # strided
        lambda v: np.frombuffer(v.tobytes(), dtype=np.float64),  # read-only
        lambda v: list(v),  # not an array
    ],
    ids=["float32", "strided", "read-only", "list"],
)
def test_a_vector_that_cannot_host_the_encoding_is_copied(make: object) -> None:
    net = _shared(Net(3, length=800))
    client = net.clients["p02"]
    vector = make(net.inputs["p02"])  # type: ignore[operator]
    before = np.array(vector, dtype=np.float64, copy=True)
    client.set_input(vector, donate=True)
    assert client._encoded is not None
    assert not np.shares_memory(client._encoded, np.asarray(vector))
    assert np.array_equal(np.asarray(vector, dtype=np.float64), before)  # untouched
    expected = encode(before, scale_bits=net.spec.scale_bits, bound=1.0)
    assert np.array_equal(client._encoded, expected)


def test_a_32_bit_job_copies_a_donated_vector() -> None:
    client = advertised_client(900, ring_bits=32)
    vector = np.random.default_rng(3).uniform(-1.0, 1.0, 900)
    before = vector.copy()
    client.set_input(vector, donate=True)
    assert client._encoded is not None and client._encoded.dtype == np.uint32
    assert not np.shares_memory(client._encoded, vector)
    assert np.array_equal(vector, before)
    expected = encode(before, scale_bits=client.spec.scale_bits, bound=1.0, ring_bits=32)
    assert np.array_equal(client._encoded, expected)


def test_a_prepared_buffer_is_used_before_a_donated_vector() -> None:
    """The prepared loan is resident already: it hosts the encoding, the vector is
    left alone."""
    net = _shared(Net(3, length=700))
    client = net.clients["p01"]
    client.prepare_input()
    prepared = client._loan
    vector = net.inputs["p01"].copy()
    client.set_input(vector, donate=True)
    assert client._encoded is prepared
    assert np.array_equal(vector, net.inputs["p01"])
    assert len(ring._lent) == 1


def test_a_donated_vector_of_the_wrong_length_is_refused_and_not_lent() -> None:
    net = _shared(Net(3, length=700))
    client = net.clients["p01"]
    vector = np.zeros(701)
    with pytest.raises(WrongLength):
        client.set_input(vector, donate=True)
    assert not ring._lent and client._encoded is None
    client.set_input(net.inputs["p01"], donate=True)  # refused, not failed: goes on


def test_adopt_lends_the_vector_and_give_back_zeroes_it_and_keeps_nothing() -> None:
    """A donated vector's memory is zeroed when its loan ends and never becomes a spare:
    its donor may still hold a reference, and a spare is lent to the next borrower.
    Mutation: kept as a spare, the next ``borrow`` would hand the donor's memory to
    another job."""
    vector = np.linspace(-1.0, 1.0, 512)
    words = adopt(vector)
    assert words is not None and words.dtype == ring.RING_DTYPE and words.shape == (512,)
    assert np.shares_memory(words, vector) and len(ring._lent) == 1
    give_back(words)
    assert not ring._lent and not ring._adopted and not vector.any()
    assert not ring._spare
    again = borrow(512)  # new memory, not the donor's
    assert not np.shares_memory(again, vector)
    with pytest.raises(ValueError, match="not on loan"):
        give_back(vector.view(ring.RING_DTYPE))


def test_adopt_refuses_what_cannot_host_the_words() -> None:
    frozen = np.zeros(8)
    frozen.flags.writeable = False
    cases: list[Any] = [
        np.zeros(8, dtype=np.float32),
        np.zeros(16)[::2],
        np.zeros((2, 4)),
        frozen,
        np.zeros(8, dtype=">f8"),
    ]
    for bad in cases:
        assert adopt(bad) is None
    assert not ring._lent


def test_a_dropped_donor_takes_its_loan_with_it() -> None:
    net = _shared(Net(3, length=400))
    client = net.clients["p00"]
    client.set_input(net.inputs["p00"].copy(), donate=True)
    assert len(ring._lent) == 1
    del net, client
    gc.collect()
    assert not ring._lent and not ring._adopted and not ring._spare
