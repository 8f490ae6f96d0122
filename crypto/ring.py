"""Fixed-point encoding of float vectors into the ring ``Z_{2^64}``.

Why this ring: masks are added with wrap-around, and numpy's ``uint64`` arithmetic
wraps modulo ``2^64`` for free, so masking, aggregation and unmasking are single
vectorised passes with no modular reduction (Bonawitz et al. 2017 work in
``Z_R``; any ``R`` works as long as the *true* sum fits).

Correctness therefore rests on one inequality, checked when a job is specified and
enforced on every input: with ``n`` participants, value bound ``B``, scale ``2^f``
and per-entry DP-noise bound ``N``::

    n * (ceil(B * 2^f) + N)  <=  2^63 - 1

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

import numpy as np
import numpy.typing as npt

from spherecal.crypto._exceptions import EncodingOverflow, InvalidSpec, WrongLength

RING_DTYPE = np.dtype("<u8")
"""Wire and accumulator dtype: little-endian uint64 on every platform."""

MAX_SIGNED = (1 << 63) - 1
PRECISION_BITS = 50
MAX_SCALE_BITS = 62

__all__ = [
    "MAX_SCALE_BITS",
    "RING_DTYPE",
    "add_noise",
    "choose_scale_bits",
    "decode",
    "entries_out_of_range",
    "encode",
    "max_entry_magnitude",
    "sum_fits",
]


def max_entry_magnitude(bound: float, scale_bits: int, noise_bound: int = 0) -> int:
    """Largest ``|encoded entry|`` one participant can contribute (ring units)."""
    return math.ceil(math.ldexp(bound, scale_bits)) + noise_bound


def sum_fits(n: int, bound: float, scale_bits: int, noise_bound: int = 0) -> bool:
    """Whether the sum of ``n`` in-bound contributions provably cannot overflow."""
    return n * max_entry_magnitude(bound, scale_bits, noise_bound) <= MAX_SIGNED


def entries_out_of_range(
    ring_sum: npt.NDArray[np.uint64],
    *,
    inputs: int,
    bound: float,
    scale_bits: int,
    noise_bound: int,
) -> int:
    """How many entries of a decoded ring sum of ``inputs`` contributions lie outside
    ``±inputs × max_entry_magnitude`` — impossible for in-bound inputs (0 = fine)."""
    limit = inputs * max_entry_magnitude(bound, scale_bits, noise_bound)
    if limit >= MAX_SIGNED:
        return 0
    signed = ring_sum.view(np.int64)
    if int(signed.max()) <= limit and int(signed.min()) >= -limit:
        return 0
    return int(np.count_nonzero((signed > limit) | (signed < -limit)))


def choose_scale_bits(n: int, bound: float, noise_bound: int = 0) -> int:
    """The finest scale ``f`` such that ``n`` participants' sum cannot overflow.

    Also capped so that ``bound * 2^f <= 2^50`` (see the module docstring): beyond
    that, float64 decoding, not the ring, limits precision.
    """
    if not (math.isfinite(bound) and bound > 0):
        raise InvalidSpec(f"value bound must be a positive finite number, got {bound!r}")
    mantissa, exponent = math.frexp(bound)  # bound = mantissa * 2**exponent, m in [0.5, 1)
    finest = PRECISION_BITS - exponent + (1 if mantissa == 0.5 else 0)  # bound*2^f <= 2^50
    start = min(MAX_SCALE_BITS, max(0, finest))
    for f in range(start, -1, -1):
        if sum_fits(n, bound, f, noise_bound):
            return f
    raise InvalidSpec(
        f"no scale fits: {n} participants with |x| <= {bound} and noise bound "
        f"{noise_bound} overflow the 64-bit ring even at scale 2^0"
    )


def encode(
    values: npt.ArrayLike, *, scale_bits: int, bound: float, length: int | None = None
) -> npt.NDArray[np.uint64]:
    """Encode a 1-D float vector as ``round(x * 2^f) mod 2^64`` (two's complement).

    Refuses, with :class:`EncodingOverflow`, any vector with an entry outside
    ``[-bound, bound]`` or any NaN/Inf. The message names how many entries are out
    of bound and the bound, never the values themselves (they are private data).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise WrongLength(f"expected a 1-D vector, got an array of shape {x.shape}")
    if length is not None and x.shape[0] != length:
        raise WrongLength(f"expected a vector of length {length}, got {x.shape[0]}")
    # Fast path: two reductions, no temporaries. NaN propagates through min/max and
    # fails both comparisons, so it takes the slow path too.
    if x.size and not (float(x.min()) >= -bound and float(x.max()) <= bound):
        bad = x.size - int(np.count_nonzero(np.abs(x) <= bound))
        nonfinite = x.size - int(np.count_nonzero(np.isfinite(x)))
        raise EncodingOverflow(
            f"refusing to encode: {bad} of {x.size} entries are outside the declared "
            f"bound |x| <= {bound!r} ({nonfinite} of them NaN or infinite); values are "
            "never clipped or wrapped, fix the input or the job's bound"
        )
    # One allocation: scale into the result's memory viewed as float64, then round
    # and convert in place (same itemsize and strides, so element-wise in place is
    # well defined; numpy guarantees overlap-safe results regardless).
    out = np.empty(x.shape[0], dtype="<i8")
    as_float = out.view(np.float64)
    np.multiply(x, math.ldexp(1.0, scale_bits), out=as_float)  # exact: a power of two
    np.rint(as_float, out=out, casting="unsafe")
    return out.view(RING_DTYPE)


def add_noise(encoded: npt.NDArray[np.uint64], noise: npt.ArrayLike, *, noise_bound: int) -> None:
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
    np.add(encoded, arr.astype("<i8").view(RING_DTYPE), out=encoded)


def decode(ring_sum: npt.NDArray[np.uint64], *, scale_bits: int) -> npt.NDArray[np.float64]:
    """Interpret a ring vector as signed fixed point and return float64."""
    signed = np.asarray(ring_sum, dtype=RING_DTYPE).view("<i8")
    out = signed.astype(np.float64)
    np.multiply(out, math.ldexp(1.0, -scale_bits), out=out)  # exact: a power of two
    return out
