"""Distributed DP-SGD's plan and accounting (issue #25, item 1's first piece): the
record-level ε of ``steps`` steps is Opacus's RDP accountant's for the same
``(σ, q, steps)`` — to 1e-6 — and the noise shares add up to the central noise."""

from __future__ import annotations

import math

import pytest
from opacus.accountants import RDPAccountant

from spherecal.spherefed.privacy.accounting import ORDERS
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan

DELTA = 1e-5


def _opacus(sigma: float, q: float, steps: int, *, alphas: list[float] | None = None) -> float:
    accountant = RDPAccountant()
    accountant.history = [(sigma, q, steps)]
    return float(accountant.get_epsilon(DELTA, alphas=alphas))


@pytest.mark.parametrize(
    ("sigma", "q", "steps"), [(1.0, 0.01, 1000), (0.8, 0.05, 300), (2.5, 0.002, 20000)]
)
def test_the_charge_is_opacus_accountants_epsilon(sigma: float, q: float, steps: int) -> None:
    plan = DistributedDpsgdPlan(sigma, q, max_grad_norm=1.0, min_contributors=6)
    charge = plan.charge(steps, DELTA)
    assert charge.epsilon == pytest.approx(_opacus(sigma, q, steps, alphas=list(ORDERS)), abs=1e-6)
    # our grid extends Opacus's default orders, which can only tighten the bound
    assert charge.epsilon <= _opacus(sigma, q, steps) + 1e-12
    assert charge.mechanism == "dpsgd" and charge.kind == "distributed-dpsgd"


def test_the_shares_of_t_sites_add_up_to_the_central_noise() -> None:
    plan = DistributedDpsgdPlan(1.2, 0.01, max_grad_norm=0.5, min_contributors=4)
    assert 4 * plan.site_stddev**2 == pytest.approx((1.2 * 0.5) ** 2)
    assert plan.realised_multiplier(4) == pytest.approx(1.2)
    # a dropout mid-step leaves more than t: more noise, a smaller ε
    assert plan.realised_multiplier(6) == pytest.approx(1.2 * math.sqrt(6 / 4))
    assert plan.charge(100, DELTA, contributors=6).epsilon < plan.charge(100, DELTA).epsilon
    with pytest.raises(ValueError, match="never unmasked"):
        plan.realised_multiplier(3)
    # colluders' shares do not count: the others add more
    colluding = DistributedDpsgdPlan(1.2, 0.01, max_grad_norm=0.5, min_contributors=4, colluders=1)
    assert colluding.site_stddev > plan.site_stddev
    assert colluding.realised_multiplier(4) == pytest.approx(1.2)


def test_local_dp_sgd_would_need_n_times_the_variance() -> None:
    """The point of the shares: the sum of n locally noised updates carries n·σ²C²,
    distributed shares over t = n carry σ²C² — the same ε as central."""
    n, sigma = 10, 1.0
    plan = DistributedDpsgdPlan(sigma, 0.01, max_grad_norm=1.0, min_contributors=n)
    local_sum_variance = n * sigma**2
    assert n * plan.site_stddev**2 == pytest.approx(local_sum_variance / n)


def test_steps_within_a_budget_is_the_largest_that_fits() -> None:
    plan = DistributedDpsgdPlan(1.0, 0.02, max_grad_norm=1.0, min_contributors=3)
    steps = plan.steps_within(4.0, DELTA)
    assert steps > 0
    assert plan.charge(steps, DELTA).epsilon <= 4.0 < plan.charge(steps + 1, DELTA).epsilon
    assert (
        DistributedDpsgdPlan(0.3, 1.0, max_grad_norm=1.0, min_contributors=3).steps_within(
            0.01, DELTA
        )
        == 0
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"noise_multiplier": 0.0},
        {"sample_rate": 0.0},
        {"sample_rate": 1.5},
        {"max_grad_norm": -1.0},
        {"min_contributors": 3, "colluders": 3},
    ],
)
def test_bad_plans_are_refused(kwargs: dict[str, float]) -> None:
    args: dict[str, float] = {
        "noise_multiplier": 1.0,
        "sample_rate": 0.01,
        "max_grad_norm": 1.0,
        "min_contributors": 3,
    }
    args.update(kwargs)
    with pytest.raises(ValueError):
        DistributedDpsgdPlan(**args)  # type: ignore[arg-type]
