"""Distributed DP-SGD's step at a site and its noise in the ring (issue #25).

* the clipped gradient sum equals an independent loop over the examples (plain
  autograd, one example at a time, clipped by hand), for both losses;
* the ring noise is sized for the sensitivity after rounding to the grid;
* through the real secure-aggregation protocol (in process), the summed noise's
  empirical standard deviation matches the claimed one, and with sites dropping —
  before masking (exactly ``t`` left) or after (their noise stays in) — it never
  falls below the planned ``σΔ``; a plan split over all ``n`` instead of ``t`` would.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
import torch

from spherecal.crypto import JobSpec
from spherecal.crypto.dp import realised_noise, sample_noise, verify_plan
from spherecal.crypto.ring import RING_DTYPE, encode
from spherecal.crypto.simulation import run_protocol
from spherecal.spherefed.fl import aggregated_keys
from spherecal.spherefed.losses import make_loss
from spherecal.spherefed.network import ModelSpec, build_model
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.dpsgd_step import clipped_gradient_sum, poisson_sample


def _by_hand(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, clip: float
) -> npt.NDArray[np.float64]:
    keys = aggregated_keys(model)
    params = dict(model.named_parameters())
    total = np.zeros(0)
    for i in range(x.shape[0]):
        model.zero_grad()
        make_loss(loss)(model(x[i : i + 1]), y[i : i + 1]).backward()
        parts = []
        for k in keys:
            grad = params[k].grad if k in params else None
            parts.append(
                grad.detach().double().reshape(-1).numpy()
                if grad is not None
                else np.zeros(model.state_dict()[k].numel())
            )
        g = np.concatenate(parts)
        g = g * min(1.0, clip / np.linalg.norm(g))
        total = g if total.size == 0 else total + g
    return total


@pytest.mark.parametrize("loss", ["mse", "ce"])
def test_the_clipped_sum_equals_a_loop_over_the_examples(loss: str) -> None:
    model = build_model(ModelSpec(extractor="mlp"))
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (40,), generator=gen)
    batch = np.array([0, 3, 4, 9, 17, 18, 30, 39])
    for clip in (0.05, 1e6):  # every gradient clipped; none clipped
        got = clipped_gradient_sum(
            model, x, y, loss=loss, max_grad_norm=clip, sample_rate=0.5, indices=batch
        )
        want = _by_hand(model, x[batch], y[batch], loss, clip)
        assert got.batch_size == len(batch)
        assert got.clipped == (len(batch) if clip < 1 else 0)
        np.testing.assert_allclose(got.vector, want, rtol=1e-4, atol=1e-6)
    # the sensitivity: each example moves the sum by at most C
    assert np.linalg.norm(got.vector) > 0.05 * len(batch)
    small = clipped_gradient_sum(
        model, x, y, loss=loss, max_grad_norm=0.05, sample_rate=0.5, indices=batch
    )
    assert np.linalg.norm(small.vector) <= 0.05 * len(batch) * (1 + 1e-9)


def test_poisson_sampling_is_the_sites_own() -> None:
    a, b = poisson_sample(20_000, 0.5), poisson_sample(20_000, 0.5)
    assert not np.array_equal(a, b)  # keyed from os.urandom: equal with prob. 2^-20000
    assert abs(len(a) - 10_000) < 600  # > 8 sd
    with pytest.raises(ValueError, match="sample rate"):
        poisson_sample(10, 0.0)


def test_the_ring_noise_covers_the_rounded_sensitivity() -> None:
    plan = DistributedDpsgdPlan(1.3, 0.01, max_grad_norm=0.7, min_contributors=3, colluders=1)
    length = 10_000
    assert plan.sensitivity(length) == pytest.approx(0.7 + 100 * 2.0**-16)
    noise = plan.ring_noise(length, 5)
    target = (1.3 * plan.sensitivity(length) * 2.0**16) ** 2
    assert noise.target_variance == pytest.approx(target)
    # any t - c = 2 honest contributors reach it; one alone does not
    assert realised_noise(noise, 3).meets_target and not realised_noise(noise, 2).meets_target
    args = plan.job_spec_arguments(length, 5, max_examples=1000)
    assert args["bound"] == pytest.approx(700.0) and args["noise_bound"] == noise.noise_bound


@pytest.mark.parametrize(
    ("drop", "contributors"),
    [({"p3": "masked", "p4": "masked"}, 3), ({"p4": "unmask"}, 5), ({}, 5)],
)
def test_the_summed_noise_has_the_claimed_deviation(
    drop: dict[str, str], contributors: int
) -> None:
    """Real protocol, real noise: 5 sites, t = 3; 20,000 entries per sum."""
    ids = [f"p{k}" for k in range(5)]
    length, sigma, clip = 20_000, 0.9, 1.0
    plan = DistributedDpsgdPlan(sigma, 0.01, max_grad_norm=clip, min_contributors=3)
    noise_plan = plan.ring_noise(length, len(ids))
    spec = JobSpec.create(
        ids, threshold=3, min_participants=3, **plan.job_spec_arguments(length, 5, 100)
    )
    verify_plan(spec, noise_plan)
    rng = np.random.default_rng(7)
    inputs = {p: rng.uniform(-5, 5, length) for p in ids}  # stand-ins for clipped sums
    noise = {p: sample_noise(noise_plan) for p in ids}
    report = run_protocol(spec, inputs, noise=noise, drop=drop)
    assert len(report.result.contributors) == contributors
    signal = np.zeros(length, dtype=RING_DTYPE)
    for p in report.result.contributors:
        signal += encode(inputs[p], scale_bits=spec.scale_bits, bound=spec.bound)
    summed = (report.result.ring_sum - signal).view(np.int64).astype(np.float64)
    measured = float(np.std(summed)) * 2.0**-plan.scale_bits  # gradient units
    claimed = math.sqrt(noise_plan.total_variance(contributors)) * 2.0**-plan.scale_bits
    planned = sigma * plan.sensitivity(length)
    assert measured == pytest.approx(claimed, rel=0.03)  # ~6 sd of the estimate
    assert claimed >= planned and measured >= planned * 0.97
    # what the split over t guards against: shares sized for all n sites fall short
    # of the plan whenever fewer contribute
    naive = DistributedDpsgdPlan(sigma, 0.01, max_grad_norm=clip, min_contributors=5)
    assert realised_noise(naive.ring_noise(length, 5), 3).meets_target is False
