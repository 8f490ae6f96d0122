"""Cryptographically secure random integers for DP noise: AES-128-CTR keyed from the OS.

Why not numpy's generators: PCG64/MT19937 are fast but predictable from their output,
and a seed chosen from the clock (or a fixed one) makes "noise" reproducible by
anyone who guesses it — a DP guarantee then protects nothing. Why not ``os.urandom``
for every word: it is a system call per request and an order of magnitude slower
than AES in hardware. So a :class:`RandomSource` draws a fresh 128-bit key and a
fresh 128-bit counter block from ``os.urandom`` (the kernel CSPRNG) and expands them
with AES-128-CTR (the same primitive and library as :mod:`spherecal.crypto.prg`). A source
must never be reused across processes or forked (it holds key material); make one
per noise vector — construction is cheap.

Everything a sampler needs from it is *exact*: :meth:`RandomSource.below` returns
integers uniform on ``[0, m)`` for any ``1 <= m <= 2^63`` by rejection on 64-bit
words (no modulo bias), and :meth:`RandomSource.below_int` does the same for
arbitrary-precision Python integers (the rare slow paths of the samplers).

Tests need reproducible streams to check the samplers' distributions against a
fixed seed; :meth:`RandomSource.deterministic` exists for that and is named so that
a reviewer can grep for it. The participant-facing API (:func:`spherecal.crypto.dp.sample_noise`)
never takes a seed: it only ever builds ``RandomSource()``.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

__all__ = ["RandomSource"]

_WORD = np.dtype("<u8")
_TWO64 = 1 << 64


class RandomSource:
    """A stream of uniform 64-bit words from AES-128-CTR under a fresh OS-random key."""

    def __init__(self) -> None:
        self._enc = _aes_ctr(os.urandom(16), os.urandom(16))
        self.words_drawn = 0
        """How many 64-bit words this source has produced (for benchmarks)."""

    @classmethod
    def deterministic(cls, seed: bytes | str) -> RandomSource:
        """A reproducible stream for **tests only** (key and counter from SHA-256(seed)).

        Never use it for noise that protects anyone: whoever knows ``seed`` knows the
        noise. :func:`spherecal.crypto.dp.sample_noise` does not accept a source from its callers'
        configuration; only tests and benchmarks inject one.
        """
        material = hashlib.sha256(
            b"spherecal-dp-test-only:" + (seed.encode() if isinstance(seed, str) else seed)
        ).digest()
        source = cls.__new__(cls)
        source._enc = _aes_ctr(material[:16], material[16:])
        source.words_drawn = 0
        return source

    # ------------------------------------------------------------------ words
    def words(self, n: int) -> npt.NDArray[np.uint64]:
        """``n`` independent uniform 64-bit words."""
        if n < 0:
            raise ValueError("n must be non-negative")
        self.words_drawn += n
        buf = bytearray(8 * n + 15)  # update_into needs a block of slack
        self._enc.update_into(bytes(8 * n), buf)
        return np.frombuffer(buf, dtype=_WORD, count=n).view(np.uint64)

    def bits53(self, n: int) -> npt.NDArray[np.int64]:
        """``n`` integers uniform on ``[0, 2^53)`` (exactly representable as float64)."""
        return (self.words(n) >> np.uint64(11)).astype(np.int64)

    def below(self, m: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Integers uniform on ``[0, m_i)`` for each entry of ``m`` (``1 <= m_i <= 2^63``).

        Exact: a word ``w`` is accepted iff ``w >= 2^64 mod m``; the accepted range
        ``[2^64 mod m, 2^64)`` has a multiple of ``m`` elements, so ``w mod m`` is
        uniform. The rejection probability is below 1/2 for every ``m <= 2^63``.
        """
        bound = np.asarray(m, dtype=np.int64)
        flat = bound.reshape(-1)
        if flat.size and int(flat.min()) < 1:
            raise ValueError("bounds must be >= 1")
        mu = flat.astype(np.uint64)
        out = np.empty(flat.shape, dtype=np.uint64)
        # 2^64 mod m, computed in wrapping uint64 arithmetic: (0 - m) mod m.
        threshold = (np.uint64(0) - mu) % mu
        pending = np.arange(flat.size)
        w = self.words(flat.size)
        while True:
            ok = w >= threshold[pending]
            out[pending[ok]] = w[ok] % mu[pending[ok]]
            pending = pending[~ok]
            if not pending.size:
                break
            w = self.words(pending.size)
        return out.astype(np.int64).reshape(bound.shape)

    def uniform(self, n: int, m: int) -> npt.NDArray[np.int64]:
        """``n`` integers uniform on ``[0, m)`` for one bound ``1 <= m <= 2^63``.

        Exact and division-light: with ``r = 2^64 mod m`` and ``M = (2^64 - r)/m``, a
        word ``w >= r`` maps to ``(w - r) // M``, uniform because ``w - r`` is uniform on
        ``[0, m·M)``; the rare ``w < r`` (probability ``< m/2^64``) is redrawn.
        """
        if not 1 <= m <= 1 << 63:
            raise ValueError(f"bound must be in 1..2^63, got {m}")
        if m == 1:
            return np.zeros(n, dtype=np.int64)
        r = _TWO64 % m
        span = np.uint64((_TWO64 - r) // m)
        w = self._valid_words(n, r)
        return ((w - np.uint64(r)) // span).astype(np.int64)

    def _valid_words(self, n: int, r: int) -> npt.NDArray[np.uint64]:
        """``n`` words uniform on ``[r, 2^64)`` (rejection of the few below ``r``)."""
        w = self.words(n)
        if r:
            r_u = np.uint64(r)
            bad = np.flatnonzero(w < r_u)
            while bad.size:
                w[bad] = self.words(bad.size)
                bad = bad[w[bad] < r_u]
        return w

    def bernoulli(self, num: npt.ArrayLike, den: int) -> npt.NDArray[np.bool_]:
        """Exact ``Bernoulli(num_i/den)`` per entry for one ``den`` (``0 <= num_i <= den``).

        Same construction as :meth:`uniform` without the division: with ``w - r``
        uniform on ``[0, den·M)``, ``P(w - r < num·M) = num/den``.
        """
        k = np.asarray(num, dtype=np.int64).reshape(-1)
        if not 1 <= den <= 1 << 63:
            raise ValueError(f"denominator must be in 1..2^63, got {den}")
        if den == 1:
            return k >= 1
        r = _TWO64 % den
        span = (_TWO64 - r) // den
        w = self._valid_words(k.size, r) - np.uint64(r)
        full = k >= den  # num == den: always (num·M may equal 2^64, which wraps)
        limit = k.astype(np.uint64) * np.uint64(span)
        return full | (w < limit)

    def below_int(self, m: int) -> int:
        """One integer uniform on ``[0, m)`` for an arbitrary-precision ``m >= 1``."""
        if m < 1:
            raise ValueError("bound must be >= 1")
        n_words = max(1, -(-m.bit_length() // 64))
        span = 1 << (64 * n_words)
        threshold = span % m
        while True:
            value = 0
            for word in self.words(n_words).tolist():
                value = (value << 64) | int(word)
            if value >= threshold:
                return value % m

    def word_int(self) -> int:
        """One uniform 64-bit word as a Python int (lazy-refinement slow paths)."""
        return int(self.words(1)[0])


def _aes_ctr(key: bytes, counter: bytes) -> CipherContext:
    return Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
