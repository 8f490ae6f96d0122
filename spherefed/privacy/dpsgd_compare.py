"""Distributed, central and local DP-SGD trained side by side at the same record-level
ε (the privacy table, ``spherecal experiment --table privacy``, and ``bench/dpsgd.py``).

Every private method is charged the same ε at δ for the whole training by the same
accountant (Opacus's RDP for the sampled Gaussian, :func:`.charge.dpsgd_charge`):

``distributed``  the service's algorithm (:mod:`.dpsgd_step`): each site samples its
                 records at the federation-wide rate ``q`` and sums its clipped
                 per-example gradients; the noise of the sum is the ring plan's
                 (:meth:`.distributed_dpsgd.DistributedDpsgdPlan.ring_noise`) with
                 all sites contributing; the sum is divided by the public ``q·N``.
``central``      Opacus DP-SGD on the pooled data (the upper bound): the same ``q``,
                 ``C``, ``σ``, steps and learning rate.
``local``        each site runs DP-SGD on its own data (Opacus) for
                 ``rounds`` rounds of FedAvg, its σ the smallest that keeps its own
                 ε over all rounds within the target (:func:`local_sigma`).
``nonprivate``   the distributed algorithm without noise (same ``C``, ``q``, steps):
                 what the noise costs.

The ring's noise is drawn as a Gaussian of exactly the plan's total variance: at these
variances (some 10⁹ ring units²) the exact Skellam sum is Gaussian for all that
matters to accuracy; the exact path through the ring is tested in
``tests/unit/privacy/test_dpsgd_step.py`` and the service test. The ring's rounding
(``2^-16``) is not simulated.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import numpy as np
import torch

from spherecal.spherefed.algorithms.base import parameter_mask
from spherecal.spherefed.fl import aggregated_keys, load_state_vector, state_vector
from spherecal.spherefed.losses import make_loss
from spherecal.spherefed.network import Net, build_model
from spherecal.spherefed.privacy.charge import dpsgd_charge
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.dpsgd import DPSGDConfig, dp_local_train
from spherecal.spherefed.privacy.dpsgd_step import clipped_gradient_sum

__all__ = [
    "Sites",
    "local_sigma",
    "plan_sigma",
    "train_central",
    "train_distributed",
    "train_local",
]

Sites = list[tuple[torch.Tensor, torch.Tensor]]


@functools.lru_cache(maxsize=256)
def plan_sigma(
    epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    *,
    max_grad_norm: float,
    min_contributors: int,
) -> float:
    """The smallest σ (to a ratio 1.0001) whose distributed plan charges at most
    ``epsilon`` for ``steps`` steps at rate ``sample_rate`` — what a deployment that
    fixes ``q`` and the number of steps sets ``[privacy] dpsgd_noise_multiplier`` to.
    Cached: each accountant call costs about half a second (Opacus's fractional
    orders), and distributed and central DP-SGD ask for the same σ."""

    def eps(sigma: float) -> float:
        plan = DistributedDpsgdPlan(sigma, sample_rate, max_grad_norm, min_contributors)
        return plan.charge(steps, delta).epsilon

    lo, hi = 0.2, 200.0
    if eps(hi) > epsilon:
        raise ValueError(f"ε = {epsilon} needs σ > {hi} at q = {sample_rate}, {steps} steps")
    while hi / lo > 1.0001:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if eps(mid) > epsilon else (lo, mid)
    return hi


def train_distributed(
    spec: Any,
    sites: Sites,
    plan: DistributedDpsgdPlan,
    *,
    steps: int,
    lr: float,
    expected_batch: float,
    noise: bool,
    rng: np.random.Generator,
) -> Net:
    """``steps`` distributed DP-SGD steps from a fresh model of ``spec`` (plain SGD on
    the trainable entries, the noisy sum over ``expected_batch``)."""
    model = build_model(spec)
    keys = aggregated_keys(model)
    mask = parameter_mask(model, keys)
    theta = state_vector(model, keys)
    length = theta.shape[0]
    ring = plan.ring_noise(length, len(sites))
    # every site contributes: the honest sum of all shares (ring units², back to reals)
    sd = math.sqrt(ring.total_variance(len(sites) - plan.colluders)) * 2.0**-plan.scale_bits
    for _ in range(steps):
        total = np.zeros(length)
        for x, y in sites:
            total += clipped_gradient_sum(
                model,
                x,
                y,
                loss="mse",
                max_grad_norm=plan.max_grad_norm,
                sample_rate=plan.sample_rate,
                rng=rng,
            ).vector
        if noise:
            total += rng.normal(0.0, sd, size=length)
        theta = theta - lr * mask * total / expected_batch
        load_state_vector(model, theta, keys)
    return model


def _opacus_ready(model: Net) -> Net:
    for module in model.modules():  # in-place activations break Opacus's backward hooks
        if getattr(module, "inplace", False):
            module.inplace = False  # type: ignore[assignment]
    return model


def train_central(
    spec: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    sigma: float,
    clip: float,
    rate_batches: int,
    steps: int,
    lr: float,
    delta: float,
    seed: int,
) -> tuple[Net, float]:
    """Opacus DP-SGD on the pooled data (Poisson rate ``1/rate_batches``, the sum over
    the expected batch, plain SGD): the trained model and Opacus's own ε."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    model = _opacus_ready(build_model(spec))
    n = int(x.shape[0])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr)
    loader = DataLoader(TensorDataset(x, y), batch_size=math.ceil(n / rate_batches))
    loss_fn = make_loss("mse")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp")
        private, optimizer, loader = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=clip,
            noise_generator=torch.Generator().manual_seed(seed),
        )
    done = 0
    private.train()
    while done < steps:
        for xb, yb in loader:
            if done >= steps:
                break
            optimizer.zero_grad()
            if xb.shape[0] > 0:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    loss_fn(private(xb), yb).backward()
            optimizer.step()
            done += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps = float(engine.get_epsilon(delta))
    trained = {k.removeprefix("_module."): v for k, v in private.state_dict().items()}
    out = build_model(spec)
    out.load_state_dict(trained)
    return out, eps


@functools.lru_cache(maxsize=1024)
def local_sigma(n: int, batch: int, rounds: int, epsilon: float, delta: float) -> float:
    """The smallest σ whose Opacus-style local run (rate 1/⌈n/b⌉, that many steps per
    round, ``rounds`` rounds) stays within ε (bisection to a ratio 1.0004)."""
    batches = max(1, math.ceil(n / min(batch, n)))
    rate, steps = 1.0 / batches, batches * rounds
    lo, hi = 0.3, 500.0
    for _ in range(20):
        mid = math.sqrt(lo * hi)
        if dpsgd_charge(mid, rate, steps, delta, max_grad_norm=1.0).epsilon > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


def train_local(
    spec: Any,
    sites: Sites,
    *,
    rounds: int,
    batch: int,
    clip: float,
    lr: float,
    epsilon: float,
    delta: float,
) -> tuple[Net, list[float]]:
    """FedAvg over sites that each train one epoch of local DP-SGD per round, each at
    the σ that keeps its own ε within ``epsilon``: the model and those σ."""
    model = build_model(spec)
    keys = aggregated_keys(model)
    theta = state_vector(model, keys)
    sigmas = [local_sigma(int(x.shape[0]), batch, rounds, epsilon, delta) for x, _ in sites]
    for _ in range(rounds):
        delta_sum, weight = np.zeros_like(theta), 0
        for (x, y), sigma in zip(sites, sigmas, strict=True):
            local = build_model(spec)
            load_state_vector(local, theta, keys)
            cfg = DPSGDConfig(
                epochs=1,
                batch_size=batch,
                lr=lr,
                momentum=0.0,
                max_grad_norm=clip,
                noise_multiplier=sigma,
                delta=delta,
            )
            dp_local_train(local, x, y, cfg)
            n = int(x.shape[0])
            delta_sum += n * (state_vector(local, keys) - theta)
            weight += n
        theta = theta + delta_sum / weight
    load_state_vector(model, theta, keys)
    return model, sigmas
