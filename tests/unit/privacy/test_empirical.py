"""The empirical audit: never above the claim on a correct mechanism, above it on a
planted under-noised one, and its statistics are right."""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from typing import Any

import pytest

from spherecal.crypto.entropy import RandomSource
from spherecal.spherefed.privacy.empirical import (
    AuditSettings,
    clopper_pearson_upper,
    run_canary_audit,
)

FAST: dict[str, Any] = {"trials": 1200, "dim": 3, "examples_per_participant": 8}


def seeded(label: str) -> RandomSource:
    """Reproducible noise: a fixed seed makes these statistical assertions deterministic."""
    return RandomSource.deterministic(label)


def test_lower_bound_never_exceeds_the_claim() -> None:
    for mechanism in ("skellam", "dgauss"):
        r = run_canary_audit(AuditSettings(mechanism=mechanism, **FAST), source=seeded(mechanism))
        assert 0 <= r.epsilon_empirical_lower <= r.epsilon_claimed
        assert not r.exceeds_claim and 0 <= r.tightness <= 1
        assert r.epsilon_empirical_lower == max(
            r.epsilon_lower_clopper_pearson, r.epsilon_lower_gdp
        )
        keys = r.to_json()
        for key in ("epsilon_claimed", "epsilon_empirical_lower", "tightness"):
            assert key in keys


def test_audit_catches_an_under_noised_release() -> None:
    """Plant a bug: participants add 2 % of the planned variance. The audit's lower
    bound then exceeds the claimed ε — the check can fail."""
    r = run_canary_audit(AuditSettings(noise_scale=0.02, **FAST), source=seeded("bug"))
    assert r.exceeds_claim and r.epsilon_empirical_lower > r.epsilon_claimed


def test_v_projection_statistic_is_weaker_but_valid() -> None:
    r = run_canary_audit(AuditSettings(statistic="v_projection", **FAST), source=seeded("v"))
    assert r.epsilon_empirical_lower <= r.epsilon_claimed


@pytest.mark.parametrize(("n", "alpha"), [(10, 0.05), (2000, 0.0125), (1, 0.3)])
def test_clopper_pearson_closed_forms(n: int, alpha: float) -> None:
    """k = 0 and k = n - 1 have closed forms: P(Bin <= 0) = (1-p)^n and
    P(Bin <= n-1) = 1 - p^n, each set equal to alpha."""
    assert clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-10)
    assert clopper_pearson_upper(n - 1, n, alpha) == pytest.approx(
        (1 - alpha) ** (1 / n), rel=1e-10
    )
    assert clopper_pearson_upper(n, n, alpha) == 1.0


@pytest.mark.parametrize(("k", "n", "alpha"), [(7, 10, 0.01), (350, 2000, 0.0125), (3, 40, 0.2)])
def test_clopper_pearson_bound_puts_alpha_in_the_binomial_tail(
    k: int, n: int, alpha: float
) -> None:
    """At the bound p, P(Bin(n, p) <= k) = alpha, summed from the pmf with exact
    binomial coefficients in 60-digit decimal arithmetic (independent of scipy; exact
    rationals took tens of seconds at n = 2000)."""
    p = clopper_pearson_upper(k, n, alpha)
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        q = Decimal(p)  # the float's exact value
        cdf = sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1))
    assert float(cdf) == pytest.approx(alpha, rel=1e-7)
    assert k / n < p < 1


def test_clopper_pearson_rejects_bad_input() -> None:
    for args in ((3, 2, 0.05), (-1, 2, 0.05), (0, 0, 0.05), (1, 2, 0.0), (1, 2, 1.0)):
        with pytest.raises(ValueError):
            clopper_pearson_upper(*args)
