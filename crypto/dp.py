"""Distributed differential privacy in the ring: sizing, sampling and bounding the noise.

Each participant adds integer noise to its encoded vector *before* masking
(docs/design.md §3), so the coordinator only ever sees the sum, whose noise is the sum of
the contributors' noises. Two mechanisms:

* ``"skellam"`` (default; Agarwal, Kairouz & Liu 2021): each participant adds
  Skellam(μ) = Poisson(μ) − Poisson(μ) per entry (variance ``2μ``). Skellam is closed
  under summation, so ``m`` contributors give *exactly* Skellam(``mμ``): the RDP bound of
  the paper applies to the released sum as is.
* ``"dgauss"`` (Kairouz, Liu & Steinke 2021, the distributed discrete Gaussian): each
  adds ``N_Z(0, σ²)``; the sum of ``m`` is not discrete Gaussian, and KLS21 bound the
  gap (their ``τ``) inside the RDP bound.

Samplers are exact (:mod:`spherecal.crypto.exact`, :mod:`spherecal.crypto.poisson`) and draw from an
AES-CTR stream keyed by ``os.urandom`` (:mod:`spherecal.crypto.entropy`); :func:`sample_noise`
takes no seed.

**Sizing against dropouts.** The target is a *total* variance ``v`` (ring units²) of
the released sum, from the accountant (``spherecal.spherefed.privacy``). Every participant adds
``v / (t - c)``, rounded *up* to what the sampler can represent, where ``t`` is the
number of contributors the job guarantees (the secure-aggregation server refuses to
unmask fewer than ``max(threshold, min_participants)`` masked inputs) and ``c`` an
optional number of colluding participants whose noise the adversary knows and
subtracts. Any ``t`` contributors therefore reach ``v``; more contributors only add
noise. :func:`realised_noise` reports what a release actually carried, from the
number of contributors in the aggregate; that is what the ledger records.

**Bounded noise.** The job spec's ``noise_bound`` ``B`` is enforced on every entry
(:func:`spherecal.crypto.ring.add_noise`), because the ring's overflow guarantee counts on it.
Both noises are unbounded, so :func:`sample_noise` redraws any entry with
``|x| > B`` — a truncation. ``B`` is chosen by a Chernoff bound so that the probability
that *any* entry of *any* participant's vector would be redrawn is at most
``2^tail_log2`` (default ``2^-64``); the truncated mechanism is then within total
variation ``η`` of the exact one, i.e. ``(ε, δ)``-DP becomes ``(ε, δ + (1 + e^ε)η)``-DP.
The plan carries ``η`` (``tail_probability``) so the accountant can add it.

**Overflow.** :func:`check_ring_headroom` refuses — naming the cause — any job whose
``n · (⌈B_x 2^f⌉ + B)`` could exceed ``2^63 - 1`` (values bound ``B_x``, scale ``2^f``,
noise bound ``B``), the same inequality :class:`spherecal.crypto.spec.JobSpec` enforces; ``B``
is itself "``k`` standard deviations" with ``k`` from the tail bound (≈ 11–12 for
``2^-64`` and millions of entries).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.crypto._exceptions import InvalidSpec, NoiseTooLarge, RingOverflowRisk
from spherecal.crypto.entropy import RandomSource
from spherecal.crypto.exact import MAX_SIGMA, discrete_gaussian
from spherecal.crypto.poisson import MU_MAX, skellam
from spherecal.crypto.ring import MAX_SIGNED, max_entry_magnitude
from spherecal.crypto.spec import JobSpec

__all__ = [
    "DEFAULT_MECHANISM",
    "DGAUSS",
    "MECHANISMS",
    "SKELLAM",
    "NoisePlan",
    "NoiseTooLarge",
    "RealisedNoise",
    "RingOverflowRisk",
    "check_ring_headroom",
    "guaranteed_contributors",
    "max_noise_bound",
    "noise_bound_for",
    "plan_noise",
    "realised_noise",
    "sample_noise",
    "tail_log2_probability",
    "verify_plan",
]

SKELLAM = "skellam"
DGAUSS = "dgauss"
MECHANISMS = (SKELLAM, DGAUSS)
DEFAULT_MECHANISM = SKELLAM
DEFAULT_TAIL_LOG2 = -64.0


# ------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class NoisePlan:
    """What every participant adds for one job, and what it guarantees.

    ``parameter`` is the Poisson mean ``μ`` per side for Skellam (variance ``2μ``) or
    the integer ``σ`` of the discrete Gaussian (variance parameter ``σ²``).
    """

    mechanism: str
    target_variance: float
    """Variance (ring units²) that any ``min_contributors`` honest contributors reach."""
    min_contributors: int
    colluders: int
    participants: int
    length: int
    parameter: int
    noise_bound: int
    tail_probability: float
    """Upper bound on P(any entry of any participant's noise is redrawn): the TV
    distance between the truncated and the exact mechanism."""

    @property
    def participant_variance(self) -> float:
        p = self.parameter
        return float(2 * p) if self.mechanism == SKELLAM else float(p * p)

    def total_variance(self, contributors: int) -> float:
        """Noise variance parameter of a sum with ``contributors`` honest inputs."""
        return contributors * self.participant_variance

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoisePlan:
        plan = cls(**data)
        if plan.mechanism not in MECHANISMS:
            raise InvalidSpec(f"unknown noise mechanism {plan.mechanism!r}")
        return plan


def guaranteed_contributors(spec: JobSpec) -> int:
    """The fewest inputs a job's aggregate can contain (the server refuses fewer)."""
    return max(spec.threshold, spec.min_participants)


def _parameter_for(mechanism: str, variance: float) -> int:
    if mechanism == SKELLAM:
        mu = math.ceil(variance / 2.0)
        if mu > MU_MAX:
            raise NoiseTooLarge(
                f"Skellam noise of variance {variance:.3e} per participant needs a Poisson mean "
                f"above 2^50; use a coarser fixed-point scale"
            )
        return max(mu, 0)
    if mechanism == DGAUSS:
        sigma = math.isqrt(math.ceil(variance))
        if sigma * sigma < variance:
            sigma += 1
        if sigma > MAX_SIGMA:
            raise NoiseTooLarge(
                f"discrete Gaussian σ = {sigma} per participant exceeds 2^26; use a coarser "
                "fixed-point scale"
            )
        return max(sigma, 1) if variance > 0 else 0
    raise InvalidSpec(f"noise mechanism must be one of {MECHANISMS}, got {mechanism!r}")


def plan_noise(
    target_variance: float,
    *,
    min_contributors: int,
    participants: int,
    length: int,
    mechanism: str = DEFAULT_MECHANISM,
    colluders: int = 0,
    tail_log2: float = DEFAULT_TAIL_LOG2,
) -> NoisePlan:
    """Per-participant noise so that any ``min_contributors - colluders`` honest
    contributors together reach ``target_variance`` (ring units²)."""
    if not (math.isfinite(target_variance) and target_variance >= 0):
        raise InvalidSpec(f"target variance must be finite and >= 0, got {target_variance!r}")
    if not 1 <= min_contributors <= participants:
        raise InvalidSpec(f"min_contributors must be in 1..{participants}, got {min_contributors}")
    honest = min_contributors - colluders
    if colluders < 0 or honest < 1:
        raise InvalidSpec(
            f"{colluders} colluders leave no honest contributor among {min_contributors}"
        )
    if length < 1:
        raise InvalidSpec("length must be >= 1")
    parameter = _parameter_for(mechanism, target_variance / honest)
    bound, tail = noise_bound_for(
        mechanism, parameter, length=length, participants=participants, tail_log2=tail_log2
    )
    return NoisePlan(
        mechanism=mechanism,
        target_variance=float(target_variance),
        min_contributors=min_contributors,
        colluders=colluders,
        participants=participants,
        length=length,
        parameter=parameter,
        noise_bound=bound,
        tail_probability=tail,
    )


# ---------------------------------------------------------------- tail bounds
def tail_log2_probability(mechanism: str, parameter: int, bound: int) -> float:
    """``log2`` of an upper bound on ``P(|X| > bound)`` for one entry (Chernoff).

    Skellam: ``E e^{λX} = exp(2μ(cosh λ - 1))``, minimised at ``λ = asinh(b/2μ)``.
    Discrete Gaussian: sub-Gaussian with variance proxy ``σ²`` (CKS20), so
    ``P(X >= b) <= exp(-b²/2σ²)``. Two-sided: times 2; ``b = bound + 1``.
    """
    if parameter == 0:
        return -math.inf
    b = float(bound + 1)
    if mechanism == SKELLAM:
        two_mu = 2.0 * parameter
        r = b / two_mu
        ln_tail = two_mu * (math.sqrt(1.0 + r * r) - 1.0) - b * math.asinh(r)
    elif mechanism == DGAUSS:
        ln_tail = -(b * b) / (2.0 * float(parameter) ** 2)
    else:
        raise InvalidSpec(f"noise mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    return 1.0 + ln_tail / math.log(2.0)


def noise_bound_for(
    mechanism: str,
    parameter: int,
    *,
    length: int,
    participants: int,
    tail_log2: float = DEFAULT_TAIL_LOG2,
) -> tuple[int, float]:
    """Smallest ``B`` with ``participants · length · P(|X| > B) <= 2^tail_log2``, and that
    total probability (an upper bound, rounded up)."""
    if parameter == 0:
        return 0, 0.0
    budget = tail_log2 - math.log2(float(participants) * float(length)) - 1e-9
    sd = math.sqrt(2.0 * parameter) if mechanism == SKELLAM else float(parameter)
    lo, hi = 0, max(1, math.ceil(4 * sd))
    while tail_log2_probability(mechanism, parameter, hi) > budget:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tail_log2_probability(mechanism, parameter, mid) > budget:
            lo = mid
        else:
            hi = mid
    per_entry = tail_log2_probability(mechanism, parameter, hi)
    total = 2.0 ** (per_entry + math.log2(float(participants) * length))
    return hi, min(1.0, total * (1 + 1e-9))


# ------------------------------------------------------------------ sampling
def _draw(source: RandomSource, mechanism: str, parameter: int, n: int) -> npt.NDArray[np.int64]:
    if parameter == 0:
        return np.zeros(n, dtype=np.int64)
    if mechanism == SKELLAM:
        return skellam(source, n, parameter)
    return discrete_gaussian(source, n, parameter)


def sample_noise(
    plan: NoisePlan,
    *,
    source: RandomSource | None = None,
    chunk: int = 1 << 20,
    count: int | None = None,
) -> npt.NDArray[np.int64]:
    """One participant's noise vector: ``plan.length`` exact draws, each within
    ``±plan.noise_bound`` (an entry beyond it is redrawn; see the module docstring).

    ``count`` returns ``count`` independent vectors as rows (audits, simulations).
    ``source`` is for tests and benchmarks only; the participant calls this without
    it, so the key comes from ``os.urandom``. Works in chunks of ``chunk`` entries to
    bound temporary memory.
    """
    src = source if source is not None else RandomSource()
    rows = 1 if count is None else count
    total = rows * plan.length
    out = np.empty(total, dtype=np.int64)
    for start in range(0, total, chunk):
        stop = min(start + chunk, total)
        block = _draw(src, plan.mechanism, plan.parameter, stop - start)
        over = np.flatnonzero(np.abs(block) > plan.noise_bound)
        while over.size:
            block[over] = _draw(src, plan.mechanism, plan.parameter, over.size)
            over = over[np.abs(block[over]) > plan.noise_bound]
        out[start:stop] = block
    return out if count is None else out.reshape(rows, plan.length)


# ------------------------------------------------------------ what was released
@dataclass(frozen=True)
class RealisedNoise:
    """The noise a release actually carried (for the ledger)."""

    mechanism: str
    contributors: int
    honest_contributors: int
    parameter: int
    participant_variance: float
    total_variance: float
    """Variance of the honest contributors' summed noise (ring units²)."""
    target_variance: float
    meets_target: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def realised_noise(plan: NoisePlan, contributors: int) -> RealisedNoise:
    """The noise in an aggregate of ``contributors`` inputs (e.g.
    ``len(AggregateResult.contributors)``), counting only the honest ones."""
    if contributors < 0:
        raise ValueError("contributors must be >= 0")
    honest = max(0, contributors - plan.colluders)
    total = plan.total_variance(honest)
    return RealisedNoise(
        mechanism=plan.mechanism,
        contributors=contributors,
        honest_contributors=honest,
        parameter=plan.parameter,
        participant_variance=plan.participant_variance,
        total_variance=total,
        target_variance=plan.target_variance,
        meets_target=total >= plan.target_variance,
    )


# ------------------------------------------------------------------ overflow
def check_ring_headroom(participants: int, bound: float, scale_bits: int, noise_bound: int) -> None:
    """Raise :class:`RingOverflowRisk` unless ``n·(⌈B_x 2^f⌉ + B) <= 2^63 - 1``."""
    total = participants * (max_entry_magnitude(bound, scale_bits) + noise_bound)
    if total > MAX_SIGNED:
        raise RingOverflowRisk(
            participants=participants, bound=bound, scale_bits=scale_bits, noise_bound=noise_bound
        )


def max_noise_bound(participants: int, bound: float, scale_bits: int) -> int:
    """The largest per-participant noise bound the ring has room for (may be negative)."""
    return MAX_SIGNED // participants - max_entry_magnitude(bound, scale_bits)


def verify_plan(spec: JobSpec, plan: NoisePlan) -> None:
    """A participant's check, before joining, that the coordinator's job spec carries
    the noise plan it agreed to: same length and participant count, a noise bound at
    least the plan's, and a guaranteed contributor count at least the plan's ``t``."""
    problems = []
    if spec.length != plan.length:
        problems.append(f"length {spec.length} != plan {plan.length}")
    if spec.n != plan.participants:
        problems.append(f"{spec.n} participants != plan {plan.participants}")
    if spec.noise_bound < plan.noise_bound:
        problems.append(f"noise bound {spec.noise_bound} < plan {plan.noise_bound}")
    if guaranteed_contributors(spec) < plan.min_contributors:
        problems.append(
            f"the job guarantees only {guaranteed_contributors(spec)} contributors, the noise "
            f"plan assumes {plan.min_contributors}"
        )
    if problems:
        raise InvalidSpec("job spec does not match the noise plan: " + "; ".join(problems))
    check_ring_headroom(spec.n, spec.bound, spec.scale_bits, spec.noise_bound)
