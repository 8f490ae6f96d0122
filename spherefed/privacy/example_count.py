"""The noise on a site's training weight: the plan, cost and ceiling both sides compute.

A site weights its updates by its example count plus discrete Gaussian noise of sd
``σ`` (``[policy] example_count_noise_sd``), drawn once
(:mod:`spherecal.participant.example_weight` keeps the draw and the release rules).
What both ends must agree on lives here, computed from ``σ`` alone:

* :func:`count_noise_plan`: one draw of ``N_Z(0, σ²)`` (Canonne, Kamath & Steinke 2020)
  through :func:`spherecal.crypto.dp.plan_noise`, truncated at its ``noise_bound``
  (a total tail probability of at most ``2^-64``, added to δ as for every mechanism
  here);
* :func:`count_charge`: its cost, sensitivity 1 (one record added or removed moves
  the count by one), ``ρ = 1/2σ²``: :func:`~spherecal.spherefed.privacy.accounting.ddg_rdp`
  with one party — ε ≈ 1.0 at δ = 1e-5 for ``σ = 4``;
* :func:`count_ceiling`: the most a site holding at most ``max_examples`` examples can
  send, ``max_examples + noise_bound``. The coordinator sizes the update jobs' rings and
  sum scales from it, so a site at the declared maximum whose noise came out positive
  still fits the bound rather than withdraw from every round.
"""

from __future__ import annotations

from spherecal.crypto.dp import DGAUSS, NoisePlan, plan_noise
from spherecal.spherefed.privacy.accounting import ddg_rdp
from spherecal.spherefed.privacy.charge import PrivacyCharge

__all__ = [
    "EXAMPLE_COUNT_DELTA",
    "EXAMPLE_COUNT_KIND",
    "count_ceiling",
    "count_charge",
    "count_noise_plan",
]

EXAMPLE_COUNT_DELTA = 1e-5
"""δ at which a training weight's ε is stated."""
EXAMPLE_COUNT_KIND = "example_count"


def count_noise_plan(sd: int) -> NoisePlan:
    """One draw of discrete Gaussian noise of ``sd`` examples (``sd >= 1``)."""
    if sd < 1:
        raise ValueError(f"a noised count needs sd >= 1, got {sd}")
    return plan_noise(
        float(sd * sd), min_contributors=1, participants=1, length=1, mechanism=DGAUSS
    )


def count_charge(sd: int, tail_probability: float = 0.0) -> PrivacyCharge:
    """The privacy cost of one released count with discrete Gaussian noise of ``sd``."""
    if sd < 1:
        raise ValueError(f"a noised count needs sd >= 1, got {sd}")
    return PrivacyCharge.from_curve(
        EXAMPLE_COUNT_KIND,
        DGAUSS,
        ddg_rdp(float(sd * sd), 1, 1.0, 1.0, 1),
        EXAMPLE_COUNT_DELTA,
        tail_probability=tail_probability,
        noise={"sd": sd},
        sensitivity={"l1": 1, "l2": 1},
    )


def count_ceiling(max_examples: int, sd: int) -> int:
    """The largest weight a site of at most ``max_examples`` examples sends at ``sd``."""
    return int(max_examples) + (count_noise_plan(sd).noise_bound if sd > 0 else 0)
