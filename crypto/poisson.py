"""Exact Poisson and symmetric Skellam samplers for integer means up to ``2^50``.

Skellam(μ) = Poisson(μ) − Poisson(μ) (Agarwal, Kairouz & Liu 2021), so everything
rests on an exact Poisson sampler whose cost does not grow with ``μ`` — summing
``μ`` draws of Poisson(1) (the textbook exact method) is hopeless at the ``μ ~ 10^9``
a fixed-point ring needs.

**Algorithm** (rejection sampling, Devroye 1986 §II.3 / §X.5 in spirit):

* propose ``K = μ + Y`` with ``Y`` discrete Laplace of integer scale ``s = ⌊√μ⌋``,
  sampled exactly (CKS20 Algorithm 2, :func:`spherecal.crypto.exact.discrete_laplace`);
* accept with probability ``A(Y) = [p(μ+Y)/p(μ)] · e^{|Y|/s} / C``, where ``p`` is the
  Poisson pmf. The output is then *exactly* Poisson(μ) provided ``A <= 1`` everywhere
  and each acceptance is decided exactly.

**Envelope** ``C``: for ``μ < 64`` the exact ``ln p(μ+y)/p(μ) + |y|/s`` (concave in
``y`` because the Poisson pmf is log-concave) is maximised; otherwise, for ``y >= 0``,
``ln p(μ+y)/p(μ) = -Σ_{i<=y} ln(1+i/μ) <= -y(y+1)/(2(μ+y))`` (``ln(1+x) >= x/(1+x)``);
for ``y = -w < 0``, ``= Σ_{i<w} ln(1-i/μ) <= -w(w-1)/(2μ)``. Both bounds plus ``|y|/s``
are concave in ``y``; ``ln C`` is their maximum over the integers (ternary search) plus
``10^-6``, which dwarfs the float error of that search. A larger ``C`` only lowers
the acceptance rate (about 0.76 for large ``μ``), never the correctness.

**Deciding ``U < A`` exactly.** ``A`` is transcendental, so it is never computed
exactly; instead the 53-bit uniform ``u`` is compared with an *interval* that is
certain to contain ``A``:

* fast path (float64, vectorised): ``ln A`` from ``ln(μ!/K!)`` written so that the
  large terms cancel analytically — a log-factorial table for ``μ < 2048``
  (entries ``ln n!`` from exact big-integer factorials, error ``< 10^-11``, budget
  ``10^-9``), otherwise Stirling's series with its remainder bound
  (``ln n! = (n+½)ln n - n + ½ln 2π + 1/12n - 1/360n³ + θ/1260n⁵``, ``0 < θ < 1``)
  and ``-(K+½)·log1p(Y/μ) + Y``. Every float operation is charged ``2^-50`` relative
  error (IEEE-754 gives ``2^-53`` per basic operation; libm's ``log``/``log1p``/``exp``
  are within a few ulp), the sum is multiplied by a safety factor 16 to give ``E``,
  and with ``Â = exp(ln A)`` the interval ``[Â(1 - E)(1 - 2^-48), Â(1 + 2E)(1 + 2^-48)]``
  (valid since ``e^{-E} >= 1 - E`` and ``e^{E} <= 1 + 2E`` for ``E <= 1/4``) is
  compared with ``[u, u+1)·2^-53``. Measured: no undecided draw in 2·10^6 for
  ``μ <= 10^9``, about one in 10^6 at ``μ = 10^12`` and one in 4·10^4 at ``μ = 2^50``.
* slow path (Python integers and ``decimal``, exact): the undecided draws extend
  ``U`` by 64 random bits at a time and compare it with rigorous rational bounds on
  ``A``: ``p(K)/p(μ)`` as an exact fraction (for ``|Y| <= 4096``) or Stirling's series
  to eight Bernoulli terms with its remainder bound in 40-digit ``decimal`` (whose
  ``ln``/``exp`` are correctly rounded), and ``e^{|Y|/s}/C`` bounded the same way.

So the sample is exact **assuming** the float64 error bound above holds, which is a
statement about IEEE-754 arithmetic and libm accuracy with a ~1000-fold margin; the
test suite checks the bound against exact arithmetic on adversarial inputs. No float
ever *produces* a sample value: it only short-cuts comparisons whose outcome it
certifies.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from spherecal.crypto.entropy import RandomSource
from spherecal.crypto.exact import discrete_laplace

__all__ = ["MU_MAX", "PoissonEnvelope", "envelope", "poisson", "skellam"]

MU_MAX = 1 << 50
"""Largest Poisson mean (``μ`` and ``K`` stay exact in float64 with room to spare)."""

_MU_TABLE = 2048  # μ below this: log-factorial table path
_N_TABLE = 4096  # table covers n = 0..4096
_K_STIRLING = 1024  # Stirling fast path needs K (and μ) at least this large
_TABLE_ERR = 1e-9  # absolute error budget per table entry (true error < 1e-11)
_REL = 2.0**-50  # relative error charged per float operation
_SAFETY = 16.0
_EXP_MARGIN = 2.0**-48
_EXACT_Y = 4096  # slow path: exact p(K)/p(μ) as a fraction up to this |Y|
_ENVELOPE_MARGIN = 1e-6
_STIRLING_DROPPED = 1.0 / (360.0 * 1024.0**3) + 2.0 / (1260.0 * 1024.0**5)
_MU_EXACT_ENVELOPE = 64  # below: envelope from the exact log-ratio

IntArray = npt.NDArray[np.int64]


def _log_factorial_table(n_max: int) -> npt.NDArray[np.float64]:
    """``ln n!`` for ``n = 0..n_max`` via ``math.log`` of the exact integer ``n!``."""
    out = np.zeros(n_max + 1, dtype=np.float64)
    fact = 1
    for n in range(2, n_max + 1):
        fact *= n
        out[n] = math.log(fact)
    return out


_LOG_FACT = _log_factorial_table(_N_TABLE)


# ----------------------------------------------------------------- envelope
@dataclass(frozen=True)
class PoissonEnvelope:
    """Proposal scale ``s`` and ``ln C`` for one mean ``μ`` (module docstring)."""

    mu: int
    scale: int
    log_c: float


def _max_concave(fn: Callable[[int], float], lo: int, hi: int) -> float:
    """Maximum of an integer-concave ``fn`` on ``[lo, hi]`` (ternary search)."""
    while hi - lo > 2:
        m1 = lo + (hi - lo) // 3
        m2 = hi - (hi - lo) // 3
        if fn(m1) < fn(m2):
            lo = m1 + 1
        else:
            hi = m2
    return max(float(fn(x)) for x in range(lo, hi + 1))


@lru_cache(maxsize=256)
def envelope(mu: int) -> PoissonEnvelope:
    """The rejection envelope for Poisson(``mu``), ``1 <= mu <= MU_MAX``."""
    if not 1 <= mu <= MU_MAX:
        raise ValueError(f"Poisson mean must be an integer in 1..2^50, got {mu}")
    s = max(1, math.isqrt(mu))
    if mu < _MU_EXACT_ENVELOPE:
        ctx = decimal.Context(prec=30)

        def exact(y: int) -> float:
            return float(ctx.ln(_decimal(_ratio_exact(mu, y), ctx))) + abs(y) / s

        best = max(_max_concave(exact, 0, 64 * s + 64), _max_concave(exact, -mu, 0))
    else:

        def right(y: int) -> float:
            return y / s - y * (y + 1) / (2.0 * (mu + y))

        def left(w: int) -> float:
            return w / s - w * (w - 1) / (2.0 * mu)

        best = max(0.0, _max_concave(right, 0, 4 * mu + 8 * s + 16), _max_concave(left, 1, mu))
    return PoissonEnvelope(mu=mu, scale=s, log_c=best + _ENVELOPE_MARGIN)


def _decimal(q: Fraction, ctx: decimal.Context) -> decimal.Decimal:
    return ctx.divide(decimal.Decimal(q.numerator), decimal.Decimal(q.denominator))


# ------------------------------------------------------------- fast decisions
def log_accept(
    env: PoissonEnvelope, y: IntArray
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``ln A(y)`` in float64 and a bound on its error (``inf`` where not certified).

    Public for the tests that check the bound against exact arithmetic."""
    mu = env.mu
    k = mu + y
    yf = y.astype(np.float64)
    kf = k.astype(np.float64)
    ell = np.zeros(y.shape, dtype=np.float64)
    err = np.full(y.shape, np.inf)
    if mu < _MU_TABLE:
        ok = (k >= 0) & (k <= _N_TABLE)
        log_mu = math.log(mu)
        a = yf[ok] * log_mu
        lf_k = _LOG_FACT[k[ok]]
        lf_mu = float(_LOG_FACT[mu])
        ell[ok] = a + lf_mu - lf_k
        err[ok] = 2 * _TABLE_ERR + _REL * (np.abs(a) + lf_mu + lf_k)
    else:
        # |Y| <= μ/2 and K >= 1024: then |log1p(Y/μ)| <= 2|Y|/μ and K + ½ <= 1.5μ + 1, so
        # every rounding error below is at most 2^-50 · (16|Y| + 8) in total, and the
        # dropped cubic Stirling terms |1/360μ³ - 1/360K³| are below 1/(360·1024³).
        ok = (k >= _K_STIRLING) & (np.abs(y) <= mu // 2)
        yo = yf[ok]
        ko = kf[ok]
        t1 = (ko + 0.5) * np.log1p(yo / mu)
        ell[ok] = (yo - t1) + (1.0 / (12.0 * mu) - 1.0 / (12.0 * ko))
        err[ok] = _REL * (16.0 * np.abs(yo) + 8.0) + _STIRLING_DROPPED
    ay = np.abs(yf) / env.scale
    ln_a = ell + ay - env.log_c
    total = _SAFETY * (err + _REL * (ay + abs(env.log_c) + np.abs(ell))) + 1e-14
    return ln_a, total


def _decide(source: RandomSource, env: PoissonEnvelope, y: IntArray) -> npt.NDArray[np.bool_]:
    """Exact accept/reject of proposals ``μ + y``."""
    u = source.bits53(y.shape[0])
    valid = env.mu + y >= 0
    ln_a, err = log_accept(env, y)
    certified = valid & (err < 0.25)
    ln_a = np.where(certified, ln_a, 0.0)
    # e^{-E} >= 1 - E and e^{E} <= 1 + 2E for E <= 1/4; the margin covers exp's few ulp.
    a_hat = np.exp(np.minimum(ln_a, 0.0))
    lo = np.where(certified, a_hat * (1.0 - err) * (1.0 - _EXP_MARGIN), -1.0)
    hi = np.where(certified, a_hat * (1.0 + 2.0 * err) * (1.0 + _EXP_MARGIN), 2.0)
    uf = u.astype(np.float64)
    accept = valid & ((uf + 1.0) * 2.0**-53 <= lo)
    reject = ~valid | (uf * 2.0**-53 >= hi)
    for i in np.flatnonzero(~(accept | reject)).tolist():
        accept[i] = slow_accept(source, env, int(y[i]), int(u[i]))
    return accept


# -------------------------------------------------------------- exact decisions
_BERNOULLI_2J = [  # B_2, B_4, …, B_18
    Fraction(1, 6),
    Fraction(-1, 30),
    Fraction(1, 42),
    Fraction(-1, 30),
    Fraction(5, 66),
    Fraction(-691, 2730),
    Fraction(7, 6),
    Fraction(-3617, 510),
    Fraction(43867, 798),
]
_STIRLING_C = [b / (2 * j * (2 * j - 1)) for j, b in enumerate(_BERNOULLI_2J, start=1)]


def _ratio_exact(mu: int, y: int) -> Fraction:
    """``p(μ+y)/p(μ)`` for the Poisson pmf, exactly."""
    if y >= 0:
        return Fraction(mu**y, math.prod(range(mu + 1, mu + y + 1)))
    w = -y
    return Fraction(math.prod(range(mu - w + 1, mu + 1)), mu**w)


def _exp_bounds(z: Fraction, prec: int) -> tuple[Fraction, Fraction]:
    """Rational ``lo <= e^z <= hi`` from ``decimal`` (division and exp correctly rounded)."""
    ctx = decimal.Context(prec=prec)
    zd = ctx.divide(decimal.Decimal(z.numerator), decimal.Decimal(z.denominator))
    e = Fraction(ctx.exp(zd))
    eta = Fraction(1 + abs(int(z)) + 1, 10 ** (prec - 3))  # ≥ 10× the rounding effects
    return e * (1 - eta), e * (1 + eta)


def _stirling_tail(mu: int, k: int) -> Fraction:
    """Bound on the error of the eight-term Stirling series for ``ln p(k)/p(μ)``."""
    return abs(_STIRLING_C[-1]) * (Fraction(1, mu**17) + Fraction(1, k**17))


def _log_ratio_stirling(mu: int, k: int, prec: int) -> tuple[Fraction, Fraction]:
    """Rational bounds on ``ln p(k)/p(μ)`` from Stirling's series (eight terms)."""
    ctx = decimal.Context(prec=prec)
    lg = Fraction(ctx.ln(ctx.divide(decimal.Decimal(k), decimal.Decimal(mu))))
    main = -(k + Fraction(1, 2)) * lg + (k - mu)
    series = sum(
        (c * (Fraction(1, mu ** (2 * j + 1)) - Fraction(1, k ** (2 * j + 1))))
        for j, c in enumerate(_STIRLING_C[:-1])
    )
    tail = _stirling_tail(mu, k)
    rounding = Fraction((k + 1) * (2 + abs(int(lg))), 10 ** (prec - 3))
    centre = main + Fraction(series)
    slack = tail + rounding
    return centre - slack, centre + slack


def accept_bounds(env: PoissonEnvelope, y: int, digits: int) -> tuple[Fraction, Fraction]:
    """Rational ``lo <= A(y) <= hi``; tighter for larger ``digits`` (exact slow path)."""
    mu, k = env.mu, env.mu + y
    z = Fraction(abs(y), env.scale) - Fraction(env.log_c)
    if abs(y) <= _EXACT_Y or min(k, mu) < 64 or _stirling_tail(mu, k) > Fraction(1, 10**digits):
        ratio = _ratio_exact(mu, y)  # O(|y|) big-integer products: only when unavoidable
        lo, hi = _exp_bounds(z, digits)
        return ratio * lo, ratio * hi
    lr_lo, lr_hi = _log_ratio_stirling(mu, k, digits)
    lo, _ = _exp_bounds(lr_lo + z, digits)
    _, hi = _exp_bounds(lr_hi + z, digits)
    return lo, hi


def slow_accept(source: RandomSource, env: PoissonEnvelope, y: int, u53: int) -> bool:
    """Decide ``U < A(y)`` exactly, ``U``'s first 53 bits being ``u53``."""
    if env.mu + y < 0:
        return False
    x, bits, digits = u53, 53, 40
    while True:
        lo, hi = accept_bounds(env, y, digits)
        scale = 1 << bits
        if (x + 1) * lo.denominator <= lo.numerator * scale:
            return True
        if x * hi.denominator >= hi.numerator * scale:
            return False
        x = (x << 64) | source.word_int()
        bits += 64
        digits += 20


# ------------------------------------------------------------------ samplers
def poisson(source: RandomSource, n: int, mu: int) -> IntArray:
    """``n`` exact draws of Poisson(``mu``) for an integer ``0 <= mu <= 2^50``."""
    if not 0 <= mu <= MU_MAX or int(mu) != mu:
        raise ValueError(f"Poisson mean must be an integer in 0..2^50, got {mu!r}")
    out = np.zeros(n, dtype=np.int64)
    if mu == 0 or n == 0:
        return out
    env = envelope(int(mu))
    pending = np.arange(n)
    while pending.size:
        y = discrete_laplace(source, pending.size, env.scale)
        accept = _decide(source, env, y)
        out[pending[accept]] = env.mu + y[accept]
        pending = pending[~accept]
    return out


def skellam(source: RandomSource, n: int, mu: int) -> IntArray:
    """``n`` exact draws of the symmetric Skellam ``Poisson(μ) − Poisson(μ)`` (variance ``2μ``)."""
    both = poisson(source, 2 * n, mu)
    return both[:n] - both[n:]
