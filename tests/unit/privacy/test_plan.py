"""Release planning: ε met with the guaranteed contributors, a valid job spec, refusals,
and the whole path through secure aggregation to a calibrated classifier."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spherecal.crypto import JobSpec, run_protocol
from spherecal.crypto.dp import RingOverflowRisk, sample_noise, verify_plan
from spherecal.crypto.entropy import RandomSource
from spherecal.spherefed.calibrate import ffc_solve
from spherecal.spherefed.privacy.plan import CalibrationPlan, plan_calibration_release
from spherecal.spherefed.privacy.sensitivity import exact_ffc_statistics
from spherecal.spherefed.stats import FFCStatistics

DELTA = 1e-5


def plan(**kw: object) -> CalibrationPlan:
    args: dict[str, object] = {
        "dim": 16,
        "num_classes": 4,
        "participants": 6,
        "min_contributors": 4,
        "epsilon_target": 2.0,
        "delta": DELTA,
        "max_examples": 500,
    }
    args.update(kw)
    kind = str(args.pop("kind", "ffc"))
    return plan_calibration_release(kind, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("mechanism", ["skellam", "dgauss"])
@pytest.mark.parametrize("kind", ["ffc", "ccvr"])
def test_target_met_with_the_guaranteed_contributors(kind: str, mechanism: str) -> None:
    p = plan(kind=kind, mechanism=mechanism)
    assert p.planned_epsilon <= 2.0 and p.planned_epsilon > 1.9  # tight, not wasteful
    assert p.charge(4).epsilon == pytest.approx(p.planned_epsilon, rel=1e-9)
    assert p.charge(6).epsilon < p.planned_epsilon  # more contributors, more noise
    assert p.charge(3).epsilon > 2.0  # fewer than guaranteed would not meet it
    assert p.scale_bits == 2 * p.quant_bits and p.sensitivity.rounding_inflation < 1e-3


def test_colluders_cost_noise() -> None:
    honest = plan()
    wary = plan(colluders=1)
    assert wary.noise.participant_variance > honest.noise.participant_variance
    assert wary.charge(4).epsilon == pytest.approx(wary.planned_epsilon, rel=1e-9)


def test_job_spec_arguments_make_a_valid_spec() -> None:
    p = plan()
    ids = [f"site{i}" for i in range(6)]
    spec = JobSpec.create(ids, threshold=4, **p.job_spec_arguments())
    verify_plan(spec, p.noise)
    assert spec.noise_bound == p.noise.noise_bound and spec.scale_bits == p.scale_bits


def test_overflow_is_refused_before_the_job() -> None:
    with pytest.raises(RingOverflowRisk) as err:
        plan(participants=5000, min_contributors=4, max_examples=2**30, quant_bits=12)
    assert err.value.cause in ("values", "values and noise")


def test_noisy_ffc_end_to_end_through_secure_aggregation() -> None:
    """Participants compute exact statistics, add planned noise via ``set_input(noise=)``;
    the coordinator decodes, solves FFC, and records what was spent."""
    rng = np.random.default_rng(0)
    dim, classes, n = 8, 3, 4
    centres = rng.normal(size=(classes, dim)) * 3
    stats = []
    for _ in range(n):
        y = rng.integers(0, classes, 200)
        z = centres[y] + rng.normal(size=(200, dim))
        stats.append(exact_ffc_statistics(z, y, classes, quant_bits=10))
    p = plan_calibration_release(
        "ffc",
        dim=dim,
        num_classes=classes,
        participants=n,
        min_contributors=3,
        epsilon_target=8.0,
        delta=DELTA,
        max_examples=200,
    )
    ids = [f"p{i}" for i in range(n)]
    spec = JobSpec.create(ids, threshold=3, **p.job_spec_arguments())
    inputs = {pid: s.pack(isometric=True) for pid, s in zip(ids, stats, strict=True)}
    s = RandomSource.deterministic("end-to-end")
    noise = {pid: sample_noise(p.noise, source=s) for pid in ids}
    report = run_protocol(spec, inputs, noise=noise)
    released = FFCStatistics.unpack(report.result.values, dim, classes, isometric=True)
    exact = stats[0] + stats[1] + stats[2] + stats[3]
    sigma = math.sqrt(p.noise.total_variance(n)) / 2**p.scale_bits
    assert abs(released.count - exact.count) < 6 * sigma
    assert np.abs(released.V - exact.V).max() < 6 * sigma
    w = ffc_solve(released.V, released.U, ridge=2 * math.sqrt(dim) * sigma)
    z_test = centres + 0.1 * rng.normal(size=(classes, dim))
    z_test /= np.linalg.norm(z_test, axis=1, keepdims=True)
    assert ((z_test @ w.T).argmax(axis=1) == np.arange(classes)).all()
    charge = p.charge(len(report.result.contributors))
    assert charge.epsilon <= 8.0 and charge.noise["meets_target"] is True
    assert charge.noise["contributors"] == 4
