"""Exact integer samplers: Bernoulli(exp(-γ)), discrete Laplace, discrete Gaussian.

Canonne, Kamath & Steinke 2020 ("The Discrete Gaussian for Differential Privacy",
NeurIPS; CKS20 below), Algorithms 1–3, vectorised over numpy arrays. Every decision
compares an exactly uniform random integer with an exactly known integer, so the
output distribution is *exactly* the stated one (given uniform random words): no
floating-point value ever influences a sample, which is what defeats the attacks of
Mironov 2012 on textbook floating-point Laplace/Gaussian samplers.

The algorithms, and the two equivalent reformulations used to vectorise them:

* ``Bernoulli(exp(-γ))`` for ``γ = num/den ∈ [0, 1]`` (CKS20 Algorithm 1): draw
  ``A_k ~ Bernoulli(γ/k)`` for ``k = 1, 2, …`` until the first failure ``K``; return
  ``[K odd]``, because ``P(K > k) = γ^k/k!`` and ``Σ_k (-γ)^k/k! = e^{-γ}``. Since
  ``Bernoulli(γ/k) = Bernoulli(γ) ∧ Bernoulli(1/k)`` (independent), ``K - 1 = min(L, J)``
  with ``L`` the leading successes of i.i.d. ``Bernoulli(γ)`` (``P(L >= k) = γ^k``) and
  ``J`` those of ``Bernoulli(1/1), Bernoulli(1/2), Bernoulli(1/3), …``
  (``P(J >= j) = 1/j!``). ``J`` is drawn from *one* uniform ``U`` as
  ``J = #{j >= 1 : U < 1/j!}`` (a monotone coupling with the same law), by comparing
  a 64-bit word with the exact integers ``⌊2^64/j!⌋``; ``L`` needs only ``min(L, J)``
  draws.
* ``Bernoulli(exp(-g))`` for integer ``g`` (the ``⌊γ⌋`` factors of CKS20 Algorithm 1
  for ``γ > 1``, and the geometric ``V`` of Algorithm 2): ``V = #{v >= 1 : U < e^{-v}}``
  has ``P(V >= v) = e^{-v}``, exactly the law of the number of ``Bernoulli(e^{-1})``
  successes before the first failure; ``Bernoulli(e^{-g}) = [V >= g]``. The
  thresholds ``⌊2^64 e^{-v}⌋`` are integers computed once, with Python's
  correctly rounded ``decimal`` ``exp``, at 60 digits, and checked not to be within
  ``10^-30`` of an integer (so the floor is certain).
* discrete Laplace ``P(y) ∝ exp(-|y|/t)`` for integer ``t >= 1`` (CKS20 Algorithm 2):
  ``U`` uniform on ``{0..t-1}`` kept with probability ``e^{-U/t}``, ``X = U + tV``, a
  random sign, and ``(-, 0)`` rejected so that 0 is not counted twice.
* discrete Gaussian ``N_Z(0, σ²)`` for **integer** ``σ`` (CKS20 Algorithm 3 with
  ``t = σ``): propose discrete Laplace with scale ``σ``, accept with probability
  ``exp(-(|Y| - σ)²/(2σ²))``. CKS20 take ``t = ⌊σ⌋ + 1`` for general rational ``σ²``;
  for integer ``σ``, ``t = σ`` is equally valid (``exp(-y²/2σ² + |y|/t) <= e^{σ²/2t²}``
  for every ``t > 0``) and keeps ``γ`` a ratio of integers below ``2^63`` for
  ``σ <= 2^26``. Callers needing another variance round ``σ`` *up*: more noise.

Where a 64-bit uniform lands exactly on a threshold (probability ``2^-64`` per
comparison) the comparison is finished by drawing further words of the same ``U``
(lazy refinement) — never by starting over, which would bias the result. Where an
int64 product could overflow (``|Y| - σ >= 2^31``) the entry is finished by the same
algorithm on Python integers. Both paths are exact; they are rare, not approximate.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from spherecal.crypto.entropy import RandomSource

__all__ = [
    "MAX_SIGMA",
    "bernoulli_exp",
    "bernoulli_exp_scalar",
    "discrete_gaussian",
    "discrete_laplace",
    "geometric_exp1",
]

MAX_SIGMA = 1 << 26
"""Largest discrete-Gaussian ``σ`` (then ``2σ² <= 2^53``)."""

_TWO64 = 1 << 64
_INT64_MAX = (1 << 63) - 1
_SQUARE_LIMIT = 1 << 31  # ||Y| - σ| below this: its square fits in int64

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Bounds = Callable[[int], tuple[Fraction, Fraction]]


# --------------------------------------------------------------- lazy uniforms
def lazy_less(source: RandomSource, first_word: int, bounds: Bounds) -> bool:
    """Decide ``U < p`` exactly, where ``U``'s first 64 bits are ``first_word`` and
    ``bounds(digits)`` returns rational ``lo <= p <= hi`` that tighten as ``digits``
    grows. Further words of ``U`` are drawn only while ``U``'s interval straddles
    ``[lo, hi]`` — this is what keeps threshold comparisons exact.
    """
    x, bits, digits = first_word, 64, 40
    while True:
        lo, hi = bounds(digits)
        scale = 1 << bits
        if (x + 1) * lo.denominator <= lo.numerator * scale:  # (x+1)/2^bits <= lo <= p
            return True
        if x * hi.denominator >= hi.numerator * scale:  # x/2^bits >= hi >= p
            return False
        x = (x << 64) | source.word_int()
        bits += 64
        digits += 20  # 64 bits ≈ 19.3 digits: the bounds keep pace with U


def _exact(p: Fraction) -> Bounds:
    return lambda _digits: (p, p)


def _exp_neg_bounds(v: int) -> Bounds:
    """Rigorous rational bounds on ``e^{-v}`` from ``decimal`` (exp is correctly rounded)."""

    def bounds(digits: int) -> tuple[Fraction, Fraction]:
        ctx = decimal.Context(prec=digits + 10)
        value = Fraction(ctx.exp(decimal.Decimal(-v)))
        slack = value * Fraction(1, 10 ** (digits + 8))  # ≥ 10× the rounding error
        return value - slack, value + slack

    return bounds


# ------------------------------------------------------------------ thresholds
def _inverse_factorial_thresholds() -> tuple[list[int], list[bool]]:
    """``⌊2^64/j!⌋`` for ``j = 2..21`` and whether the quotient is exact."""
    floors, exact = [], []
    for j in range(2, 22):
        q, r = divmod(_TWO64, math.factorial(j))
        floors.append(q)
        exact.append(r == 0)
    return floors, exact


def _exp_neg_thresholds(v_max: int) -> list[int]:
    """``⌊2^64 e^{-v}⌋`` for ``v = 1..v_max``, certified (see the module docstring)."""
    ctx = decimal.Context(prec=60)
    out = []
    for v in range(1, v_max + 1):
        value = ctx.multiply(ctx.exp(decimal.Decimal(-v)), decimal.Decimal(_TWO64))
        floor = int(value.to_integral_value(rounding=decimal.ROUND_FLOOR))
        frac = value - floor
        if not decimal.Decimal("1e-30") < frac < 1 - decimal.Decimal("1e-30"):
            raise ArithmeticError(f"cannot certify floor(2^64 e^-{v})")  # pragma: no cover
        out.append(floor)
    return out


_INV_FACT_FLOOR, _INV_FACT_EXACT = _inverse_factorial_thresholds()
_INV_FACT_ASC = np.array(_INV_FACT_FLOOR[::-1], dtype=np.uint64)
_V_MAX = 40
_EXP_NEG_FLOOR = _exp_neg_thresholds(_V_MAX)
_EXP_NEG_ASC = np.array(_EXP_NEG_FLOOR[::-1], dtype=np.uint64)


def _count_below(
    u: npt.NDArray[np.uint64], ascending: npt.NDArray[np.uint64]
) -> tuple[IntArray, IntArray]:
    """For decreasing thresholds ``T_1 > T_2 > …`` given in ascending order: how many
    satisfy ``u < T_i``, and the index ``i`` (0-based) of a threshold equal to ``u``
    (``-1`` if none).

    Most words clear only the first one or two thresholds, so those are two vector
    comparisons; the binary search runs on the few words below ``T_2``."""
    size = ascending.shape[0]
    t1, t2 = ascending[size - 1], ascending[size - 2]
    count = (u < t1).astype(np.int64)
    tie = np.where(u == t1, 0, np.where(u == t2, 1, -1)).astype(np.int64)
    deep = np.flatnonzero(u < t2)
    if deep.size:
        ud = u[deep]
        right = np.searchsorted(ascending, ud, side="right")
        left = np.searchsorted(ascending, ud, side="left")
        count[deep] = size - right
        tie[deep] = np.where(right != left, size - 1 - left, -1)
    return count, tie


# ------------------------------------------------------------------ geometric
def geometric_exp1(source: RandomSource, n: int) -> IntArray:
    """``n`` draws of ``V`` with ``P(V >= v) = e^{-v}`` (CKS20 Algorithm 2's ``V``)."""
    u = source.words(n)
    count, tie = _count_below(u, _EXP_NEG_ASC)
    for i in np.flatnonzero(tie >= 0).tolist():
        v = int(tie[i]) + 1  # U < e^{-w} decided for w < v, decided false for w > v
        count[i] = v if lazy_less(source, int(u[i]), _exp_neg_bounds(v)) else v - 1
    deep = np.flatnonzero(count >= _V_MAX)
    if deep.size:  # memoryless: V - V_MAX given V >= V_MAX is a fresh copy of V
        count[deep] = _V_MAX + geometric_exp1(source, deep.size)
    return count


def _leading_j(source: RandomSource, n: int) -> IntArray:
    """``n`` draws of ``J = #{j >= 1 : U < 1/j!}`` (so ``P(J >= j) = 1/j!``)."""
    u = source.words(n)
    count, tie = _count_below(u, _INV_FACT_ASC)
    for i in np.flatnonzero(tie >= 0).tolist():
        k = int(tie[i])  # threshold j = k + 2
        if _INV_FACT_EXACT[k]:
            continue  # u == 2^64/j! exactly: U >= 1/j!, already counted as "no"
        j = k + 2
        if lazy_less(source, int(u[i]), _exact(Fraction(1, math.factorial(j)))):
            count[i] += 1
    deep = np.flatnonzero(count >= len(_INV_FACT_FLOOR))
    for i in deep.tolist():  # U < 1/21!: decide the deeper thresholds lazily
        j = len(_INV_FACT_FLOOR) + 2
        while lazy_less(source, int(u[i]), _exact(Fraction(1, math.factorial(j)))):
            j += 1
        count[i] = j - 2
    return count + 1  # j = 1 always holds (U < 1)


# ---------------------------------------------------------------- Bernoulli exp
def _bernoulli_exp_le1(source: RandomSource, num: IntArray, den: int) -> BoolArray:
    """Exact ``Bernoulli(exp(-num_i/den))`` for ``0 <= num_i <= den`` (CKS20 Alg. 1)."""
    n = num.shape[0]
    cap = _leading_j(source, n)
    lead = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        ok = source.bernoulli(num[active], den)
        active = active[ok]
        lead[active] += 1
        active = active[lead[active] < cap[active]]
    return (lead & 1) == 0  # K = min(L, J) + 1 is odd


def bernoulli_exp(source: RandomSource, num: npt.ArrayLike, den: int) -> BoolArray:
    """Exact ``Bernoulli(exp(-num_i/den))`` per entry, ``num_i >= 0``, ``1 <= den <= 2^62``."""
    num_a = np.asarray(num, dtype=np.int64).reshape(-1)
    if not 1 <= den <= 1 << 62:
        raise ValueError(f"denominator must be in 1..2^62, got {den}")
    if num_a.size and int(num_a.min()) < 0:
        raise ValueError("need num >= 0")
    whole = num_a // den
    result = geometric_exp1(source, num_a.size) >= whole  # Bernoulli(e^{-⌊γ⌋})
    idx = np.flatnonzero(result)
    if idx.size:
        result[idx] = _bernoulli_exp_le1(source, num_a[idx] - whole[idx] * den, den)
    return result


def bernoulli_exp_scalar(source: RandomSource, num: int, den: int) -> bool:
    """Exact ``Bernoulli(exp(-num/den))`` for non-negative Python integers of any size
    (CKS20 Algorithm 1 as written)."""
    if den <= 0 or num < 0:
        raise ValueError("need num >= 0 and den > 0")
    whole, rest = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_le1_scalar(source, 1, 1):
            return False
    return _bernoulli_exp_le1_scalar(source, rest, den)


def _bernoulli_exp_le1_scalar(source: RandomSource, num: int, den: int) -> bool:
    k = 1
    while source.below_int(den * k) < num:  # A_k = 1: continue
        k += 1
    return k % 2 == 1


# ------------------------------------------------------------ Laplace, Gaussian
def discrete_laplace(source: RandomSource, n: int, scale: int) -> IntArray:
    """``n`` exact draws with ``P(y) ∝ exp(-|y|/scale)`` (CKS20 Algorithm 2), ``scale >= 1``."""
    t = int(scale)
    if not 1 <= t <= 1 << 40:
        raise ValueError(f"discrete Laplace scale must be an integer in 1..2^40, got {scale!r}")
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    while pending.size:
        u = source.uniform(pending.size, t)
        keep = _bernoulli_exp_le1(source, u, t) if t > 1 else np.ones(u.size, dtype=np.bool_)
        cand, u = pending[keep], u[keep]
        v = geometric_exp1(source, cand.size)
        if v.size and int(v.max()) > (_INT64_MAX - t) // t:  # P(V >= 2^23) = e^{-2^23}
            raise OverflowError("discrete Laplace draw beyond int64")  # pragma: no cover
        x = u + t * v
        negative = (source.words(cand.size) & np.uint64(1)).astype(np.bool_)
        good = ~(negative & (x == 0))
        out[cand[good]] = np.where(negative, -x, x)[good]
        accepted = np.zeros(pending.size, dtype=np.bool_)
        accepted[np.flatnonzero(keep)[good]] = True
        pending = pending[~accepted]
    return out


def discrete_gaussian(source: RandomSource, n: int, sigma: int) -> IntArray:
    """``n`` exact draws of ``N_Z(0, σ²)``, ``P(y) ∝ exp(-y²/(2σ²))``, integer ``σ >= 1``."""
    s = int(sigma)
    if not 1 <= s <= MAX_SIGMA:
        raise ValueError(f"sigma must be an integer in 1..{MAX_SIGMA}, got {sigma!r}")
    den = 2 * s * s
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    while pending.size:
        y = discrete_laplace(source, pending.size, s)
        a = np.abs(y) - s
        accept = np.zeros(pending.size, dtype=np.bool_)
        fast = np.abs(a) < _SQUARE_LIMIT
        fi = np.flatnonzero(fast)
        if fi.size:
            accept[fi] = bernoulli_exp(source, a[fi] * a[fi], den)
        for j in np.flatnonzero(~fast).tolist():
            aj = int(a[j])
            accept[j] = bernoulli_exp_scalar(source, aj * aj, den)
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out
