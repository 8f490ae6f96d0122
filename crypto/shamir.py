"""t-out-of-n Shamir sharing of byte-string secrets over the prime field GF(2^31 − 1), in numpy.

Why this field (protocol version 2, issue #24): the v1 sharing worked in GF(2^128)
through pycryptodome, one Python big-integer field multiplication per share and
coefficient. In a SecAgg+ job that was, with signatures and key derivation, what made
the per-participant cost grow with ``n`` (0.66 s of a 5.1 s job at ``n = 200``). With
the Mersenne prime ``p = 2^31 − 1`` every product of two field elements fits in 62 bits,
so dealing (Horner's rule over all holders at once) and reconstruction (one Lagrange
combination over all secrets that share a holder set) are a handful of vectorised
``uint64`` passes with no per-share Python.

Encoding. A secret of ``L`` bytes is read as a big-endian integer and cut into
``ceil(8L / 30)`` *limbs* of 30 bits (limb ``k`` = bits ``30k .. 30k+29``); each limb
(``< 2^30 < p``) is shared with its own independent random polynomial of degree
``t − 1``, so any ``t − 1`` shares of a limb are uniformly distributed and independent of
it (Shamir 1979), and limbs are independent of each other. A share is the holder's
evaluation of every limb's polynomial at its ``x`` (``1 ≤ x ≤ n < p``), each as 4 bytes
big-endian: 20 bytes for a 16-byte secret, 36 for 32 bytes. Coefficients are drawn
uniformly from ``Z_p`` by rejection from ``os.urandom`` (31-bit words; the one value
``2^31 − 1`` is redrawn).

Reconstruction is ``p(0) = Σ_j λ_j p(x_j)`` with ``λ_j = Π_{m≠j} x_m / (x_m − x_j)``
(mod ``p``), the coefficients computed once per holder set. Shamir sharing cannot
detect a wrong share — interpolation yields another value (a limb ``≥ 2^30`` or bits
beyond ``8L`` are dropped, so a forged share gives a wrong secret, never an error).
Forged shares are caught one level up: each share carries a hash commitment its dealer
sent alongside the AES-GCM ciphertext (:mod:`spherecal.crypto.channel`), and a rebuilt
secret is checked against the owner's signed public key or seed commitment
(:mod:`spherecal.crypto.unmask`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

PRIME = (1 << 31) - 1
LIMB_BITS = 30
ELEMENT_BYTES = 4

__all__ = ["PRIME", "combine", "combine_many", "lagrange_at_zero", "share_bytes", "split"]


def _limbs(length: int) -> int:
    return -(-8 * length // LIMB_BITS)


def share_bytes(secret_bytes: int) -> int:
    """Length of one share of a ``secret_bytes``-byte secret."""
    return ELEMENT_BYTES * _limbs(secret_bytes)


def _to_limbs(secret: bytes) -> npt.NDArray[np.uint64]:
    value = int.from_bytes(secret, "big")
    mask = (1 << LIMB_BITS) - 1
    return np.array(
        [(value >> (LIMB_BITS * k)) & mask for k in range(_limbs(len(secret)))], dtype=np.uint64
    )


def _from_limbs(limbs: npt.NDArray[np.uint64], length: int) -> bytes:
    mask = (1 << LIMB_BITS) - 1
    value = 0
    for k, limb in enumerate(limbs.tolist()):
        value |= (int(limb) & mask) << (LIMB_BITS * k)
    return (value & ((1 << (8 * length)) - 1)).to_bytes(length, "big")


def _uniform(count: int) -> npt.NDArray[np.uint64]:
    """``count`` independent uniform elements of ``Z_p`` (rejection sampling)."""
    out = np.empty(0, dtype=np.uint64)
    while out.size < count:
        need = count - out.size
        words = np.frombuffer(os.urandom(4 * (need + 8)), dtype="<u4").astype(np.uint64)
        words &= np.uint64(PRIME)  # 31 bits: uniform on 0..2^31 - 1
        out = np.concatenate([out, words[words != np.uint64(PRIME)]])
    return out[:count]


def split(secret: bytes, threshold: int, count: int) -> list[tuple[int, bytes]]:
    """Shares ``(x, share)`` for ``x = 1..count``; any ``threshold`` of them rebuild
    ``secret`` and fewer reveal nothing about it."""
    if not secret:
        raise ValueError("secret must be non-empty")
    if not 1 <= threshold <= count < PRIME:
        raise ValueError(f"need 1 <= threshold ({threshold}) <= count ({count}) < p")
    limbs = _to_limbs(secret)
    coefficients = np.empty((threshold, limbs.size), dtype=np.uint64)
    coefficients[0] = limbs
    coefficients[1:] = _uniform((threshold - 1) * limbs.size).reshape(threshold - 1, limbs.size)
    x = np.arange(1, count + 1, dtype=np.uint64)[:, None]
    p = np.uint64(PRIME)
    acc = np.repeat(coefficients[-1][None, :], count, axis=0)
    for j in range(threshold - 2, -1, -1):  # Horner: acc = acc * x + c_j  (< 2^62)
        acc = (acc * x + coefficients[j]) % p
    rows = acc.astype(">u4")
    return [(i + 1, rows[i].tobytes()) for i in range(count)]


def lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """``λ_j = Π_{m≠j} x_m / (x_m − x_j) mod p`` with ``p(0) = Σ λ_j p(x_j)``."""
    out = []
    for j, xj in enumerate(xs):
        numerator, denominator = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                numerator = numerator * xm % PRIME
                denominator = denominator * (xm - xj) % PRIME
        out.append(numerator * pow(denominator, PRIME - 2, PRIME) % PRIME)
    return out


def _chosen(shares: Sequence[tuple[int, bytes]], threshold: int) -> list[tuple[int, bytes]]:
    if len(shares) < threshold:
        raise ValueError(f"need {threshold} shares, got {len(shares)}")
    chosen = sorted(shares, key=lambda s: s[0])[:threshold]
    xs = [x for x, _ in chosen]
    if len(set(xs)) != len(xs):
        raise ValueError("duplicate share x-coordinates")
    if any(not 1 <= x < PRIME for x in xs):
        raise ValueError("share x-coordinates must be non-zero field elements")
    length = len(chosen[0][1])
    if length % ELEMENT_BYTES or not length or any(len(s) != length for _, s in chosen):
        raise ValueError("shares must all have the same length, a multiple of 4 bytes")
    return chosen


def _secret_length(share_length: int) -> int:
    """The secret length (16 or 32 bytes, or any other) whose shares are this long."""
    limbs = share_length // ELEMENT_BYTES
    return LIMB_BITS * limbs // 8  # the longest secret with this many limbs


def combine_many(
    secrets: Sequence[Sequence[tuple[int, bytes]]],
    threshold: int,
    *,
    lengths: Sequence[int] | None = None,
) -> list[bytes]:
    """Rebuild several secrets; each uses its ``threshold`` shares with the smallest
    x-coordinates. Secrets with the same holder set and share length are combined in
    one vectorised pass, with their Lagrange coefficients computed once.

    ``lengths`` gives each secret's byte length; by default 16 for 20-byte shares and 32
    for 36-byte shares (the two the protocol deals), else the longest that fits."""
    chosen = [_chosen(shares, threshold) for shares in secrets]
    groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
    for i, c in enumerate(chosen):
        groups.setdefault((tuple(x for x, _ in c), len(c[0][1])), []).append(i)
    out: list[bytes] = [b""] * len(chosen)
    p = np.uint64(PRIME)
    for (xs, share_length), members in groups.items():
        lam = np.array(lagrange_at_zero(xs), dtype=np.uint64)
        raw = b"".join(share for i in members for _, share in chosen[i])
        values = np.frombuffer(raw, dtype=">u4").astype(np.uint64)
        values = values.reshape(len(members), len(xs), share_length // ELEMENT_BYTES) % p
        acc = np.zeros((len(members), values.shape[2]), dtype=np.uint64)
        for j in range(len(xs)):  # Σ λ_j s_j, reduced after each product (< 2^62)
            acc = (acc + values[:, j, :] * lam[j]) % p
        for row, i in enumerate(members):
            length = lengths[i] if lengths is not None else _default_length(share_length)
            out[i] = _from_limbs(acc[row], length)
    return out


def _default_length(share_length: int) -> int:
    return {share_bytes(16): 16, share_bytes(32): 32}.get(
        share_length, _secret_length(share_length)
    )


def combine(shares: Sequence[tuple[int, bytes]], threshold: int) -> bytes:
    """Rebuild one secret from at least ``threshold`` shares."""
    return combine_many([shares], threshold)[0]
