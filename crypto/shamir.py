"""t-out-of-n Shamir sharing of 16- and 32-byte secrets over GF(2^128).

Dealing uses pycryptodome (``Crypto.Protocol.SecretSharing.Shamir.split``): a
well-kept implementation whose random polynomial coefficients come from
``os.urandom``. It shares exactly 16-byte secrets, so the 32-byte X25519 ``s_sk``
is dealt as two independent 16-byte halves with the same x-coordinate.

Reconstruction does *not* use pycryptodome's ``combine``, because measurement
showed it to be the coordinator's bottleneck: it recomputes the Lagrange
coefficients — ``t`` field inversions and ``t^2`` multiplications in pure Python, at
~0.1-0.8 ms per full-width multiplication — for every secret, and the coordinator
rebuilds one secret per survivor and per dropout, serially. With the complete graph,
60 participants and ``t = 31`` (two dropouts) the coordinator's unmasking took 8.0 s
with pycryptodome's ``combine`` and 0.09 s with :func:`combine_many`. (Dealing, by
contrast, runs on each participant in parallel and multiplies only by small x.) All
secrets revealed by the same holders share one set of x-coordinates, so
:func:`combine_many` computes the coefficients once per set and then needs ``t``
multiplications per secret. The field is pycryptodome's exactly (``x^128 + x^7 + x^2
+ x + 1``, big-endian bytes, least significant bit = constant term), and the tests
check this module against pycryptodome's multiplication, inversion and ``combine``.

pycryptodome's sharing cannot detect a wrong share — interpolation just yields a
different secret. Forged shares are caught one level up: each share carries a
hash commitment its dealer sent alongside the AES-GCM ciphertext (see
:mod:`spherecal.crypto.channel`), and a rebuilt secret is checked against the owner's signed
public key or seed commitment (:mod:`spherecal.crypto.server`).
"""

from __future__ import annotations

from collections.abc import Sequence

from Crypto.Protocol.SecretSharing import Shamir

PIECE = 16
_BITS = 128
_MASK = (1 << _BITS) - 1

__all__ = ["combine", "combine_many", "gf_inverse", "gf_multiply", "split"]


def gf_multiply(a: int, b: int) -> int:
    """Product in GF(2^128) mod ``x^128 + x^7 + x^2 + x + 1`` (4-bit windows)."""
    table = [0] * 16
    table[1] = a
    for i in range(2, 16, 2):
        table[i] = table[i >> 1] << 1
        table[i + 1] = table[i] ^ a
    z = 0
    for shift in range((b.bit_length() + 3) // 4 * 4 - 4, -4, -4):  # skip leading zeros
        z = (z << 4) ^ table[(b >> shift) & 15]
    for _ in range(2):  # fold the high half back: x^128 = x^7 + x^2 + x + 1
        high = z >> _BITS
        z = (z & _MASK) ^ high ^ (high << 1) ^ (high << 2) ^ (high << 7)
    return z


def gf_inverse(a: int) -> int:
    """``a^(2^128 - 2)``, the inverse of a non-zero element (Fermat)."""
    if a == 0:
        raise ZeroDivisionError("zero has no inverse in GF(2^128)")
    result, base, exponent = 1, a, (1 << _BITS) - 2
    while exponent:
        if exponent & 1:
            result = gf_multiply(result, base)
        base = gf_multiply(base, base)
        exponent >>= 1
    return result


def _lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """Coefficients ``λ_j = Π_{m≠j} x_m / (x_m + x_j)`` with ``p(0) = Σ λ_j p(x_j)``
    (characteristic 2: subtraction is addition)."""
    coefficients = []
    for j, xj in enumerate(xs):
        numerator, denominator = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                numerator = gf_multiply(numerator, xm)
                denominator = gf_multiply(denominator, xm ^ xj)
        coefficients.append(gf_multiply(numerator, gf_inverse(denominator)))
    return coefficients


def split(secret: bytes, threshold: int, count: int) -> list[tuple[int, bytes]]:
    """Shares ``(x, share)`` for ``x = 1..count``; any ``threshold`` of them rebuild
    ``secret`` and fewer reveal nothing about it."""
    if len(secret) % PIECE or not secret:
        raise ValueError("secret length must be a positive multiple of 16 bytes")
    if not 1 <= threshold <= count:
        raise ValueError(f"need 1 <= threshold ({threshold}) <= count ({count})")
    pieces = [secret[i : i + PIECE] for i in range(0, len(secret), PIECE)]
    per_piece = [Shamir.split(threshold, count, piece) for piece in pieces]
    shares = []
    for j in range(count):
        x = per_piece[0][j][0]
        shares.append((x, b"".join(piece_shares[j][1] for piece_shares in per_piece)))
    return shares


def _chosen(shares: Sequence[tuple[int, bytes]], threshold: int) -> list[tuple[int, bytes]]:
    if len(shares) < threshold:
        raise ValueError(f"need {threshold} shares, got {len(shares)}")
    chosen = sorted(shares, key=lambda s: s[0])[:threshold]
    xs = [x for x, _ in chosen]
    if len(set(xs)) != len(xs):
        raise ValueError("duplicate share x-coordinates")
    if any(not 1 <= x <= _MASK for x in xs):
        raise ValueError("share x-coordinates must be non-zero field elements")
    length = len(chosen[0][1])
    if length % PIECE or not length or any(len(s) != length for _, s in chosen):
        raise ValueError("shares must all have the same length, a multiple of 16 bytes")
    return chosen


def combine_many(secrets: Sequence[Sequence[tuple[int, bytes]]], threshold: int) -> list[bytes]:
    """Rebuild several secrets; each uses its ``threshold`` shares with the smallest
    x-coordinates. Lagrange coefficients are computed once per x-coordinate set."""
    cache: dict[tuple[int, ...], list[int]] = {}
    out = []
    for shares in secrets:
        chosen = _chosen(shares, threshold)
        xs = tuple(x for x, _ in chosen)
        coefficients = cache.get(xs)
        if coefficients is None:
            coefficients = cache[xs] = _lagrange_at_zero(xs)
        pieces = []
        for offset in range(0, len(chosen[0][1]), PIECE):
            value = 0
            for coefficient, (_, share) in zip(coefficients, chosen, strict=True):
                piece = int.from_bytes(share[offset : offset + PIECE], "big")
                value ^= gf_multiply(piece, coefficient)
            pieces.append(value.to_bytes(PIECE, "big"))
        out.append(b"".join(pieces))
    return out


def combine(shares: Sequence[tuple[int, bytes]], threshold: int) -> bytes:
    """Rebuild one secret from at least ``threshold`` shares."""
    return combine_many([shares], threshold)[0]
