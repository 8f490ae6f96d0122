"""Accounting reproduces published numbers, the papers' formulas, and is monotone."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from spherecal.spherefed.privacy.accounting import (
    ORDERS,
    calibrate,
    compose,
    ddg_rdp,
    ddg_sigma_for,
    ddg_tau,
    delta_with_truncation,
    dpsgd_rdp,
    epsilon,
    gaussian_multiplier_for,
    gaussian_rdp,
    gdp_epsilon,
    skellam_rdp,
    skellam_variance_for,
)

DELTA = 1e-5

#: the Rényi orders rounded up to integers (where a bound needs integer orders)
CEILED = [float(o) for o in np.ceil(ORDERS)]


def test_gaussian_epsilon_matches_opacus_published_value() -> None:
    """Opacus's RDP accountant: noise multiplier 1.0, one release, δ = 1e-5 → ε ≈ 4.73."""
    eps, order = epsilon(gaussian_rdp(1.0), DELTA)
    assert eps == pytest.approx(4.7285, abs=5e-4) and order == pytest.approx(5.4)
    acc = RDPAccountant()
    acc.history = [(1.0, 1.0, 1)]
    assert eps == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)


def test_dpsgd_matches_opacus_accountant() -> None:
    acc = RDPAccountant()
    acc.history = [(1.1, 256 / 60000, 60 * 235)]  # Abadi et al.'s MNIST setting
    ours, _ = epsilon(dpsgd_rdp(1.1, 256 / 60000, 60 * 235), DELTA)
    assert ours <= acc.get_epsilon(DELTA) + 1e-12  # our orders are a superset of Opacus's
    assert ours == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)


def test_skellam_formula_by_hand() -> None:
    """AKL21 Thm 3.5 at α = 2, Δ₂ = 2, Δ₁ = 4, μ = 100:
    2·4/200 + min((3·4 + 24)/(4·10⁴), 3·4/200) = 0.04 + 0.0009."""
    curve = skellam_rdp(100.0, 2.0, 4.0, orders=[2.0, 1.5])
    assert curve[0] == pytest.approx(0.0409)
    assert curve[1] == pytest.approx(0.0409)  # order 1.5 uses the bound at ⌈1.5⌉ = 2


def test_skellam_tends_to_gaussian_from_above() -> None:
    l2, l1 = 3.0, 30.0
    for var in (10.0, 1e3, 1e6):
        sk = skellam_rdp(var, l2, l1)
        gauss = gaussian_rdp(math.sqrt(var) / l2)
        assert (sk >= gauss - 1e-12).all()
    big = skellam_rdp(1e8, l2, l1)
    assert np.allclose(big, gaussian_rdp(1e4 / l2, orders=CEILED), rtol=1e-3)


def test_ddg_formula_by_hand_and_its_gaussian_limit() -> None:
    sigma2, n, l2, l1, d = 0.25, 3, 1.0, 2.0, 10
    tau = 10 * sum(math.exp(-2 * math.pi**2 * sigma2 * k / (k + 1)) for k in (1, 2))
    assert ddg_tau(sigma2, n) == pytest.approx(tau)
    s2 = n * sigma2
    alpha = 2.0
    expected = min(
        alpha * l2**2 / (2 * s2) + tau * d,
        alpha / 2 * (l2**2 / s2 + 2 * l1 * tau / math.sqrt(s2) + tau**2 * d),
        alpha / 2 * (l2 / math.sqrt(s2) + tau * math.sqrt(d)) ** 2,
    )
    assert ddg_rdp(sigma2, n, l2, l1, d, orders=[alpha])[0] == pytest.approx(expected)
    wide = ddg_rdp(400.0, 5, 3.0, 9.0, 100)  # τ ≈ 0: the Gaussian curve of σ² = nσ_i²
    assert np.allclose(wide, gaussian_rdp(math.sqrt(5 * 400.0) / 3.0, orders=CEILED))


@pytest.mark.parametrize("mechanism", ["gaussian", "skellam", "ddg"])
def test_epsilon_is_monotone_in_noise_and_compositions(mechanism: str) -> None:
    def curve(noise: float) -> np.ndarray:
        if mechanism == "gaussian":
            return gaussian_rdp(noise)
        if mechanism == "skellam":
            return skellam_rdp(noise**2 * 1e6, 1e3, 1e4)
        return ddg_rdp(noise**2 * 1e6 / 4, 4, 1e3, 1e4, 50)

    noises = np.geomspace(0.3, 30, 25)
    eps = [epsilon(curve(z), DELTA)[0] for z in noises]
    assert all(a > b for a, b in zip(eps, eps[1:], strict=False))
    one = curve(2.0)
    by_k = [epsilon(compose([one] * k), DELTA)[0] for k in range(1, 12)]
    assert all(a < b for a, b in zip(by_k, by_k[1:], strict=False))


def test_calibration_meets_the_target_minimally() -> None:
    z = gaussian_multiplier_for(4.7285, DELTA)
    assert z == pytest.approx(1.0, abs=1e-3)
    for target in (0.5, 2.0, 8.0):
        var = skellam_variance_for(target, DELTA, 1e3, 1e4)
        assert epsilon(skellam_rdp(var, 1e3, 1e4), DELTA)[0] <= target
        assert epsilon(skellam_rdp(var * 0.999, 1e3, 1e4), DELTA)[0] > target
        sigma = ddg_sigma_for(target, DELTA, 1e3, 1e4, 50, contributors=3, max_contributors=10)
        curve = ddg_rdp(sigma**2, 3, 1e3, 1e4, 50, tau_contributors=10)
        assert epsilon(curve, DELTA)[0] <= target
    with pytest.raises(ValueError):
        calibrate(lambda x: 1.0, 0.0, lo=1.0, hi=2.0)


def test_composition_is_addition_and_ten_releases_cost_less_than_ten_times() -> None:
    one = skellam_rdp(1e8, 1e3, 1e4)
    assert np.allclose(compose([one, one, one]), 3 * one)
    e1 = epsilon(one, DELTA)[0]
    assert epsilon(compose([one] * 10), DELTA)[0] < 10 * e1  # RDP beats naive composition


def test_gdp_conversion_and_truncation_delta() -> None:
    phi = NormalDist().cdf
    for mu in (0.5, 1.0, 2.0):
        eps = gdp_epsilon(mu, DELTA)
        d = phi(-eps / mu + mu / 2) - math.exp(eps) * phi(-eps / mu - mu / 2)
        assert d == pytest.approx(DELTA, rel=1e-6)
    assert gdp_epsilon(1.0, DELTA) < epsilon(gaussian_rdp(1.0), DELTA)[0]  # RDP is looser
    assert delta_with_truncation(1.0, DELTA, 0.0) == DELTA
    assert delta_with_truncation(1.0, DELTA, 1e-20) == pytest.approx(DELTA + (1 + math.e) * 1e-20)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        epsilon(gaussian_rdp(1.0), 0.0)
    with pytest.raises(ValueError):
        epsilon([1.0, 2.0], DELTA)
    assert math.isinf(epsilon(skellam_rdp(0.0, 1.0, 1.0), DELTA)[0])


def test_orders_start_with_opacus_defaults() -> None:
    """The orders are written out (Opacus is imported lazily); they stay Opacus's."""
    from spherecal.spherefed.privacy.accounting import OPACUS_DEFAULT_ORDERS

    assert tuple(float(a) for a in RDPAccountant.DEFAULT_ALPHAS) == OPACUS_DEFAULT_ORDERS
    assert ORDERS[: len(OPACUS_DEFAULT_ORDERS)] == OPACUS_DEFAULT_ORDERS


def _fresh_python(code: str) -> str:
    """What ``code`` prints in a new interpreter (nothing imported before it)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    return done.stdout.strip()


def test_service_processes_start_without_opacus() -> None:
    """Every coordinator and participant process imports spherecal.daemon; Opacus (torch.
    distributed, sympy, scipy.stats: seconds per process) is imported only by what
    calls it — DP-SGD and the RDP conversions."""
    code = (
        "import sys, spherecal.daemon, spherecal.coordinator.main, spherecal.participant.main, "
        "spherecal.participant.runner; "
        "print(sorted(m for m in ('opacus', 'sympy') if m in sys.modules))"
    )
    assert _fresh_python(code) == "[]"


@pytest.mark.parametrize(
    "curve",
    [
        "gaussian",
        "skellam",
        "ddg",
        "dpsgd",
        "composed",
        "infinite_tail",
        "near_zero",
    ],
)
def test_conversion_equals_opacus_bit_for_bit(curve: str) -> None:
    """``epsilon`` writes out Opacus's ``get_privacy_spent`` (Balle et al. 2020, Thm.
    21): on every kind of curve the ledger converts, the same ε and order to the bit."""
    import warnings

    from opacus.accountants.analysis.rdp import get_privacy_spent

    curves = {
        "gaussian": gaussian_rdp(1.3),
        "skellam": skellam_rdp(4e6, 2e3, 4e3),
        "ddg": ddg_rdp(50.0, 8, 30.0, 100.0, 64),
        "dpsgd": dpsgd_rdp(1.1, 0.05, 104),
        "composed": compose([skellam_rdp(4e6, 2e3, 4e3), dpsgd_rdp(1.1, 0.05, 52)]),
        "infinite_tail": np.where(np.arange(len(ORDERS)) > 20, np.inf, gaussian_rdp(0.7)),
        "near_zero": skellam_rdp(1e18, 1.0, 1.0),
    }
    rdp = np.asarray(curves[curve], dtype=np.float64)
    for delta in (1e-5, 1e-9, 0.01):
        ours = epsilon(rdp, delta)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            eps, order = get_privacy_spent(orders=list(ORDERS), rdp=list(rdp), delta=delta)
        assert ours == (max(0.0, float(eps)), float(order)), (curve, delta)


def test_converting_a_curve_imports_no_opacus() -> None:
    """A participant converting an evaluation release's Skellam curve loads no Opacus
    (importing it costs about 1.5 s of CPU per process)."""
    code = (
        "import sys\n"
        "from spherecal.spherefed.privacy.evaluation_noise import "
        "evaluation_epsilon, plan_evaluation_noise\n"
        "noise = plan_evaluation_noise(2.0, participants=10, min_contributors=6, length=4)\n"
        "assert evaluation_epsilon(noise) > 0\n"
        "print('opacus' in sys.modules)"
    )
    assert _fresh_python(code) == "False"
