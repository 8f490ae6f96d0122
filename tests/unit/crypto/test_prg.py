from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.crypto import prg
from spherecal.crypto.prg import (
    ENGINES,
    MaskExpander,
    MaskSeed,
    counter_block,
    fastest_engine,
    keystream_rate_gbps,
    keystream_words,
    raw_keystream_seconds,
)

U64, U32 = np.dtype("<u8"), np.dtype("<u4")


def ecb_stream(key: bytes, nonce: bytes, nbytes: int, segment_blocks: int = 1 << 26) -> bytes:
    """The v2 keystream built independently of spherecal.crypto.prg: AES-128 of each
    counter block ``(N + s) mod 2^96 || uint32_be(2 + j)`` in ECB mode."""
    blocks = []
    for b in range(-(-nbytes // 16)):
        s, j = divmod(b, segment_blocks)
        n_s = ((int.from_bytes(nonce, "big") + s) % (1 << 96)).to_bytes(12, "big")
        blocks.append(n_s + (2 + j).to_bytes(4, "big"))
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return (enc.update(b"".join(blocks)) + enc.finalize())[:nbytes]


def reference(seed: MaskSeed, n: int, dtype: np.dtype = U64) -> np.ndarray:
    data = ecb_stream(seed.key, seed.nonce, n * dtype.itemsize)
    return np.frombuffer(data, dtype=dtype).copy()


def fresh_seed() -> MaskSeed:
    return MaskSeed(key=os.urandom(16), nonce=os.urandom(12))


def test_known_answer_against_fixed_bytes() -> None:
    # AES-128 (FIPS-197 key 000102..0f) of the block 00..00 || 00000002: the first
    # keystream block of a mask with that key and an all-zero nonce.
    seed = MaskSeed(key=bytes(range(16)), nonce=bytes(12))
    block = (
        Cipher(algorithms.AES(seed.key), modes.ECB())
        .encryptor()
        .update(bytes(12) + b"\x00\x00\x00\x02")
    )
    for engine in ENGINES:
        words = keystream_words(seed, 0, 2, engine=engine)
        assert words.tobytes() == block


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [U64, U32])
def test_keystream_is_the_v2_counter_stream_read_as_little_endian_words(
    engine: str, dtype: np.dtype
) -> None:
    seed = fresh_seed()
    got = keystream_words(seed, 0, 1000, dtype, engine=engine)
    assert got.dtype == dtype
    assert np.array_equal(got, reference(seed, 1000, dtype))


def test_the_keystream_is_aes_gcm_encryption_of_zeros_and_ctr_from_counter_2() -> None:
    """The reason for the v2 definition: OpenSSL's GCM and CTR paths both produce it."""
    seed = fresh_seed()
    nbytes = 64 << 10
    gcm = Cipher(algorithms.AES(seed.key), modes.GCM(seed.nonce)).encryptor().update(bytes(nbytes))
    ctr_block = seed.nonce + (2).to_bytes(4, "big")
    ctr = Cipher(algorithms.AES(seed.key), modes.CTR(ctr_block)).encryptor().update(bytes(nbytes))
    ours = keystream_words(seed, 0, nbytes // 8).tobytes()
    assert gcm == ctr == ours == ecb_stream(seed.key, seed.nonce, nbytes)


@pytest.mark.parametrize("engine", ENGINES)
def test_segments_take_the_next_nonce(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    # Shrink the segment to 4 blocks so a short vector crosses several of them, with the
    # nonce base at 2^96 - 2 so the nonce addition wraps too.
    monkeypatch.setattr(prg, "SEGMENT_BLOCKS", 4)
    monkeypatch.setattr(prg, "SEGMENT_BYTES", 64)
    seed = MaskSeed(key=os.urandom(16), nonce=b"\xff" * 11 + b"\xfe")
    expected = np.frombuffer(ecb_stream(seed.key, seed.nonce, 8 * 50, 4), dtype=U64)
    assert np.array_equal(keystream_words(seed, 0, 50, engine=engine), expected)
    # Chunked, in order and not, with chunks that straddle segment boundaries.
    expander = MaskExpander(6, engine=engine)
    for start in [0, 6, 12, 18, 36, 30, 6, 42]:
        out = np.zeros(min(6, 50 - start), dtype=U64)
        expander.apply(out, seed, start, +1)
        assert np.array_equal(out, expected[start : start + len(out)])
    assert counter_block(seed.nonce, 5) == b"\xff" * 12 + (3).to_bytes(4, "big")
    # A plan of two masks, tile-major, over chunks that straddle segment boundaries.
    other = MaskSeed(key=os.urandom(16), nonce=os.urandom(12))
    second = np.frombuffer(ecb_stream(other.key, other.nonce, 8 * 50, 4), dtype=U64)
    planner = MaskExpander(10, engine=engine)
    for start in [0, 10, 20, 40, 30, 10]:
        out = np.zeros(min(10, 50 - start), dtype=U64)
        planner.apply_plan(out, [(seed, +1), (other, -1)], start)
        stop = start + len(out)
        assert np.array_equal(out, expected[start:stop] - second[start:stop])


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(1, 300),
    chunk=st.integers(1, 40),
    narrow=st.booleans(),
    engine=st.sampled_from(ENGINES),
    order=st.randoms(use_true_random=False),
)
def test_any_chunk_can_be_produced_without_the_previous_ones(
    total: int, chunk: int, narrow: bool, engine: str, order: object
) -> None:
    dtype = U32 if narrow else U64
    chunk *= 16 // dtype.itemsize  # whole blocks
    seed = fresh_seed()
    full = reference(seed, total, dtype)
    starts = list(range(0, total, chunk))
    order.shuffle(starts)  # type: ignore[attr-defined]
    expander = MaskExpander(chunk, dtype, engine=engine)
    for start in starts:  # random order, plus repeats of the same chunk
        for _ in range(2):
            out = np.zeros(min(chunk, total - start), dtype=dtype)
            expander.apply(out, seed, start, +1)
            assert np.array_equal(out, full[start : start + len(out)])


def test_chunks_larger_than_a_tile_and_sequential_reuse_stay_correct() -> None:
    seed = fresh_seed()
    n = 3 * prg.TILE_BYTES // 8 + 6  # several tiles per chunk, a partial one at the end
    full = reference(seed, 2 * n)
    expander = MaskExpander(n)
    got = []
    for start in (0, n):
        out = np.zeros(n, dtype=U64)
        expander.apply(out, seed, start, +1)
        got.append(out)
    assert np.array_equal(np.concatenate(got), full)


def test_source_saves_the_copy_and_equals_copy_then_add() -> None:
    seed = fresh_seed()
    source = np.arange(40, dtype=U32)
    out = np.zeros(40, dtype=U32)
    MaskExpander(40, U32).apply(out, seed, 0, -1, source=source)
    assert np.array_equal(out, source - reference(seed, 40, U32))
    assert np.array_equal(source, np.arange(40, dtype=U32))  # untouched


@pytest.mark.parametrize("dtype", [U64, U32])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_plan_applied_tile_major_equals_the_sum_of_independent_keystreams(
    dtype: np.dtype, engine: str
) -> None:
    """``apply_plan`` interleaves masks tile by tile (each seed's context continuing
    across tiles and chunks); the result must be the source plus the signed sum of each
    mask built independently (ECB), over chunks of several tiles and a partial tile."""
    per_tile = prg.TILE_BYTES // dtype.itemsize
    chunk = 2 * per_tile + 4 * (16 // dtype.itemsize)  # two whole tiles and a partial one
    total = 2 * chunk + 16 // dtype.itemsize  # a short last chunk
    plan = [(fresh_seed(), sign) for sign in (+1, -1, -1, +1, +1)]
    source = np.random.default_rng(7).integers(0, 1 << 62, total).astype(dtype)
    expected = source.copy()
    for seed, sign in plan:
        expected = expected + dtype.type(sign % (1 << (8 * dtype.itemsize))) * reference(
            seed, total, dtype
        )
    expander = MaskExpander(chunk, dtype, engine=engine)
    got = []
    for start in range(0, total, chunk):
        out = np.zeros(min(chunk, total - start), dtype=dtype)
        expander.apply_plan(out, plan, start, source=source[start : start + chunk])
        got.append(out)
    assert np.array_equal(np.concatenate(got), expected)
    # an empty plan copies the source; a bad sign is refused before anything is written
    out = np.zeros(8, dtype=dtype)
    expander.apply_plan(out, [], 0, source=source[:8])
    assert np.array_equal(out, source[:8])
    with pytest.raises(ValueError, match="sign"):
        expander.apply_plan(out, [(plan[0][0], 1), (plan[1][0], 0)], 0)
    assert np.array_equal(out, source[:8])


def test_add_then_subtract_cancels_and_wraps() -> None:
    seed = fresh_seed()
    for dtype in (U64, U32):
        target: Any = np.arange(12, dtype=dtype)
        expander = MaskExpander(12, dtype)
        expander.apply(target, seed, 0, +1)
        assert not np.array_equal(target, np.arange(12, dtype=dtype))
        expander.apply(target, seed, 0, -1)
        assert np.array_equal(target, np.arange(12, dtype=dtype))


def test_misuse_is_rejected() -> None:
    expander = MaskExpander(4)
    seed = fresh_seed()
    with pytest.raises(ValueError, match="block boundary"):
        expander.apply(np.zeros(2, dtype=U64), seed, 1, +1)
    with pytest.raises(ValueError, match="block boundary"):
        MaskExpander(8, U32).apply(np.zeros(4, dtype=U32), seed, 2, +1)
    with pytest.raises(ValueError, match="exceeds"):
        expander.apply(np.zeros(6, dtype=U64), seed, 0, +1)
    with pytest.raises(ValueError, match="sign"):
        expander.apply(np.zeros(2, dtype=U64), seed, 0, 2)
    with pytest.raises(ValueError, match="dtype"):
        expander.apply(np.zeros(2, dtype=U32), seed, 0, 1)
    with pytest.raises(ValueError, match="source"):
        expander.apply(np.zeros(2, dtype=U64), seed, 0, 1, source=np.zeros(3, dtype=U64))
    with pytest.raises(ValueError):
        MaskSeed(key=b"short", nonce=bytes(12))
    with pytest.raises(ValueError):
        MaskSeed(key=bytes(16), nonce=bytes(16))  # a v1 counter block is not a v2 nonce
    with pytest.raises(ValueError):
        MaskExpander(0)
    with pytest.raises(ValueError, match="uint32 or uint64"):
        MaskExpander(4, np.int64)
    with pytest.raises(ValueError, match="engine"):
        MaskExpander(4, engine="ecb")


def test_seed_material_split_and_repr_hides_keys() -> None:
    material = bytes(range(32))
    seed = MaskSeed.from_bytes(material)
    assert seed.key == material[:16] and seed.nonce == material[16:28]
    a, b = fresh_seed(), fresh_seed()
    assert not np.array_equal(keystream_words(a, 0, 8), keystream_words(b, 0, 8))
    assert a.key.hex() not in repr(a) and a.nonce.hex() not in repr(a)


def test_engine_choice_and_timers_run() -> None:
    assert fastest_engine() in ENGINES
    for engine in ENGINES:
        assert raw_keystream_seconds((1 << 16) + 48, 1 << 12, engine=engine) > 0
        assert keystream_rate_gbps(engine, total_bytes=1 << 16, passes=1) > 0
    with pytest.raises(ValueError):
        keystream_rate_gbps("ecb")
