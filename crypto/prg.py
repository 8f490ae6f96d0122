"""Mask expansion (keystream v2): AES-128 with a 96-bit nonce and a 32-bit block counter.

**The keystream.** A mask seed is an AES-128 key ``K`` and a 96-bit nonce base ``N``.
The mask's byte stream is cut into *segments* of :data:`SEGMENT_BYTES` (2^30 bytes,
2^26 blocks); segment ``s`` uses the nonce ``N_s = (N + s) mod 2^96`` and its block ``j``
is ``AES_K(N_s || uint32_be(2 + j))``. Read as little-endian words of the job's ring
(``uint32`` or ``uint64``), those bytes are the mask ``PRG(seed)``.

Why this definition (issue #24): it is *bit for bit* the keystream of two OpenSSL paths,

* AES-GCM encryption of zeros under ``(K, N_s)`` (GCM's first keystream block is the
  counter ``N_s || 2``; counter 1 only masks the tag), and
* AES-CTR from the counter block ``N_s || uint32_be(2 + j)`` — OpenSSL increments the
  whole 128-bit block, which equals GCM's 32-bit increment while ``2 + j < 2^32``, and a
  segment's 2^26 blocks never carry into the nonce.

Which of the two is faster depends on the processor: OpenSSL's stitched AES-GCM runs on
VAES with AVX-512 at about twice its AES-CTR rate, while on processors without AVX-512
its CTR path is the faster one (the 2-core box this project is measured on today: CTR
about 8 GB/s, GCM about 4 GB/s). :func:`fastest_engine` measures both once per process
and :class:`MaskExpander` uses the faster one; the output never depends on the choice.
Seeking (a chunk whose start is not a segment start, e.g. a resumed upload or an
out-of-order chunk) always goes through CTR with the computed counter block: GCM can only
start at counter 2.

The v1 keystream (AES-CTR with a random 128-bit initial counter block) was not a GCM
keystream; jobs of spec version 1 are refused (:mod:`spherecal.crypto.spec`).

Everything is arranged so that the Python layer adds no per-element work:

* ``update_into`` writes keystream into one preallocated tile buffer, encrypting a
  preallocated zero buffer; the tile stays in L2 next to its target, and
  :meth:`MaskExpander.apply_plan` applies every mask of a participant to one target tile
  before moving to the next (the target is read from memory once, not once per mask);
* the tile is viewed as the ring's dtype with ``np.frombuffer`` (no copy) and added to /
  subtracted from the target with ``np.add(..., out=...)``;
* a cipher context is cached per seed and reused while chunks are requested in order,
  because creating one costs about as much as 16 KiB of keystream.

**The native kernel.** Even so each mask costs one OpenSSL call writing a tile and one
numpy add reading it back, and the add alone is about a quarter of the keystream's time
(measured: the numpy path tops out near 0.79 of the bare keystream rate). Where the
optional C extension ``spherecal.crypto._maskkernel`` is built (``setup.py``),
:class:`MaskExpander` hands the whole chunk to it instead. It is given each seed's AES key
and the counter block of the chunk's first byte (:func:`counter_block`), so its output is
the same keystream, and a call never crosses a segment. Its default engine on a CPU with
AES-NI is an AES-128-CTR of its own (``crypto/_aesctr.c``): on VAES (256-bit registers)
or AES-NI, each AES state is *added* into the target's ring words straight from the
register, two masks at a time, so masking runs at the rate of the bare keystream (on the
development machine about twice OpenSSL's AES-CTR rate: OpenSSL 3's CTR there runs on
128-bit registers). Elsewhere it runs OpenSSL's EVP AES-128-CTR into L1-resident buffers
and adds those. Which engine runs never changes a byte (:mod:`spherecal.crypto.native`;
known-answer tests against the ``cryptography`` package's AES-CTR for every engine).

With the kernel's own AES loaded, the expander takes it whatever :func:`fastest_engine`
says of OpenSSL's two paths (it is faster than either); with the kernel on OpenSSL, it
runs where CTR is OpenSSL's faster path, and the numpy path with GCM otherwise. An
expander given ``engine="gcm"`` explicitly runs the numpy GCM path. The numpy path stays
and gives the same bytes (tested side by side); it is used when the extension is absent
or fails to load, when ``SPHERECAL_NATIVE_MASKING=0`` is set, or with ``native=False``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from spherecal.crypto import native as native_module

BLOCK_BYTES = 16
NONCE_BYTES = 12
FIRST_COUNTER = 2
"""GCM's first keystream counter (counter 1 encrypts the tag)."""
SEGMENT_BLOCKS = 1 << 26
SEGMENT_BYTES = SEGMENT_BLOCKS * BLOCK_BYTES
"""One nonce per 2^30 bytes: far below GCM's 2^32 − 2 block limit per nonce."""
KEYSTREAM_VERSION = 2
ENGINES = ("ctr", "gcm")
TILE_BYTES = 1 << 17
"""Keystream produced per ``update_into`` call. The tile, the zero buffer it encrypts and
the target tile it is added into (3 × 128 KiB) fit a 512 KiB per-core L2; at 256 KiB they
spilled to L3 on the 2-core development machine (AMD EPYC, 512 KiB L2 per core)."""
RATE_BUFFER_BYTES = 1 << 18
"""Buffer of the bare-keystream yardstick (:func:`raw_keystream_seconds`): OpenSSL's rate
peaks at 64–256 KiB per call, so the yardstick is kept at its best, not at the tile size."""

__all__ = [
    "BLOCK_BYTES",
    "ENGINES",
    "KEYSTREAM_VERSION",
    "SEGMENT_BYTES",
    "MaskExpander",
    "MaskSeed",
    "RATE_BUFFER_BYTES",
    "counter_block",
    "fastest_engine",
    "kernel_keystream_seconds",
    "keystream_bytes",
    "keystream_rate_gbps",
    "keystream_words",
    "native_kernel_available",
    "raw_keystream_seconds",
    "segment_nonce",
]


@dataclass(frozen=True)
class MaskSeed:
    """AES-128 key and 96-bit nonce base of one mask. Never printed."""

    key: bytes = field(repr=False)
    nonce: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) != 16 or len(self.nonce) != NONCE_BYTES:
            raise ValueError("a mask seed is a 16-byte AES-128 key and a 12-byte nonce")

    @classmethod
    def from_bytes(cls, material: bytes) -> MaskSeed:
        """Split 32 bytes of KDF output: key = bytes 0..15, nonce base = bytes 16..27
        (bytes 28..31 are unused)."""
        if len(material) != 32:
            raise ValueError("mask seed material must be 32 bytes")
        return cls(key=material[:16], nonce=material[16 : 16 + NONCE_BYTES])


def segment_nonce(nonce: bytes, segment: int) -> bytes:
    """``N_s = (N + s) mod 2^96``, big-endian."""
    value = (int.from_bytes(nonce, "big") + segment) % (1 << 96)
    return value.to_bytes(NONCE_BYTES, "big")


def counter_block(nonce: bytes, block_index: int) -> bytes:
    """The AES input of keystream block ``block_index`` (counted from the mask's first
    byte): ``N_s || uint32_be(2 + j)`` with ``s, j = divmod(block_index, 2^26)``."""
    segment, j = divmod(block_index, SEGMENT_BLOCKS)
    return segment_nonce(nonce, segment) + (FIRST_COUNTER + j).to_bytes(4, "big")


def _context(seed: MaskSeed, block_index: int, engine: str) -> CipherContext:
    segment, j = divmod(block_index, SEGMENT_BLOCKS)
    if engine == "gcm" and j == 0:
        # The encryptor is never finalised: only its keystream is used, never a tag.
        gcm = Cipher(algorithms.AES(seed.key), modes.GCM(segment_nonce(seed.nonce, segment)))
        return gcm.encryptor()
    ctr = Cipher(algorithms.AES(seed.key), modes.CTR(counter_block(seed.nonce, block_index)))
    return ctr.encryptor()


def native_kernel_available() -> bool:
    """Whether the native masking kernel is loaded (and not switched off by
    ``SPHERECAL_NATIVE_MASKING=0``)."""
    return native_module.available()


def keystream_rate_gbps(engine: str, total_bytes: int = 32 << 20, passes: int = 3) -> float:
    """Best-of-``passes`` keystream rate of ``engine`` in GB/s (1e9 bytes): ``update_into``
    of :data:`RATE_BUFFER_BYTES` into one preallocated buffer and nothing else."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}")
    best = min(
        raw_keystream_seconds(total_bytes, RATE_BUFFER_BYTES, engine=engine) for _ in range(passes)
    )
    return total_bytes / best / 1e9


@functools.lru_cache(maxsize=1)
def fastest_engine() -> str:
    """The faster of OpenSSL's AES-CTR and AES-GCM keystream paths on this processor,
    measured once per process (about 10 ms). Both give the same bytes."""
    rates = {e: keystream_rate_gbps(e, total_bytes=4 << 20, passes=2) for e in ENGINES}
    return max(ENGINES, key=lambda e: rates[e])


class MaskExpander:
    """Adds ``±PRG(seed)[start:start+n]`` into ring-word targets, in place.

    Owns a zero buffer and a keystream tile of :data:`TILE_BYTES` (or less for short
    vectors). ``dtype`` is the ring's word (``<u4`` or ``<u8``); ``engine`` ``None``
    picks :func:`fastest_engine`. ``native`` ``None`` uses the native kernel where it is
    loaded and the engine is CTR (``engine`` ``None`` is CTR where the kernel runs its own
    AES), ``False`` never, ``True`` requires it. Not
    thread-safe: use one expander per thread.
    """

    def __init__(
        self,
        max_entries: int,
        dtype: npt.DTypeLike = "<u8",
        *,
        engine: str | None = None,
        native: bool | None = None,
    ) -> None:
        if max_entries <= 0:
            raise ValueError("max_entries must be positive")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype("<u4"), np.dtype("<u8")):
            raise ValueError("ring words are little-endian uint32 or uint64")
        if engine is None and (native or (native is None and native_module.own_engine())):
            # the kernel's own AES outruns both of OpenSSL's paths, and a caller asking for
            # the kernel gets the one engine it runs, whichever of OpenSSL's is faster
            engine = "ctr"
        self.engine = fastest_engine() if engine is None else engine
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}")
        if native and native_module.KERNEL is None:
            raise ValueError("the native masking kernel is not loaded here")
        if native and self.engine != "ctr":
            raise ValueError("the native masking kernel runs the CTR engine only")
        loaded = native_module.KERNEL is not None
        self.native = loaded and self.engine == "ctr" if native is None else native
        self.max_entries = max_entries
        self.entries_per_block = BLOCK_BYTES // self.dtype.itemsize
        self._out: npt.NDArray[np.unsignedinteger] | None = None  # masked_bytes' fallback
        tile = min(max_entries * self.dtype.itemsize, TILE_BYTES)
        self._tile_bytes = tile
        self._zeros = memoryview(bytearray(tile))
        # update_into needs len(data) + block_size - 1 bytes of room.
        self._buf = bytearray(tile + BLOCK_BYTES - 1)
        self._words = np.frombuffer(self._buf, dtype=self.dtype, count=tile // self.dtype.itemsize)
        self._streams: dict[MaskSeed, tuple[CipherContext, int]] = {}
        self._kernel_plan: _KernelPlan | None = None

    def apply(
        self,
        target: npt.NDArray[np.unsignedinteger],
        seed: MaskSeed,
        start_entry: int,
        sign: int,
        *,
        source: npt.NDArray[np.unsignedinteger] | None = None,
    ) -> None:
        """``target = (source or target) + sign * PRG(seed)[start_entry : start_entry + n]``
        (``n = len(target)``); ``source`` saves a copy pass when the target starts as
        another array's values."""
        self.apply_plan(target, ((seed, sign),), start_entry, source=source)

    def apply_plan(
        self,
        target: npt.NDArray[np.unsignedinteger],
        plan: Sequence[tuple[MaskSeed, int]],
        start_entry: int,
        *,
        source: npt.NDArray[np.unsignedinteger] | None = None,
    ) -> None:
        """``target = (source or target) + Σ sign_i * PRG(seed_i)[start_entry : start_entry + n]``
        over the ``(seed_i, sign_i)`` of ``plan``, tile-major.

        Why tile-major: one tile of the target (:data:`TILE_BYTES`) stays in L2 while every
        mask of the plan is expanded next to it and added, so the target is read from
        memory once per plan instead of once per mask (a 2 MiB chunk of the service does
        not fit L2; mask-major order streamed it from L3 for every mask). Each seed's
        cipher context is cached, so consecutive tiles continue its counter.
        """
        n = int(target.shape[0])
        if source is not None and (source.shape != target.shape or source.dtype != target.dtype):
            raise ValueError("source must have the target's shape and dtype")
        self._check(target, n, start_entry)
        if not plan:
            if source is not None:
                np.copyto(target, source)
            return
        size = self.dtype.itemsize
        offset = start_entry * size  # byte offset into the mask
        kernel = native_module.KERNEL
        contiguous = target.flags.c_contiguous and (source is None or source.flags.c_contiguous)
        if self.native and kernel is not None and contiguous:
            view = self._plan_for_kernel(plan)
            done = 0
            while done < n:  # one call per piece of a segment (one piece but for > 1 GiB)
                k = min(n - done, (SEGMENT_BYTES - offset % SEGMENT_BYTES) // size)
                kernel.apply(
                    target[done : done + k],
                    None if source is None else source[done : done + k],
                    view.keys,
                    view.counters(offset),
                    view.signs,
                    size,
                )
                done += k
                offset += k * size
            return
        _check_signs(plan)
        ops = [np.add if sign > 0 else np.subtract for _, sign in plan]
        # Each seed's context, continuing its cached counter when the chunks come in
        # order; resolved once per call, not per tile (the per-tile Python work is what
        # separates masking from the bare keystream).
        encs = [self._resume(seed, offset) for seed, _ in plan]
        buf, tile = self._buf, self._tile_bytes
        done = 0
        while done < n:
            if offset % SEGMENT_BYTES == 0 and done:  # a new segment: its own nonce
                encs = [_context(seed, offset // BLOCK_BYTES, self.engine) for seed, _ in plan]
            # One piece: at most a tile, never across a segment boundary.
            room = SEGMENT_BYTES - offset % SEGMENT_BYTES
            nbytes = min((n - done) * size, tile, room)
            k = nbytes // size
            if nbytes == tile:
                zeros, words = self._zeros, self._words
            else:
                zeros, words = self._zeros[:nbytes], self._words[:k]
            part = target[done : done + k]
            src = part if source is None else source[done : done + k]
            for enc, op in zip(encs, ops, strict=True):
                enc.update_into(zeros, buf)
                op(src, words, out=part)
                src = part
            done += k
            offset += nbytes
        if offset % BLOCK_BYTES == 0 and offset % SEGMENT_BYTES:
            # Keep the contexts: the next in-order chunk continues at the next block.
            for (seed, _), enc in zip(plan, encs, strict=True):
                self._streams[seed] = (enc, offset)

    def masked_bytes(
        self,
        prefix: bytes,
        plan: Sequence[tuple[MaskSeed, int]],
        start_entry: int,
        source: npt.NDArray[np.unsignedinteger],
    ) -> bytes:
        """``prefix`` followed by the bytes of ``source + Σ sign_i * PRG(seed_i)[...]`` (as
        :meth:`apply_plan`), as one new ``bytes`` object: a framed message whose payload
        is not copied again. The native kernel writes the masked words straight into it;
        otherwise they go through the expander's own chunk buffer and one join."""
        n = int(source.shape[0])
        self._check(source, n, start_entry)
        size = self.dtype.itemsize
        offset = start_entry * size
        kernel = native_module.KERNEL
        if (
            self.native
            and kernel is not None
            and plan
            and source.flags.c_contiguous
            and offset % SEGMENT_BYTES + n * size <= SEGMENT_BYTES
        ):
            view = self._plan_for_kernel(plan)
            return kernel.apply_new(
                prefix, source, view.keys, view.counters(offset), view.signs, size
            )
        if self._out is None:
            self._out = np.empty(self.max_entries, dtype=self.dtype)
        out = self._out[:n]
        self.apply_plan(out, plan, start_entry, source=source)
        return b"".join((prefix, out.data.cast("B")))

    def _plan_for_kernel(self, plan: Sequence[tuple[MaskSeed, int]]) -> _KernelPlan:
        """The kernel's view of ``plan``, built once per plan (a participant masks every
        chunk of its input with the same plan): joining 10–20 keys and counter blocks in
        Python per chunk cost as much as a third of the kernel's own time per 256 KiB
        chunk (issue #24). Rebuilt whenever the plan differs (its entries compared one by
        one, by value, the same objects at once: a plan changed in place is caught)."""
        entries = tuple(plan)
        cached = self._kernel_plan
        if cached is None or cached.plan != entries:
            cached = self._kernel_plan = _KernelPlan(entries)
        return cached

    def _check(
        self,
        target: npt.NDArray[np.unsignedinteger],
        n: int,
        start_entry: int,
    ) -> None:
        if target.dtype != self.dtype:
            raise ValueError(f"target dtype {target.dtype} is not the expander's {self.dtype}")
        if n > self.max_entries:
            raise ValueError(f"target of {n} entries exceeds the expander's {self.max_entries}")
        if start_entry % self.entries_per_block:
            raise ValueError("mask chunks must start on a 16-byte block boundary")

    def _resume(self, seed: MaskSeed, offset: int) -> CipherContext:
        """``seed``'s cached context if it stopped exactly at byte ``offset`` (and that is
        not a segment start), else a fresh one positioned there."""
        cached = self._streams.pop(seed, None)
        if cached is not None and cached[1] == offset and offset % SEGMENT_BYTES:
            return cached[0]
        return _context(seed, offset // BLOCK_BYTES, self.engine)

    def forget(self, seed: MaskSeed) -> None:
        """Drop the cached cipher context of ``seed``."""
        self._streams.pop(seed, None)

    def clear(self) -> None:
        """Drop every cached cipher context (and with it the expanded keys) and the
        kernel's view of the last plan (its keys)."""
        self._streams.clear()
        self._kernel_plan = None


def _check_signs(plan: Sequence[tuple[MaskSeed, int]]) -> None:
    if any(sign not in (1, -1) for _, sign in plan):
        raise ValueError("sign must be +1 or -1")


class _KernelPlan:
    """A plan as the native kernel takes it: the AES keys (16 bytes each), one signed
    byte per mask, and each segment's nonces, so a chunk's counter blocks are one join
    (:meth:`counters`), not one :func:`counter_block` per mask."""

    __slots__ = ("_segments", "keys", "plan", "signs")

    def __init__(self, plan: tuple[tuple[MaskSeed, int], ...]) -> None:
        _check_signs(plan)
        self.plan = plan
        self.keys, self.signs = _plan_bytes(plan)
        self._segments: dict[int, tuple[bytes, ...]] = {}

    def counters(self, offset: int) -> bytes:
        """Every mask's counter block of byte ``offset`` (block-aligned), concatenated:
        ``N_s || uint32_be(2 + j)`` per mask (:func:`counter_block`), the same bytes as
        :func:`_counters`."""
        segment, j = divmod(offset // BLOCK_BYTES, SEGMENT_BLOCKS)
        nonces = self._segments.get(segment)
        if nonces is None:
            nonces = tuple(segment_nonce(seed.nonce, segment) for seed, _ in self.plan)
            self._segments = {segment: nonces}  # chunks go segment by segment: keep one
        if not nonces:
            return b""
        block = (FIRST_COUNTER + j).to_bytes(4, "big")
        return block.join(nonces) + block


def _plan_bytes(plan: Sequence[tuple[MaskSeed, int]]) -> tuple[bytes, bytes]:
    """The native kernel's view of a plan: the AES keys, 16 bytes each, and one signed
    byte per mask."""
    return b"".join(seed.key for seed, _ in plan), bytes(sign & 0xFF for _, sign in plan)


def _counters(plan: Sequence[tuple[MaskSeed, int]], offset: int) -> bytes:
    """Each seed's counter block of mask byte ``offset`` (block-aligned), concatenated."""
    return b"".join(counter_block(seed.nonce, offset // BLOCK_BYTES) for seed, _ in plan)


def keystream_words(
    seed: MaskSeed,
    start_entry: int,
    n: int,
    dtype: npt.DTypeLike = "<u8",
    *,
    engine: str | None = None,
    native: bool | None = None,
) -> npt.NDArray[np.unsignedinteger]:
    """``PRG(seed)[start_entry : start_entry + n]`` as a fresh array (tests, tools)."""
    out = np.zeros(n, dtype=dtype)
    MaskExpander(max(n, 1), dtype, engine=engine, native=native).apply(out, seed, start_entry, +1)
    return out


def keystream_bytes(
    seed: MaskSeed, offset: int, nbytes: int, *, engine: str | None = None
) -> bytes:
    """``nbytes`` of the mask's byte stream from block-aligned byte ``offset``."""
    if offset % BLOCK_BYTES or nbytes % 8:
        raise ValueError("offset must be block-aligned and nbytes a multiple of 8")
    return keystream_words(seed, offset // 8, nbytes // 8, engine=engine).tobytes()


def kernel_keystream_seconds(total_bytes: int, buffer_bytes: int = RATE_BUFFER_BYTES) -> float:
    """Wall time of ``total_bytes`` of bare keystream from the native kernel's current
    engine (``_maskkernel.keystream`` into one preallocated buffer, nothing added): the
    second yardstick of ``bench/secagg.py``, next to OpenSSL's. Needs the kernel."""
    kernel = native_module.KERNEL
    if kernel is None:
        raise ValueError("the native masking kernel is not loaded here")
    buf = bytearray(buffer_bytes)
    tail = bytearray(total_bytes % buffer_bytes)
    key, counter = bytes(range(16)), bytes(NONCE_BYTES) + FIRST_COUNTER.to_bytes(4, "big")
    start = time.perf_counter()
    for _ in range(total_bytes // buffer_bytes):
        kernel.keystream(buf, key, counter)
    if tail:
        kernel.keystream(tail, key, counter)
    return time.perf_counter() - start


def raw_keystream_seconds(
    total_bytes: int, buffer_bytes: int = RATE_BUFFER_BYTES, *, engine: str | None = None
) -> float:
    """Wall time to produce ``total_bytes`` of keystream with ``update_into`` into one
    preallocated buffer and nothing else, on ``engine`` (default: the faster).

    This is the yardstick for "near raw AES speed" in ``bench/secagg.py``. One context
    serves the whole run (GCM is limited to 2^36 bytes per nonce; the timer stays far below).
    """
    engine = fastest_engine() if engine is None else engine
    zeros = bytearray(buffer_bytes)
    buf = bytearray(buffer_bytes + BLOCK_BYTES - 1)
    enc = _context(MaskSeed(key=bytes(range(16)), nonce=bytes(NONCE_BYTES)), 0, engine)
    full, rest = divmod(total_bytes, buffer_bytes)
    tail = memoryview(zeros)[: rest - rest % BLOCK_BYTES]
    start = time.perf_counter()
    for _ in range(full):
        enc.update_into(zeros, buf)
    if len(tail):
        enc.update_into(tail, buf)
    return time.perf_counter() - start
