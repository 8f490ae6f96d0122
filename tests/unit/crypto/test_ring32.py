"""The per-job ring width (issue #24): 32-bit updates, 64-bit statistics, spec v2."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.crypto import (
    AggregateOutOfRange,
    EncodingOverflow,
    InvalidSpec,
    MalformedMessage,
    MaskedChunk,
    WrongLength,
)
from spherecal.crypto.ring import (
    choose_ring,
    choose_scale_bits,
    decode,
    encode,
    encode_into,
    max_signed,
    ring_dtype,
    sum_fits,
)
from spherecal.crypto.simulation import run_protocol
from spherecal.crypto.spec import JobSpec

IDS = [f"p{i}" for i in range(5)]


def test_32_bit_encoding_is_twos_complement_mod_2_32() -> None:
    out = encode([-1.5, 0.0, 2.25], scale_bits=2, bound=4.0, ring_bits=32)
    assert out.dtype == np.dtype("<u4")
    assert out.tolist() == [(1 << 32) - 6, 0, 9]
    assert decode(out, scale_bits=2).tolist() == [-1.5, 0.0, 2.25]


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=1, max_size=200),
    f=st.integers(0, 50),
)
def test_fast_rounding_equals_rint_exactly(values: list[float], f: int) -> None:
    """The magic-number rounding of ``encode_into`` against numpy's rint (half to even),
    independently computed in Python integers, for both rings."""
    x = np.array(values)
    expected = [int(v) for v in np.rint(x * 2.0**f)]
    wide = encode(x, scale_bits=f, bound=1.0)
    assert wide.tolist() == [e % (1 << 64) for e in expected]
    if f <= 30:
        narrow = encode(x, scale_bits=f, bound=1.0, ring_bits=32)
        assert narrow.tolist() == [e % (1 << 32) for e in expected]


def test_ties_round_half_to_even_and_large_tiles_are_covered() -> None:
    n = 3 * (1 << 14) + 5  # several encoding tiles and a partial one
    x = np.full(n, 0.5)
    x[1::2] = -1.5
    out = encode(x, scale_bits=0, bound=2.0).view(np.int64)
    assert set(out[::2].tolist()) == {0} and set(out[1::2].tolist()) == {-2}


def test_encode_into_refuses_before_writing() -> None:
    out = np.arange(4, dtype="<u4")
    with pytest.raises(EncodingOverflow, match="1 of 4"):
        encode_into(out, [0.0, 0.0, np.nan, 0.0], scale_bits=3, bound=1.0)
    assert out.tolist() == [0, 1, 2, 3]  # nothing written
    with pytest.raises(WrongLength):
        encode_into(out, [0.0, 1.0], scale_bits=3, bound=1.0)


def test_a_caller_scale_beyond_2_50_still_rounds_exactly() -> None:
    x = np.array([0.75, -0.3, 1.0])
    got = encode(x, scale_bits=60, bound=1.0).view(np.int64).tolist()
    assert got == [int(v) for v in np.rint(x * 2.0**60)]


def test_ring_limits_and_choice() -> None:
    assert max_signed(32) == 2**31 - 1 and max_signed(64) == 2**63 - 1
    assert ring_dtype(32) == np.dtype("<u4")
    with pytest.raises(InvalidSpec):
        ring_dtype(16)
    # n * ceil(B 2^f) <= 2^31 - 1: 10 sites with bound 1e5 allow f = 11 (step 4.9e-4).
    assert choose_scale_bits(10, 1e5, ring_bits=32) == 11
    assert sum_fits(10, 1e5, 11, ring_bits=32) and not sum_fits(10, 1e5, 12, ring_bits=32)
    fine = choose_ring(10, 1e5, resolution=2.0**-10)
    assert (fine.ring_bits, fine.scale_bits, fine.step) == (32, 11, 2.0**-11)
    # Asking for a finer step than 32 bits give: the 64-bit ring at its finest scale.
    assert choose_ring(10, 1e5, resolution=2.0**-12).ring_bits == 64
    assert choose_ring(100, 1e5, resolution=2.0**-10).ring_bits == 64
    assert choose_ring(10, 1e5, resolution=None) == choose_ring(10, 1e5, resolution=0.5e-30)
    assert choose_ring(10, 1e5, resolution=None).scale_bits == choose_scale_bits(10, 1e5)
    # A bound that does not fit 32 bits at all still gets 64.
    assert choose_ring(1000, 1e7, resolution=1e6).ring_bits == 64
    with pytest.raises(InvalidSpec, match="resolution"):
        choose_ring(10, 1.0, resolution=0.0)


def test_the_stated_precision_holds_for_a_32_bit_sum() -> None:
    """Every decoded sum is within n · step / 2 of the exact sum of the inputs."""
    rng = np.random.default_rng(5)
    n, bound = 12, 300.0
    choice = choose_ring(n, bound, resolution=2.0**-8)
    assert choice.ring_bits == 32
    xs = rng.uniform(-bound, bound, (n, 5000))
    total = np.zeros(5000, dtype="<u4")
    for x in xs:
        total += encode(x, scale_bits=choice.scale_bits, bound=bound, ring_bits=32)
    err = np.abs(decode(total, scale_bits=choice.scale_bits) - xs.sum(axis=0))
    assert float(err.max()) <= n * choice.step / 2


def test_spec_v2_carries_the_ring_and_refuses_what_cannot_work() -> None:
    spec = JobSpec.create(IDS, threshold=3, length=10, bound=1e5, resolution=2.0**-10, chunk_size=6)
    assert spec.ring_bits == 32 and spec.dtype == np.dtype("<u4") and spec.entry_bytes == 4
    assert spec.chunk_size == 8  # rounded up to whole AES blocks of 4 entries
    assert JobSpec.from_bytes(spec.to_bytes()) == spec
    assert JobSpec.create(IDS, threshold=3, length=10, bound=1.0).ring_bits == 64
    with pytest.raises(InvalidSpec, match="multiple of 4"):
        JobSpec.create(IDS, threshold=3, length=10, bound=1.0, ring_bits=32, chunk_size=6)
    with pytest.raises(InvalidSpec, match="32-bit ring"):
        JobSpec.create(IDS, threshold=3, length=10, bound=1e5, ring_bits=32, scale_bits=13)
    with pytest.raises(InvalidSpec, match="ring_bits"):
        JobSpec.create(IDS, threshold=3, length=10, bound=1.0, ring_bits=16, scale_bits=3)
    # The ring is part of the signed bytes: two specs that differ only in it differ.
    wide = JobSpec.create(
        IDS, threshold=3, length=10, bound=1e5, scale_bits=11, job_id=spec.job_id, chunk_size=8
    )
    assert wide.ring_bits == 64 and wide.digest != spec.digest


def test_retired_spec_versions_are_refused_by_name() -> None:
    data = bytearray(JobSpec.create(IDS, threshold=3, length=10, bound=1.0).to_bytes())
    data[4] = 1
    with pytest.raises(MalformedMessage, match="version 1 .*no longer supported"):
        JobSpec.from_bytes(bytes(data))
    data[4] = 2
    with pytest.raises(MalformedMessage, match="version 2 .*not bound to the task"):
        JobSpec.from_bytes(bytes(data))
    data[4] = 9
    with pytest.raises(MalformedMessage, match="v3"):
        JobSpec.from_bytes(bytes(data))


def test_the_task_context_is_part_of_the_signed_bytes() -> None:
    """Two specs that differ only in the task they serve have different digests (so
    their members derive unrelated keys and reject each other's signatures); the
    context round-trips and has one length."""
    plain = JobSpec.create(IDS, threshold=3, length=10, bound=1.0)
    bound = JobSpec.create(
        IDS, threshold=3, length=10, bound=1.0, job_id=plain.job_id, context=b"\x01" * 32
    )
    other = JobSpec.create(
        IDS, threshold=3, length=10, bound=1.0, job_id=plain.job_id, context=b"\x02" * 32
    )
    assert len({plain.digest, bound.digest, other.digest}) == 3
    assert JobSpec.from_bytes(bound.to_bytes()) == bound
    assert JobSpec.from_bytes(bound.to_bytes()).digest == bound.digest
    for wrong in (b"\x01" * 31, b"\x01" * 33):
        with pytest.raises(InvalidSpec, match="context must be empty or 32 bytes"):
            JobSpec.create(IDS, threshold=3, length=10, bound=1.0, context=wrong)
    longer = bytearray(bound.to_bytes())
    longer[-36:-32] = (33).to_bytes(4, "big")  # a 33-byte context: refused by the reader
    with pytest.raises(MalformedMessage):
        JobSpec.from_bytes(bytes(longer) + b"\x00")


@pytest.mark.parametrize("graph", ["complete", "harary"])
def test_a_32_bit_job_sums_exactly_with_dropouts(graph: str) -> None:
    ids = [f"p{i:02d}" for i in range(9)]
    rng = np.random.default_rng(1)
    inputs = {p: rng.uniform(-50.0, 50.0, 1003) for p in ids}
    spec = JobSpec.create(
        ids, threshold=5, length=1003, bound=50.0, resolution=2.0**-10, chunk_size=100, graph=graph
    )
    assert spec.ring_bits == 32
    report = run_protocol(spec, inputs, drop={"p03": "masked"}, rng=random.Random(0))
    result = report.result
    assert result.ring_sum.dtype == np.dtype("<u4")
    # Exactness against an independent computation: the ring sum of the survivors'
    # encodings, decoded.
    survivors = [p for p in ids if p != "p03"]
    expected = np.zeros(1003, dtype="<u4")
    for p in survivors:
        expected += encode(inputs[p], scale_bits=spec.scale_bits, bound=50.0, ring_bits=32)
    assert np.array_equal(result.ring_sum, expected)
    exact = np.sum([inputs[p] for p in survivors], axis=0)
    assert float(np.max(np.abs(result.values - exact))) <= len(survivors) * 2.0**-spec.scale_bits
    # Half the bytes of a 64-bit upload, plus framing.
    uploader = next(iter(report.mask_seconds))
    assert report.upload_bytes[uploader] < 4.5 * 1003 + 8000


def test_a_32_bit_server_refuses_a_64_bit_chunk_and_an_out_of_range_sum() -> None:
    from spherecal.crypto import identity_public_bytes
    from spherecal.crypto.keys import generate_identity
    from spherecal.crypto.server import SecAggServer
    from spherecal.crypto.staging import StagedSum

    spec = JobSpec.create(IDS, threshold=3, length=8, bound=1.0, ring_bits=32, chunk_size=4)
    staged = StagedSum(spec, max_in_flight=1)
    with pytest.raises(WrongLength, match="16 bytes"):
        staged.add_chunk("p0", 0, bytes(32))
    staged.add_chunk("p0", 0, np.arange(4, dtype="<u4").tobytes())
    staged.add_chunk("p0", 1, np.arange(4, dtype="<u4").tobytes())
    assert staged.total.dtype == np.dtype("<u4") and staged.total.tolist() == [0, 1, 2, 3] * 2
    # The range check works in the 32-bit ring too: a sum beyond ±inputs·B·2^f is refused.
    from spherecal.crypto.unmask import aggregate_out_of_range

    far = np.full(8, 1 << 30, dtype="<u4")
    assert isinstance(aggregate_out_of_range(spec, far, inputs=3), AggregateOutOfRange)
    near = encode(np.full(8, 0.5), scale_bits=spec.scale_bits, bound=1.0, ring_bits=32)
    assert aggregate_out_of_range(spec, near, inputs=3) is None
    keys = {p: generate_identity() for p in IDS}
    SecAggServer(spec, {p: identity_public_bytes(k) for p, k in keys.items()})
    assert MaskedChunk(job_id=spec.job_id, sender="p0", index=0, payload=bytes(16)).payload


def test_the_magic_rounding_would_be_wrong_beyond_its_range() -> None:
    """Mutation check of the 2^50 guard: the raw magic trick is off by one past 2^52."""
    y = np.array([2.0**52 + 1.0])
    raw = (y + 1.5 * 2**52).view(np.int64) - np.float64(1.5 * 2**52).view(np.int64)
    assert int(raw[0]) != 2**52 + 1
    assert math.isclose(
        float(decode(encode(y / 2**52, scale_bits=52, bound=2.0), scale_bits=52)[0]),
        1.0 + 2.0**-52,
        rel_tol=0,
        abs_tol=0,
    )
