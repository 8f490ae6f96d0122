"""Distributed DP noise on federated evaluation counts: the plan both sides compute.

Why: an evaluation's counts ``[total, correct("none"), correct(head)…]`` are a
statistic of a site's test (or validation) labels. Secure aggregation hides one
site's counts inside one sum, but two sums over rosters that differ by one site
give that site's counts by differencing (issue #19: ten "always class c" heads gave
a site's whole test histogram). So every site adds integer noise to its counts in
the ring before masking (``spherecal.crypto.dp``), sized so that any ``t``
guaranteed contributors together reach a total standard deviation of ``sd`` counts
on every entry of the sum; the difference of two sums then carries
``√2·sd`` counts of noise, and each release costs the ε of
:func:`evaluation_epsilon`, recorded in the site's own release ledger.

Both sides compute the same plan from public inputs — the site's ``[policy]
evaluation_noise_sd`` and the job spec (``n``, ``t``, ``length``, ``scale_bits``):
the coordinator to size the job spec's ``noise_bound`` (``[secure_aggregation]
evaluation_noise_sd``), the site to check that bound and draw its noise
(a site whose ``sd`` is larger than the coordinator's refuses the job with
``RULE_DP_REQUIRED``: the spec cannot carry its noise).

Counts are integers, so the job uses a fixed-point scale of
:data:`EVALUATION_SCALE_BITS` bits: the per-site noise parameter is an integer in
ring units, and a scale of ``2^10`` makes its rounding negligible (at ``2^0`` a
Skellam parameter of at least 1 per site would give 10 sites a total standard
deviation of 4.5 counts instead of 1).

**The stated bound, for cross-checks** (e.g. comparing sums with other sums): the
noise of each entry of an evaluation sum has standard deviation
:attr:`EvaluationNoise.sum_sd` (counts; at least ``sd`` with ``t`` honest
contributors, ``√(contributors/t)``·``sd`` with more) and is bounded in absolute
value by :attr:`EvaluationNoise.sum_bound` (``contributors × noise_bound / 2^f``,
the truncation every site enforces). The coordinator records both in
``results.json`` (``federated_evaluation.noise``).

Sensitivity: adding or removing one example changes the total by 1 and each
head's correct count by 0 or 1, so in count units ``Δ₂ = √length`` and
``Δ₁ = length``; Skellam's RDP (Agarwal, Kairouz & Liu 2021, Thm 3.5;
:func:`spherecal.spherefed.privacy.accounting.skellam_rdp`) gives ε at δ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from spherecal.crypto.dp import SKELLAM, NoisePlan, plan_noise
from spherecal.spherefed.privacy.accounting import epsilon, skellam_rdp

__all__ = [
    "DEFAULT_EVALUATION_NOISE_SD",
    "DEFAULT_MAX_EVALUATIONS_PER_FEDERATION",
    "EVALUATION_DELTA",
    "EVALUATION_SCALE_BITS",
    "EvaluationNoise",
    "accuracy_sd",
    "evaluation_epsilon",
    "plan_evaluation_noise",
]

DEFAULT_EVALUATION_NOISE_SD = 0.8
"""Total standard deviation (counts) of every entry of an evaluation sum over the
guaranteed contributors ``t``. It keeps the 449-sample digits demo's accuracies
within ±1 point of the exact ones: with all 10 sites contributing (6 guaranteed)
the sum's sd is 0.8·√(10/6) ≈ 1.03 counts and the accuracy's
≈ 1.03·√(1+acc²)/449 ≈ 0.3 points, so 1 point is over 3 standard deviations —
while no site's count is recoverable exactly: a difference of two sums is off by
noise of sd ≥ 0.8·√2 ≈ 1.1 counts. The price, stated honestly: ε ≈ 13 (δ = 1e-5)
per 2-head test evaluation against the coordinator, more for the validation grid;
each is recorded in the site's ledger."""

DEFAULT_MAX_EVALUATIONS_PER_FEDERATION = 4
"""Most evaluation releases a site makes in one federation (``[policy]
max_evaluations_per_federation``). Why a count: each release's noise is fresh, and a
coordinator can make "the same count again" free — the split's total is an entry of
every evaluation, and a model moved by one float32 ulp (or a head's bias by a hair)
is a new release key with the same counts — so ``k`` releases average the noise down
to ``1.1/√k`` counts (exact with ≥ 95 % from ``k ≈ 20``). The coordinator's default
schedule needs at most three per site (the calibrators' validation grid, the
validation gate's remaining heads, the final test evaluation); four leaves one spare
and holds a repeated count's mean to ≥ 0.55 counts of noise. Per-round evaluations
(``[evaluation] federated_every``, ``[federation] round_gate``) need more: the
coordinator keeps its schedule within ``[evaluation] site_limit``
(:mod:`spherecal.coordinator.evaluation_schedule`)."""

EVALUATION_SCALE_BITS = 10
"""Fixed-point bits of an evaluation job (counts are integers: exact at any scale)."""

EVALUATION_DELTA = 1e-5
"""δ at which an evaluation release's ε is stated."""


@dataclass(frozen=True)
class EvaluationNoise:
    """One evaluation job's noise: the ring plan and what it means in counts."""

    sd: float
    """Requested total standard deviation (counts) over ``t`` honest contributors."""
    scale_bits: int
    plan: NoisePlan

    @property
    def site_sd(self) -> float:
        """Standard deviation (counts) of one site's noise on each entry."""
        return math.sqrt(self.plan.participant_variance) / 2.0**self.scale_bits

    def sum_sd(self, contributors: int) -> float:
        """Standard deviation (counts) of each entry of a sum of ``contributors``."""
        return math.sqrt(self.plan.total_variance(contributors)) / 2.0**self.scale_bits

    def sum_bound(self, contributors: int) -> float:
        """Hard bound (counts) on the noise of each entry of such a sum."""
        return contributors * self.plan.noise_bound / 2.0**self.scale_bits

    def to_json(self, contributors: int) -> dict[str, Any]:
        return {
            "mechanism": self.plan.mechanism,
            "sd_target": self.sd,
            "site_sd": self.site_sd,
            "sum_sd": self.sum_sd(contributors),
            "sum_bound": self.sum_bound(contributors),
            "contributors": contributors,
        }


def plan_evaluation_noise(
    sd: float,
    *,
    participants: int,
    min_contributors: int,
    length: int,
    scale_bits: int = EVALUATION_SCALE_BITS,
) -> EvaluationNoise:
    """The per-site Skellam noise for an evaluation job (see the module docstring)."""
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"evaluation noise sd must be a positive number, got {sd!r}")
    variance = sd * sd * 4.0**scale_bits
    plan = plan_noise(
        variance,
        min_contributors=min_contributors,
        participants=participants,
        length=length,
        mechanism=SKELLAM,
    )
    return EvaluationNoise(sd=float(sd), scale_bits=scale_bits, plan=plan)


def evaluation_epsilon(
    noise: EvaluationNoise, *, contributors: int | None = None, delta: float = EVALUATION_DELTA
) -> float:
    """ε (at ``delta``) of one evaluation release against the coordinator, with the
    noise of ``contributors`` honest sites (default: the plan's guaranteed ``t``,
    the worst case a site charges itself)."""
    honest = noise.plan.min_contributors if contributors is None else contributors
    unit = 2.0**noise.scale_bits
    length = noise.plan.length
    curve = skellam_rdp(
        noise.plan.total_variance(honest), math.sqrt(length) * unit, float(length) * unit
    )
    return epsilon(curve, delta)[0]


def accuracy_sd(correct: float, total: float, sum_sd: float) -> float:
    """Standard deviation of ``correct / total`` when both carry independent noise of
    ``sum_sd`` counts (first-order: ``sd·√(1 + acc²) / total``)."""
    if total <= 0:
        return math.inf
    acc = correct / total
    return sum_sd * math.sqrt(1.0 + acc * acc) / total
