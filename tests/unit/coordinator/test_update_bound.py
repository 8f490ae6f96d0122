"""The update jobs' bound follows what the federation declares (issue #24, item 2).

The bound is checked against what the algorithms really send (a real local step on
real tensors, computed independently of the bound), its consequence for the ring
(the digits demo's updates on 32 bits, a 1e5 bound on 64), the override and the
fallback, and the refusal of an update beyond it — with the mutation: the same
update encoded without the check wraps into a wrong sum nobody could detect.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from spherecal import crypto
from spherecal.coordinator.driver.strategy import (
    FALLBACK_UPDATE_BOUND,
    LOSS_BOUND,
    update_bound,
    weight_ceiling,
)
from spherecal.coordinator.settings import CoordinatorSettings, SecAggSettings, TrainingSettings
from spherecal.crypto import ring
from spherecal.participant.failures import failure_kind
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.algorithms import UpdateLimits, make_strategy
from spherecal.spherefed.algorithms.base import ClientResult, as_payload
from spherecal.spherefed.algorithms.strategies import fednova_norm
from spherecal.spherefed.fl import LocalTrainConfig
from spherecal.spherefed.network import ModelSpec, build_model
from spherecal.spherefed.privacy.example_count import count_noise_plan

IDS = tuple(f"p{k}" for k in range(10))


def _settings(**training: object) -> CoordinatorSettings:
    return CoordinatorSettings(
        participants=IDS,
        training=TrainingSettings(**training),  # type: ignore[arg-type]
        max_examples_per_site=1349,  # the digits demo's largest split
    )


def _payload(algorithm: str, n: int, momentum: float) -> tuple[np.ndarray, float]:
    """One real local step (2 epochs, batch 8) of ``algorithm``: the flat payload
    and the largest ``|θ_k − θ|`` it moved."""
    torch.manual_seed(0)
    model = build_model(ModelSpec(extractor="mlp", feature_dim=8, num_classes=3, image_size=4))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 1, 4, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
    config = LocalTrainConfig(epochs=2, batch_size=8, lr=0.1, momentum=momentum, loss="ce")
    result = make_strategy(algorithm).local_step(model, x, y, config, seed=3, broadcast={})
    flat = np.concatenate([np.ravel(v) for v in result.payload.values()])
    change = float(np.max(np.abs(result.payload["delta"]))) / n
    if algorithm == "fednova":  # delta = n_k Δ_k / ‖a_k‖₁
        change *= fednova_norm(2 * math.ceil(n / 8), momentum=momentum)
    return flat, change


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fednova", "fedadam"])
def test_what_a_site_really_sends_stays_inside_the_derived_bound(algorithm: str) -> None:
    n = 40
    flat, change = _payload(algorithm, n, momentum=0.9)
    limits = UpdateLimits(
        max_examples=n, max_change=change, max_steps=2 * math.ceil(n / 8), momentum=0.9
    )
    bound = make_strategy(algorithm).entry_bound(limits)
    assert bound is not None
    assert float(np.max(np.abs(flat))) <= bound
    # FedNova's largest entry is tau = n ‖a‖₁ (momentum's warm-up keeps it below
    # the bound n · τ / (1 − ρ), which holds for any step count)
    if algorithm == "fednova":
        assert bound == pytest.approx(n * 10 / (1 - 0.9))
        assert float(np.max(np.abs(flat))) == pytest.approx(n * fednova_norm(10, momentum=0.9))


# The most a site of 1,349 examples sends as its weight: its count plus the bound of
# the noise on it (sd 4, truncated where a draw is beyond reach: 2^-64 in all)
CEILING = 1349 + count_noise_plan(4).noise_bound


def test_the_derived_bound_is_the_declared_limits_not_a_constant() -> None:
    derived = update_bound(_settings())
    assert derived.source == "derived"
    assert CEILING == 1386 and weight_ceiling(_settings()) == CEILING
    assert derived.value == CEILING  # FedAvg: weights up to × max(1, max_update_change)
    assert update_bound(_settings(max_update_change=3.0)).value == 3 * CEILING
    nova = update_bound(_settings(algorithm="fednova", momentum=0.5))
    steps = 2 * math.ceil(CEILING / 32)  # epochs × ⌈n_max / batch⌉
    assert nova.value == pytest.approx(CEILING * steps / 0.5)
    tiny = replace(_settings(), max_examples_per_site=3)
    assert update_bound(tiny).value == LOSS_BOUND  # the loss entry still fits
    exact = replace(_settings(), example_count_noise_sd=0)  # sites that send n_k
    assert update_bound(exact).value == 1349.0


def test_a_site_at_the_maximum_fits_whatever_its_draw() -> None:
    """A site holding ``max_examples_per_site`` examples whose noise came out at its
    largest: every entry of what it sends stays within the derived bound (before, a
    positive draw took it past the bound, and it withdrew from every round)."""
    bound = update_bound(_settings()).value
    top = 1349 + count_noise_plan(4).noise_bound
    strategy = make_strategy("fedavg")
    delta = np.full(5, 1349.0)  # n_k Δ_k at max_update_change = 1
    result = ClientResult(as_payload(delta=delta, weight=1349), 1349, 1, 0.1)
    sent = strategy.reweighed(result, top, LocalTrainConfig())
    assert float(np.max(np.abs(sent.payload["delta"]))) <= bound
    assert float(sent.payload["weight"]) <= bound


def test_an_explicit_bound_wins_and_scaffold_falls_back_loudly() -> None:
    explicit = replace(_settings(), secagg=SecAggSettings(update_bound=12.5))
    assert (update_bound(explicit).value, update_bound(explicit).source) == (12.5, "configured")
    scaffold = update_bound(_settings(algorithm="scaffold"))
    assert (scaffold.value, scaffold.source) == (FALLBACK_UPDATE_BOUND, "fallback")
    assert "set [secure_aggregation] update_bound" in scaffold.describe()


def test_the_demo_updates_take_the_32_bit_ring_and_a_1e5_bound_does_not() -> None:
    resolution = SecAggSettings().update_resolution  # the default (docs/performance.md)
    assert resolution == 2.0**-16
    demo = crypto.ring.choose_ring(10, update_bound(_settings()).value, resolution=resolution)
    assert (demo.ring_bits, demo.scale_bits) == (32, 17)
    # the step is stated: the sum of 10 in-bound inputs decodes within 10 · 2^-18
    rng = np.random.default_rng(5)
    inputs = rng.uniform(-1349, 1349, size=(10, 1000))
    total = np.zeros(1000, dtype=np.uint32)
    for row in inputs:
        total += ring.encode(row, scale_bits=17, bound=1349.0, ring_bits=32)
    decoded = ring.decode(total, scale_bits=17)
    assert np.max(np.abs(decoded - inputs.sum(axis=0))) <= 10 * 2.0**-18
    wide = replace(_settings(), max_examples_per_site=100_000)
    deployment = crypto.ring.choose_ring(10, update_bound(wide).value, resolution=resolution)
    assert deployment.ring_bits == 64


def test_a_site_beyond_the_bound_refuses_with_a_typed_error_never_a_wrap() -> None:
    bound = 1349.0  # a bound whose 32-bit ring has no headroom for 3.5× it at 3 sites
    spec = crypto.JobSpec.create(
        participants=IDS[:3], threshold=2, length=4, bound=bound, resolution=2.0**-16
    )
    assert spec.ring_bits == 32
    over = np.array([1.0, -2.0, 3.0, 1.5 * bound])
    keys = {p: crypto.generate_identity() for p in IDS[:3]}
    directory = {p: crypto.identity_public_bytes(k) for p, k in keys.items()}
    client = crypto.SecAggParticipant(spec, "p0", keys["p0"], directory)
    with pytest.raises(crypto.EncodingOverflow, match="1 of 4 entries are outside") as err:
        client.set_input(over)
    assert failure_kind(err.value) == pb.BAD_INPUT  # what the site tells the coordinator
    # Mutation: the same input encoded without the range check, next to two in-bound
    # inputs at the bound, wraps — the decoded sum is wrong by 2^32 ring units and
    # nothing after masking could tell.
    scale = spec.scale_bits
    unchecked = ring.encode(over, scale_bits=scale, bound=10 * bound, ring_bits=32)
    honest = ring.encode(np.full(4, bound), scale_bits=scale, bound=bound, ring_bits=32)
    total = unchecked + honest + honest
    assert ring.decode(total, scale_bits=scale)[3] != pytest.approx(3.5 * bound)
    assert ring.decode(total, scale_bits=scale)[3] < 0  # wrapped to the other sign
