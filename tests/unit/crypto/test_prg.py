from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.crypto.prg import (
    MaskExpander,
    MaskSeed,
    counter_block,
    keystream_words,
    raw_keystream_seconds,
)
from spherecal.crypto.ring import RING_DTYPE


def reference_stream(seed: MaskSeed, n_entries: int) -> np.ndarray:
    """AES-128-CTR keystream from block 0, computed independently of spherecal.crypto.prg."""
    enc = Cipher(algorithms.AES(seed.key), modes.CTR(seed.iv)).encryptor()
    data = enc.update(bytes(8 * n_entries))
    return np.frombuffer(data, dtype=RING_DTYPE).copy()


def fresh_seed() -> MaskSeed:
    return MaskSeed(key=os.urandom(16), iv=os.urandom(16))


def test_keystream_is_aes_ctr_read_as_little_endian_uint64() -> None:
    seed = fresh_seed()
    assert np.array_equal(keystream_words(seed, 0, 37), reference_stream(seed, 37))


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(1, 300),
    chunk=st.integers(1, 40).map(lambda c: 2 * c),
    order=st.randoms(use_true_random=False),
)
def test_any_chunk_can_be_produced_without_the_previous_ones(
    total: int, chunk: int, order: object
) -> None:
    seed = fresh_seed()
    full = reference_stream(seed, total)
    starts = list(range(0, total, chunk))
    order.shuffle(starts)  # type: ignore[attr-defined]
    expander = MaskExpander(chunk)
    for start in starts:  # random order, plus repeats of the same chunk
        for _ in range(2):
            out = np.zeros(min(chunk, total - start), dtype=RING_DTYPE)
            expander.apply(out, seed, start, +1)
            assert np.array_equal(out, full[start : start + len(out)])


def test_sequential_chunks_reuse_the_cipher_context_and_stay_correct() -> None:
    seed = fresh_seed()
    full = reference_stream(seed, 64)
    expander = MaskExpander(8)
    got = []
    for start in range(0, 64, 8):
        out = np.zeros(8, dtype=RING_DTYPE)
        expander.apply(out, seed, start, +1)
        got.append(out)
    assert np.array_equal(np.concatenate(got), full)


def test_counter_wraps_at_2_to_128_like_openssl() -> None:
    seed = MaskSeed(key=os.urandom(16), iv=b"\xff" * 16)
    assert counter_block(seed.iv, 1) == bytes(16)
    full = reference_stream(seed, 6)  # crosses the wrap after the first block
    assert np.array_equal(keystream_words(seed, 2, 4), full[2:])


def test_add_then_subtract_cancels_and_wraps() -> None:
    seed = fresh_seed()
    target = np.arange(10, dtype=RING_DTYPE)
    expander = MaskExpander(10)
    expander.apply(target, seed, 0, +1)
    assert not np.array_equal(target, np.arange(10, dtype=RING_DTYPE))
    expander.apply(target, seed, 0, -1)
    assert np.array_equal(target, np.arange(10, dtype=RING_DTYPE))


def test_misuse_is_rejected() -> None:
    expander = MaskExpander(4)
    seed = fresh_seed()
    with pytest.raises(ValueError, match="block boundary"):
        expander.apply(np.zeros(2, dtype=RING_DTYPE), seed, 1, +1)
    with pytest.raises(ValueError, match="exceeds"):
        expander.apply(np.zeros(6, dtype=RING_DTYPE), seed, 0, +1)
    with pytest.raises(ValueError, match="sign"):
        expander.apply(np.zeros(2, dtype=RING_DTYPE), seed, 0, 2)
    with pytest.raises(ValueError):
        MaskSeed(key=b"short", iv=bytes(16))
    with pytest.raises(ValueError):
        MaskExpander(0)


def test_distinct_seeds_give_unrelated_streams_and_repr_hides_keys() -> None:
    a, b = fresh_seed(), fresh_seed()
    assert not np.array_equal(keystream_words(a, 0, 8), keystream_words(b, 0, 8))
    assert a.key.hex() not in repr(a) and a.iv.hex() not in repr(a)


def test_raw_keystream_timer_runs() -> None:
    assert raw_keystream_seconds((1 << 16) + 48, 1 << 12) > 0
