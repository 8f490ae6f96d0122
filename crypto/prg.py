"""Mask expansion: AES-128-CTR keystream added into ``uint64`` vectors in place.

Why AES-CTR: Bonawitz et al. 2017 instantiate the PRG with AES in counter mode in
their implementation, because commodity CPUs run it in hardware; the ``cryptography`` wheel uses
OpenSSL's AES-NI/VAES code, which on this class of machine produces keystream at
several GB/s — the same order as memory bandwidth. Everything here is arranged so
that the Python layer adds no per-element work:

* ``update_into`` writes keystream into one *preallocated* buffer (no per-call
  allocation), encrypting a preallocated zero buffer;
* the buffer is viewed as little-endian ``uint64`` with ``np.frombuffer`` (no copy)
  and added to / subtracted from the target with ``np.add(..., out=...)``;
* a chunk-sized buffer stays cache-resident, so the add pass costs little next to AES.

Streaming needs chunk ``i`` of a mask without chunks ``0..i-1``: CTR mode makes the
keystream seekable. Entry ``e`` of a mask lives in 16-byte block ``e // 2``, so a
chunk starting at (even) entry ``e`` starts with counter ``iv + e/2 mod 2^128``. An
encryptor is cached per seed and reused while chunks are requested in order, because
creating a cipher context costs about as much as 16 KiB of keystream.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from spherecal.crypto.ring import RING_DTYPE

BLOCK_BYTES = 16
ENTRY_BYTES = RING_DTYPE.itemsize
ENTRIES_PER_BLOCK = BLOCK_BYTES // ENTRY_BYTES

__all__ = [
    "BLOCK_BYTES",
    "MaskExpander",
    "MaskSeed",
    "counter_block",
    "keystream_words",
    "raw_keystream_seconds",
]


@dataclass(frozen=True)
class MaskSeed:
    """AES-128 key and initial counter block of one mask. Never printed."""

    key: bytes = field(repr=False)
    iv: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) != 16 or len(self.iv) != BLOCK_BYTES:
            raise ValueError("a mask seed is a 16-byte AES-128 key and a 16-byte counter block")

    @classmethod
    def from_bytes(cls, material: bytes) -> MaskSeed:
        """Split 32 bytes of KDF output into key and counter block."""
        if len(material) != 32:
            raise ValueError("mask seed material must be 32 bytes")
        return cls(key=material[:16], iv=material[16:])


def counter_block(iv: bytes, block_index: int) -> bytes:
    """The CTR counter block for 16-byte block ``block_index`` (128-bit big-endian add,
    as OpenSSL increments it)."""
    value = (int.from_bytes(iv, "big") + block_index) % (1 << 128)
    return value.to_bytes(BLOCK_BYTES, "big")


def _encryptor(seed: MaskSeed, block_index: int) -> CipherContext:
    cipher = Cipher(algorithms.AES(seed.key), modes.CTR(counter_block(seed.iv, block_index)))
    return cipher.encryptor()


class MaskExpander:
    """Adds ``±PRG(seed)[start:start+n]`` into ``uint64`` targets, in place.

    Owns a zero buffer and a keystream buffer sized for ``max_entries`` entries (one
    chunk). Not thread-safe: use one expander per thread.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries <= 0:
            raise ValueError("max_entries must be positive")
        self.max_entries = max_entries
        nbytes = max_entries * ENTRY_BYTES
        self._zeros = memoryview(bytearray(nbytes))
        # update_into needs len(data) + block_size - 1 bytes of room.
        self._buf = bytearray(nbytes + BLOCK_BYTES - 1)
        self._words = np.frombuffer(self._buf, dtype=RING_DTYPE, count=max_entries)
        self._streams: dict[MaskSeed, tuple[CipherContext, int]] = {}

    def apply(
        self, target: npt.NDArray[np.uint64], seed: MaskSeed, start_entry: int, sign: int
    ) -> None:
        """``target += sign * PRG(seed)[start_entry : start_entry + len(target)]``."""
        n = int(target.shape[0])
        if n > self.max_entries:
            raise ValueError(f"target of {n} entries exceeds the expander's {self.max_entries}")
        if start_entry % ENTRIES_PER_BLOCK:
            raise ValueError("mask chunks must start on a 16-byte block boundary")
        if sign not in (1, -1):
            raise ValueError("sign must be +1 or -1")
        block = start_entry // ENTRIES_PER_BLOCK
        cached = self._streams.pop(seed, None)
        reuse = cached is not None and cached[1] == block
        enc = cached[0] if cached is not None and reuse else _encryptor(seed, block)
        nbytes = n * ENTRY_BYTES
        enc.update_into(self._zeros[:nbytes], self._buf)
        if nbytes % BLOCK_BYTES == 0:
            # Keep the context: the next in-order chunk continues at the next block.
            self._streams[seed] = (enc, block + nbytes // BLOCK_BYTES)
        words = self._words[:n]
        if sign > 0:
            np.add(target, words, out=target)
        else:
            np.subtract(target, words, out=target)

    def forget(self, seed: MaskSeed) -> None:
        """Drop the cached cipher context of ``seed``."""
        self._streams.pop(seed, None)

    def clear(self) -> None:
        """Drop every cached cipher context (and with it the expanded keys)."""
        self._streams.clear()


def keystream_words(seed: MaskSeed, start_entry: int, n: int) -> npt.NDArray[np.uint64]:
    """``PRG(seed)[start_entry : start_entry + n]`` as a fresh array (tests, tools)."""
    out = np.zeros(n, dtype=RING_DTYPE)
    MaskExpander(max(n, 1)).apply(out, seed, start_entry, +1)
    return out


def raw_keystream_seconds(total_bytes: int, buffer_bytes: int = 1 << 20) -> float:
    """Wall time to produce ``total_bytes`` of AES-128-CTR keystream with
    ``update_into`` into one preallocated buffer and nothing else.

    This is the yardstick for "near raw AES-CTR speed" in ``bench/secagg.py``.
    """
    zeros = bytearray(buffer_bytes)
    buf = bytearray(buffer_bytes + BLOCK_BYTES - 1)
    enc = _encryptor(MaskSeed(key=bytes(range(16)), iv=bytes(16)), 0)
    full, rest = divmod(total_bytes, buffer_bytes)
    tail = memoryview(zeros)[: rest - rest % BLOCK_BYTES]
    start = time.perf_counter()
    for _ in range(full):
        enc.update_into(zeros, buf)
    if len(tail):
        enc.update_into(tail, buf)
    return time.perf_counter() - start
