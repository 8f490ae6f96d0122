"""Fixed-point encoding of float vectors into the ring ``Z_{2^w}``, ``w`` = 32 or 64.

Why these rings: masks are added with wrap-around, and numpy's ``uint32``/``uint64``
arithmetic wraps modulo ``2^w`` for free, so masking, aggregation and unmasking are
single vectorised passes with no modular reduction (Bonawitz et al. 2017 work in
``Z_R``; any ``R`` works as long as the *true* sum fits). The ring width ``w`` is a
per-job parameter of the spec (issue #24): model updates whose bound, participant count
and wanted precision fit use 32 bits — half the bytes on the wire and half the AES work
— and calibration statistics keep 64 (:func:`choose_ring`).

Correctness therefore rests on one inequality, checked when a job is specified and
enforced on every input: with ``n`` participants, value bound ``B``, scale ``2^f``
and per-entry DP-noise bound ``N``::

    n * (ceil(B * 2^f) + N)  <=  2^(w-1) - 1

so the signed (two's complement) sum over *all* participants can never wrap. An
input outside the bound is refused with :class:`EncodingOverflow` — never clipped,
never wrapped silently — because a silent wrap turns into an arbitrarily wrong
aggregate that nobody can detect after masking.

Precision: encoding rounds to the nearest multiple of ``2^-f`` (error ``<= 2^-(f+1)``
per participant and entry), and decoding converts the int64 sum to float64 exactly
up to float rounding. :func:`choose_scale_bits` keeps ``B * 2^f <= 2^50`` so that the
float conversion of the sum adds at most ``n/8`` ring units, i.e. the decoded sum is
within ``n * 2^-f`` of the exact sum of the (unrounded) inputs.
"""

from __future__ import annotations

import math
import mmap
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from spherecal.crypto import native
from spherecal.crypto._exceptions import EncodingOverflow, InvalidSpec, WrongLength

RING_DTYPE = np.dtype("<u8")
"""Wire and accumulator dtype of the 64-bit ring: little-endian uint64 on every platform."""
_RING32 = np.dtype("<u4")
RING_WIDTHS = (32, 64)

MAX_SIGNED = (1 << 63) - 1
PRECISION_BITS = 50
MAX_SCALE_BITS = 62
ENCODE_TILE = 1 << 14
"""Entries encoded per step: the tile's float and integer views stay in L1/L2."""
_MAGIC = 1.5 * 2.0**52
"""Adding ``1.5·2^52`` to a float64 of magnitude below ``2^51`` rounds it to an integer
(round half to even, like ``np.rint``) held in the low mantissa bits: subtracting the
magic's bit pattern from the sum's bit pattern yields that integer in two's complement."""
_MAGIC_BITS = int(np.float64(_MAGIC).view(np.int64))

__all__ = [
    "MAX_SCALE_BITS",
    "RING_DTYPE",
    "RING_WIDTHS",
    "RingChoice",
    "add_noise",
    "adopt",
    "borrow",
    "choose_ring",
    "choose_scale_bits",
    "encode_into",
    "max_signed",
    "give_back",
    "ring_dtype",
    "decode",
    "entries_out_of_range",
    "encode",
    "max_entry_magnitude",
    "sum_fits",
]


def ring_dtype(ring_bits: int = 64) -> np.dtype[np.unsignedinteger]:
    """Wire and accumulator dtype of the ``ring_bits``-bit ring (little-endian)."""
    if ring_bits == 64:
        return RING_DTYPE
    if ring_bits == 32:
        return _RING32
    raise InvalidSpec(f"ring width must be one of {RING_WIDTHS} bits, got {ring_bits!r}")


def max_signed(ring_bits: int = 64) -> int:
    """Largest signed value of the ring: ``2^(w-1) - 1``."""
    ring_dtype(ring_bits)
    return (1 << (ring_bits - 1)) - 1


def _signed_dtype(ring_bits: int) -> np.dtype[np.signedinteger]:
    return np.dtype("<i8") if ring_bits == 64 else np.dtype("<i4")


def max_entry_magnitude(bound: float, scale_bits: int, noise_bound: int = 0) -> int:
    """Largest ``|encoded entry|`` one participant can contribute (ring units)."""
    return math.ceil(math.ldexp(bound, scale_bits)) + noise_bound


def sum_fits(
    n: int, bound: float, scale_bits: int, noise_bound: int = 0, ring_bits: int = 64
) -> bool:
    """Whether the sum of ``n`` in-bound contributions provably cannot overflow."""
    return n * max_entry_magnitude(bound, scale_bits, noise_bound) <= max_signed(ring_bits)


def entries_out_of_range(
    ring_sum: npt.NDArray[np.unsignedinteger],
    *,
    inputs: int,
    bound: float,
    scale_bits: int,
    noise_bound: int,
    ring_bits: int = 64,
) -> int:
    """How many entries of a decoded ring sum of ``inputs`` contributions lie outside
    ``±inputs × max_entry_magnitude`` — impossible for in-bound inputs (0 = fine)."""
    limit = inputs * max_entry_magnitude(bound, scale_bits, noise_bound)
    if limit >= max_signed(ring_bits):
        return 0
    signed = ring_sum.view(_signed_dtype(ring_bits))
    if int(signed.max()) <= limit and int(signed.min()) >= -limit:
        return 0
    return int(np.count_nonzero((signed > limit) | (signed < -limit)))


def choose_scale_bits(n: int, bound: float, noise_bound: int = 0, ring_bits: int = 64) -> int:
    """The finest scale ``f`` such that ``n`` participants' sum cannot overflow the
    ``ring_bits``-bit ring.

    Also capped so that ``bound * 2^f <= 2^50`` (see the module docstring): beyond
    that, float64 decoding, not the ring, limits precision (and the fast rounding of
    :func:`encode_into` needs ``|x| * 2^f < 2^51``).
    """
    if not (math.isfinite(bound) and bound > 0):
        raise InvalidSpec(f"value bound must be a positive finite number, got {bound!r}")
    mantissa, exponent = math.frexp(bound)  # bound = mantissa * 2**exponent, m in [0.5, 1)
    finest = PRECISION_BITS - exponent + (1 if mantissa == 0.5 else 0)  # bound*2^f <= 2^50
    start = min(MAX_SCALE_BITS, max(0, finest))
    for f in range(start, -1, -1):
        if sum_fits(n, bound, f, noise_bound, ring_bits):
            return f
    raise InvalidSpec(
        f"no scale fits: {n} participants with |x| <= {bound} and noise bound "
        f"{noise_bound} overflow the {ring_bits}-bit ring even at scale 2^0"
    )


@dataclass(frozen=True)
class RingChoice:
    """A job's ring: width ``ring_bits`` and scale ``2^scale_bits``; ``step = 2^-f`` is the
    fixed-point step of one contribution (rounding error at most ``step / 2`` per entry and
    participant, so at most ``n · step / 2`` on a sum of ``n``)."""

    ring_bits: int
    scale_bits: int

    @property
    def step(self) -> float:
        return math.ldexp(1.0, -self.scale_bits)


def choose_ring(
    n: int, bound: float, *, resolution: float | None, noise_bound: int = 0
) -> RingChoice:
    """The narrowest ring whose finest overflow-safe scale is at least as fine as
    ``resolution`` (the largest acceptable fixed-point step ``2^-f``), and that scale.

    ``resolution=None`` asks for the 64-bit ring (the finest precision, e.g. calibration
    statistics). Callers derive ``bound`` from what the data can be (the strategy's
    declared clip/update norm, the examples per site), not a fixed constant: the tighter
    the bound, the more jobs fit 32 bits at a given resolution. Pure and deterministic,
    so every party (and other components bounding their inputs) can recompute it.
    """
    if resolution is not None:
        if not (math.isfinite(resolution) and resolution > 0):
            raise InvalidSpec(f"resolution must be a positive finite number, got {resolution!r}")
        try:
            f32 = choose_scale_bits(n, bound, noise_bound, ring_bits=32)
        except InvalidSpec:
            f32 = -1
        if f32 >= 0 and math.ldexp(1.0, -f32) <= resolution:
            return RingChoice(ring_bits=32, scale_bits=f32)
    return RingChoice(ring_bits=64, scale_bits=choose_scale_bits(n, bound, noise_bound, 64))


def _check_bound(x: npt.NDArray[np.float64], bound: float) -> None:
    """Refuse any entry outside ``[-bound, bound]`` or non-finite, tile by tile (two
    reductions over cache-resident data; NaN fails both comparisons)."""
    for start in range(0, x.shape[0], ENCODE_TILE):
        part = x[start : start + ENCODE_TILE]
        if float(part.min()) >= -bound and float(part.max()) <= bound:
            continue
        bad = x.size - int(np.count_nonzero(np.abs(x) <= bound))
        nonfinite = x.size - int(np.count_nonzero(np.isfinite(x)))
        raise EncodingOverflow(
            f"refusing to encode: {bad} of {x.size} entries are outside the declared "
            f"bound |x| <= {bound!r} ({nonfinite} of them NaN or infinite); values are "
            "never clipped or wrapped, fix the input or the job's bound"
        )


def _as_vector(values: npt.ArrayLike, length: int | None) -> npt.NDArray[np.float64]:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise WrongLength(f"expected a 1-D vector, got an array of shape {x.shape}")
    if length is not None and x.shape[0] != length:
        raise WrongLength(f"expected a vector of length {length}, got {x.shape[0]}")
    return x


def encode_into(
    out: npt.NDArray[np.unsignedinteger],
    values: npt.ArrayLike,
    *,
    scale_bits: int,
    bound: float,
    scratch: bool = False,
) -> None:
    """Encode ``values`` as ``rint(x * 2^f) mod 2^w`` into ``out`` (``uint32`` or
    ``uint64``, the same length), tile by tile through one small scratch tile.

    Refuses, with :class:`EncodingOverflow`, any vector with an entry outside
    ``[-bound, bound]`` or any NaN/Inf, before writing anything — unless ``scratch``
    says ``out`` holds nothing to keep (a fresh or borrowed array): then the native
    kernel checks and encodes each cache-sized tile in one pass over ``values``, and a
    refusal may leave ``out`` partly written. ``out`` may be ``values``' own memory
    (:func:`adopt`): each word is written after its float is read, and ``scratch`` is
    then ignored, so a refusal leaves ``values`` whole (and its message's count right).
    The message names how many entries are out of bound and the bound, never the
    values (they are private).

    Rounding is exact and equal to ``np.rint`` (half to even): with ``|x| * 2^f <= 2^50``
    (:func:`choose_scale_bits` keeps every job there) ``x * 2^f + 1.5·2^52`` is rounded
    to an integer by the float addition itself, and the difference of bit patterns is
    that integer — two vectorised passes over an L1-resident tile instead of ``rint``'s
    slower conversion (a caller-chosen scale beyond ``2^50`` falls back to ``rint``).
    Where the native kernel is loaded (:mod:`spherecal.crypto.native`) the check and the
    rounding run in C, one vectorised pass each over the whole vector, same bytes.
    """
    x = _as_vector(values, out.shape[0])
    if scratch and np.may_share_memory(out, x):
        scratch = False  # encoded in place (adopt): check all before writing any word
    # Beyond 2^50 (a caller-chosen scale) the magic addition is not exact: use rint.
    magic = math.ldexp(bound, scale_bits) <= 2.0**PRECISION_BITS
    scale = math.ldexp(1.0, scale_bits)  # exact: a power of two
    kernel = native.KERNEL
    if (
        kernel is not None
        and magic
        and out.dtype in (RING_DTYPE, _RING32)
        and out.flags.c_contiguous
        and x.flags.c_contiguous
    ):
        # The same check and the same two IEEE operations per entry in C, one pass each
        # (spherecal.crypto.native); it writes nothing when an entry is out of bound.
        if kernel.encode(out, x, scale, bound, scratch):
            return
        _check_bound(x, bound)  # raises, naming how many entries
        raise EncodingOverflow(f"refusing to encode: entries outside |x| <= {bound!r}")
    _check_bound(x, bound)
    tile = np.empty(min(ENCODE_TILE, max(1, x.shape[0])), dtype="<i8")
    as_float = tile.view(np.float64)
    narrow = out.dtype.itemsize == 4
    for start in range(0, x.shape[0], ENCODE_TILE):
        part = x[start : start + ENCODE_TILE]
        k = part.shape[0]
        f, i = as_float[:k], tile[:k]
        np.multiply(part, scale, out=f)
        if magic:
            np.add(f, _MAGIC, out=f)
            np.subtract(i, _MAGIC_BITS, out=i)
        else:
            np.rint(f, out=i, casting="unsafe")
        if narrow:  # the low 32 bits: the value mod 2^32
            np.copyto(out[start : start + k], i, casting="unsafe")
        else:
            out[start : start + k] = i.view(RING_DTYPE)


SPARE_BUFFERS = 16
"""Encoded-input buffers kept for reuse (:func:`borrow`), at most; the oldest goes first."""
_spare: deque[npt.NDArray[np.uint8]] = deque(maxlen=SPARE_BUFFERS)
"""Spare buffers (raw bytes, all zero), oldest first: each is in here or on one loan."""
_lent: dict[int, tuple[weakref.ref[npt.NDArray[np.unsignedinteger]], npt.NDArray[np.uint8]]] = {}
"""Live loans: ``id(view)`` → (a weak reference to the view, the buffer under it)."""
_adopted: set[int] = set()
"""Loans of a donated vector's own memory (:func:`adopt`), by ``id(view)``: given back
zeroed but never kept as a spare — its donor may still hold a reference to it."""
_spare_lock = threading.Lock()


def _forget(key: int, ref: weakref.ref[npt.NDArray[np.unsignedinteger]]) -> None:
    """A lent view died without :func:`give_back`: drop its loan, and with it the last
    reference to its buffer (freed, never reused). Runs while the view is deallocated,
    before its memory (and so its ``id``) can be reused: only that loan can match."""
    entry = _lent.get(key)
    if entry is None or entry[0] is ref:  # this loan, or none: not a newer one's id
        _lent.pop(key, None)
        _adopted.discard(key)


def _fault_in(buffer: npt.NDArray[np.uint8]) -> None:
    """Write one zero byte into every memory page ``buffer`` spans (and its last byte),
    so the kernel maps them all now. Why a byte per page and not a fill: the fault
    itself (the kernel zeroes the page) is the cost to move; a fill adds a write of
    every byte on top — measured on the development machine for a fresh 14 MB buffer:
    a byte per page 1.97–3.44 ms, ``fill(0)`` 2.88–4.64 ms (either of them 19–48 ms
    where the machine's memory under the buffer was never touched before). The
    buffer's contents stay unspecified, as for any new :func:`borrow`."""
    if buffer.size:
        buffer[:: mmap.PAGESIZE] = 0  # the first byte, then one per page after it
        buffer[-1] = 0  # the page of the last byte, when the start is not page-aligned


def borrow(
    length: int, ring_bits: int = 64, *, prefault: bool = False
) -> npt.NDArray[np.unsignedinteger]:
    """A ring-word array of ``length`` entries for an encoded input: a view of the
    smallest spare buffer given back earlier in this process that holds at least its
    bytes, whatever ring and length that buffer served before, else a new one (contents
    unspecified; a reused one is zero).

    Why (issue #24): a participant encodes each job's input into a vector as large as
    the model (14 MB for 1.77 M entries at 64 bits), and the first write to freshly
    mapped memory page-faults on every page — measured on the development machine at
    2–4 ms per fresh 14 MB against 2.2 ms for the whole encoding into a reused array.
    Reusing an earlier job's buffer takes those faults off the float → upload path. A
    spare serves by byte capacity, not dtype and exact length, so a site alternating
    32-bit update jobs and 64-bit statistics jobs (or vectors of different lengths)
    keeps reusing the same memory: a 64-bit buffer hosts a 32-bit input of the same
    length, a larger buffer a smaller input. Best fit (the smallest spare that holds
    it) keeps the large buffers for the large inputs.

    A buffer is either spare or on exactly one loan, so two live borrowers never share
    memory; :func:`give_back` ends the loan (a view that dies without it takes its
    buffer with it).

    ``prefault`` makes a *new* buffer resident before it is returned: one byte written
    per memory page (:func:`_fault_in`), so that its page faults are paid by the caller
    now — a participant that borrows while it waits for its peers
    (:meth:`~spherecal.crypto.participant.SecAggParticipant.prepare_input`) — and not by
    the encoding that follows the input. A reused spare was written when it was given
    back (zeroed), so it is resident already and is not touched again.
    """
    dtype = ring_dtype(ring_bits)
    if length < 0:
        raise WrongLength(f"cannot borrow a buffer of {length} entries")
    needed = length * dtype.itemsize
    base: npt.NDArray[np.uint8] | None = None
    with _spare_lock:
        best = -1
        for i, spare in enumerate(_spare):
            if spare.nbytes >= needed and (best < 0 or spare.nbytes < _spare[best].nbytes):
                best = i
        if best >= 0:
            base = _spare[best]
            del _spare[best]
    if base is None:  # new memory: allocated (and faulted in) outside the lock
        base = np.empty(needed, dtype=np.uint8)
        if prefault:
            _fault_in(base)
    with _spare_lock:
        view: npt.NDArray[np.unsignedinteger] = base[:needed].view(dtype)
        key = id(view)
        _lent[key] = (weakref.ref(view, partial(_forget, key)), base)
    return view


def adopt(values: npt.NDArray[np.float64]) -> npt.NDArray[np.uint64] | None:
    """Put a float64 vector's own memory on loan as the 64-bit ring words its encoding
    will be written into (:func:`encode_into` encodes it in place), or None where it
    cannot host one: not a writeable, aligned, C-contiguous 1-D native ``float64``
    ndarray. The caller gives the vector up: after this its bytes are the encoding,
    and :func:`give_back` ends the loan by zeroing them — but never keeps that memory
    as a spare, since the donor may still hold a reference to it (a spare is memory no
    one else can reach).

    Why (issue #24): a secure statistics job's input is a fresh 7.6 MB float vector
    (FFC at l = 1280, C = 100) that nothing reads once it is encoded, while the encoding
    went into a second buffer of the same size — a new one in a process's first such
    job, whose page faults cost 17–18 ms of CPU per site in the service (ten sites on the
    2-core box, three runs); a word of the 64-bit ring is exactly the size of a float64,
    so the input's own pages can hold it."""
    if (
        not isinstance(values, np.ndarray)
        or values.ndim != 1
        or values.dtype != np.dtype("=f8")
        or not values.flags.c_contiguous
        or not values.flags.writeable
        or not values.flags.aligned
    ):
        return None
    base: npt.NDArray[np.uint8] = values.view(np.uint8)
    view: npt.NDArray[np.uint64] = values.view(RING_DTYPE)
    with _spare_lock:
        key = id(view)
        _lent[key] = (weakref.ref(view, partial(_forget, key)), base)
        _adopted.add(key)
    return view


def give_back(buffer: npt.NDArray[np.unsignedinteger]) -> None:
    """End the loan of ``buffer`` (an array :func:`borrow` returned, still on loan):
    zero the whole buffer under it (it held a participant's encoded input) and keep
    that for :func:`borrow`. The caller must hold no other reference to it.

    Refuses, with :class:`ValueError`, an array that is not on loan — one
    :func:`borrow` never returned, or one already given back — because keeping its
    memory could hand it to a second borrower while the first still writes it.
    """
    with _spare_lock:
        entry = _lent.get(id(buffer))
        if entry is None or entry[0]() is not buffer:
            raise ValueError(
                "give_back() takes an array borrow() returned, once; this one is not on loan"
            )
        del _lent[id(buffer)]
        donated = id(buffer) in _adopted
        _adopted.discard(id(buffer))
    base = entry[1]
    base.fill(0)  # outside the lock: on no loan and not yet spare, nobody else sees it
    if donated:
        return  # zeroed; its donor's memory is never lent to another borrower
    with _spare_lock:
        _spare.append(base)


def encode(
    values: npt.ArrayLike,
    *,
    scale_bits: int,
    bound: float,
    length: int | None = None,
    ring_bits: int = 64,
) -> npt.NDArray[np.unsignedinteger]:
    """Encode a 1-D float vector as ``round(x * 2^f) mod 2^w`` (two's complement) into a
    fresh array of the ring's dtype; see :func:`encode_into`."""
    x = _as_vector(values, length)
    out = np.empty(x.shape[0], dtype=ring_dtype(ring_bits))
    encode_into(out, x, scale_bits=scale_bits, bound=bound, scratch=True)
    return out


def add_noise(
    encoded: npt.NDArray[np.unsignedinteger], noise: npt.ArrayLike, *, noise_bound: int
) -> None:
    """Add an integer noise vector (ring units) into ``encoded`` in place.

    The hook for distributed DP (docs/design.md §3): noise is added *before* masking, so the
    coordinator only ever sees the noisy sum. ``|noise| <= noise_bound`` is enforced
    because the overflow guarantee of the job spec counts on it.
    """
    arr = np.asarray(noise)
    if arr.ndim != 1 or arr.shape[0] != encoded.shape[0]:
        raise WrongLength(f"noise vector must have shape ({encoded.shape[0]},), got {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise EncodingOverflow(f"noise must be an integer array, got dtype {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < -noise_bound or hi > noise_bound:
            over = int(np.count_nonzero((arr < -noise_bound) | (arr > noise_bound)))
            raise EncodingOverflow(
                f"refusing noise: {over} of {arr.size} entries exceed the job's noise "
                f"bound {noise_bound}"
            )
    wide = arr.astype("<i8").view(RING_DTYPE)
    if encoded.dtype.itemsize == 8:
        np.add(encoded, wide, out=encoded)
    else:  # mod 2^32: the low word of the two's complement
        np.add(encoded, wide.astype(encoded.dtype), out=encoded)


def decode(
    ring_sum: npt.NDArray[np.unsignedinteger], *, scale_bits: int
) -> npt.NDArray[np.float64]:
    """Interpret a ring vector (``uint32`` or ``uint64``) as signed fixed point and
    return float64."""
    arr = np.asarray(ring_sum)
    if arr.dtype.kind != "u" or arr.dtype.itemsize not in (4, 8):
        arr = arr.astype(RING_DTYPE)
    signed = arr.view("<i8" if arr.dtype.itemsize == 8 else "<i4")
    out = signed.astype(np.float64)
    np.multiply(out, math.ldexp(1.0, -scale_bits), out=out)  # exact: a power of two
    return out
