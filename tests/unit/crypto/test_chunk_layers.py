"""The per-chunk Python layers around the masking kernel, cut without changing a byte
(issue #24): the kernel's view of a plan is built once per plan, a chunk's counter
blocks are one join, a sender's chunk header is built once per job."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.crypto import MalformedMessage, MaskedChunk, native, prg
from spherecal.crypto.prg import MaskExpander, MaskSeed

U64, U32 = np.dtype("<u8"), np.dtype("<u4")
needs_kernel = pytest.mark.skipif(
    native.KERNEL is None,
    reason="the native masking kernel is not built here (python setup.py build_ext --inplace)",
)


def _seeds(count: int, rng: np.random.Generator) -> list[MaskSeed]:
    return [MaskSeed(key=rng.bytes(16), nonce=rng.bytes(12)) for _ in range(count)]


def _words(seed: MaskSeed, start: int, n: int, dtype: np.dtype) -> np.ndarray:
    """Entries ``[start, start + n)`` of the v2 keystream built independently: AES-ECB of
    each counter block ``nonce || uint32_be(2 + j)`` (one segment)."""
    size = dtype.itemsize
    first, last = start * size // 16, -(-(start + n) * size // 16)
    blocks = b"".join(seed.nonce + (2 + j).to_bytes(4, "big") for j in range(first, last))
    stream = Cipher(algorithms.AES(seed.key), modes.ECB()).encryptor().update(blocks)
    skip = start * size - first * 16
    return np.frombuffer(stream[skip : skip + n * size], dtype=dtype)


def _expected(source: np.ndarray, plan: list[tuple[MaskSeed, int]], start: int) -> bytes:
    out = source.copy()
    for seed, sign in plan:
        words = _words(seed, start, source.shape[0], source.dtype)
        out = out + words if sign > 0 else out - words
    return out.tobytes()


@needs_kernel
@pytest.mark.parametrize("dtype", [U64, U32])
def test_a_plan_changed_in_place_is_seen_by_the_next_chunk(dtype: np.dtype) -> None:
    """Mutation check of the cache key: the participant's plan is one list; were the
    kernel's view keyed by that list's identity, a changed plan would mask with the old
    keys. Every chunk matches the independent computation of the plan it was given."""
    rng = np.random.default_rng(7)
    plan = [(seed, sign) for seed, sign in zip(_seeds(4, rng), (1, -1, 1, -1), strict=True)]
    expander = MaskExpander(256, dtype)
    source = rng.integers(0, 1 << 32, 256, dtype=np.uint64).astype(dtype)
    for start in (0, 256, 512):
        got = expander.masked_bytes(b"hdr", plan, start, source)
        assert got == b"hdr" + _expected(source, plan, start)
    plan[1] = (plan[1][0], 1)  # a sign flipped in place
    assert expander.masked_bytes(b"", plan, 768, source) == _expected(source, plan, 768)
    plan[2] = (_seeds(1, rng)[0], 1)  # a seed replaced in place
    assert expander.masked_bytes(b"", plan, 768, source) == _expected(source, plan, 768)
    plan.append((_seeds(1, rng)[0], -1))  # one more mask
    target = source.copy()
    expander.apply_plan(target, plan, 1024)
    assert target.tobytes() == _expected(source, plan, 1024)
    with pytest.raises(ValueError, match="sign"):
        expander.masked_bytes(b"", [(plan[0][0], 2)], 0, source)
    expander.clear()  # the keys go with the contexts
    assert expander._kernel_plan is None


@settings(max_examples=60, deadline=None)
@given(
    masks=st.integers(0, 6),
    block=st.one_of(
        st.integers(0, 1 << 20),
        st.integers(prg.SEGMENT_BLOCKS - 4, prg.SEGMENT_BLOCKS + 4),
        st.integers(3 * prg.SEGMENT_BLOCKS - 2, 3 * prg.SEGMENT_BLOCKS + 2),
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_one_join_gives_every_masks_counter_block(masks: int, block: int, seed: int) -> None:
    """``_KernelPlan.counters`` equals one :func:`counter_block` per mask, across segment
    boundaries (the next segment's nonce) and with a nonce about to wrap."""
    rng = np.random.default_rng(seed)
    plan = [(s, 1) for s in _seeds(masks, rng)]
    if plan:
        plan[0] = (MaskSeed(key=rng.bytes(16), nonce=b"\xff" * 12), -1)
    view = prg._KernelPlan(tuple(plan))
    offset = block * prg.BLOCK_BYTES
    expected = b"".join(prg.counter_block(s.nonce, block) for s, _ in plan)
    assert view.counters(offset) == expected == prg._counters(plan, offset)


def test_a_chunks_cached_header_is_its_plain_encoding() -> None:
    """Two senders and two jobs in turn: each chunk's bytes are what the field-by-field
    encoding gives, and what the decoder reads back; bad ids are still refused."""
    payload = bytes(range(64))
    for job_id, sender, index in (
        (b"a" * 16, "site-1", 0),
        (b"a" * 16, "site-2", 0),
        (b"b" * 16, "site-1", 7),
        (b"a" * 16, "site-1", (1 << 32) - 1),
    ):
        chunk = MaskedChunk.framed(job_id, sender, index, 64, lambda p: p + payload)
        plain = MaskedChunk(job_id=job_id, sender=sender, index=index, payload=payload)
        assert chunk.to_bytes() == plain.to_bytes()
        assert MaskedChunk.from_bytes(chunk.to_bytes()) == plain
    with pytest.raises(MalformedMessage):
        MaskedChunk.framed(bytearray(b"a" * 16), "site-1", 0, 64, lambda p: p + payload)  # type: ignore[arg-type]
    with pytest.raises(MalformedMessage):
        MaskedChunk.framed(b"", "site-1", 0, 64, lambda p: p + payload)
    with pytest.raises(MalformedMessage):
        MaskedChunk.framed(b"a" * 16, "", 0, 64, lambda p: p + payload)
