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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from spherecal.spherefed.algorithms.base import parameter_mask
from spherecal.spherefed.fl import aggregated_keys, load_state_vector, state_vector
from spherecal.spherefed.losses import make_loss
from spherecal.spherefed.network import Net, build_model
from spherecal.spherefed.privacy.accounting import ORDERS, dpsgd_rdp
from spherecal.spherefed.privacy.accounting import epsilon as epsilon_of
from spherecal.spherefed.privacy.charge import dpsgd_charge
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.dpsgd import DPSGDConfig, dp_local_train
from spherecal.spherefed.privacy.dpsgd_step import clipped_gradient_sum

if TYPE_CHECKING:  # reference imports the privacy package: only its type here
    from spherecal.spherefed.reference import FederationData

__all__ = [
    "Sites",
    "site_tensors",
    "local_sigma",
    "plan_sigma",
    "smallest_sigma",
    "train_central",
    "train_distributed",
    "train_local",
]

Sites = list[tuple[torch.Tensor, torch.Tensor]]


def site_tensors(data: FederationData) -> tuple[Sites, torch.Tensor, torch.Tensor]:
    """Each site's ``(x, y)`` and the test split's ``x``, ``y`` as tensors: the data
    every DP-SGD variant compared here trains and is scored on."""
    parts = (data.participant(k) for k in range(len(data.parts)))
    sites = [(torch.from_numpy(ds.x), torch.from_numpy(ds.y)) for ds in parts]
    return sites, torch.from_numpy(data.test.x), torch.from_numpy(data.test.y)


INTEGER_ORDERS: tuple[float, ...] = tuple(float(a) for a in ORDERS if float(a).is_integer())
"""The accountant's integer orders: Opacus computes these in closed form, the
fractional ones by a slow series (about 0.6 s per curve here)."""


def smallest_sigma(
    full: Callable[[float], float],
    fast: Callable[[float], float],
    target: float,
    *,
    ratio: float = 1.002,
) -> float:
    """The smallest σ (to ``ratio``) with ``full(σ) ≤ target``, for ε(σ) decreasing.

    ``fast`` is ε on a subset of the orders, so ``fast(σ) ≥ full(σ)``: a bisection
    on it (cheap) gives a σ that is within budget for ``full`` too, and a few calls
    of ``full`` below it bring σ down to the full accountant's smallest."""
    lo, hi = 0.2, 400.0
    if full(hi) > target:
        raise ValueError(f"ε = {target} needs σ > {hi}")
    while hi / lo > ratio:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fast(mid) > target else (lo, mid)
    lo = hi / 1.1
    if full(lo) <= target:  # the integer orders were far from the best order
        lo = 0.2
    while hi / lo > ratio:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if full(mid) > target else (lo, mid)
    return hi


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
    """The smallest σ (to a ratio 1.002) whose distributed plan charges at most
    ``epsilon`` for ``steps`` steps at rate ``sample_rate`` — what a deployment that
    fixes ``q`` and the number of steps sets ``[privacy] dpsgd_noise_multiplier`` to.
    Cached: distributed and central DP-SGD ask for the same σ."""

    def plan(sigma: float) -> DistributedDpsgdPlan:
        return DistributedDpsgdPlan(sigma, sample_rate, max_grad_norm, min_contributors)

    def full(sigma: float) -> float:
        return plan(sigma).charge(steps, delta).epsilon

    def fast(sigma: float) -> float:
        m = plan(sigma).realised_multiplier(min_contributors)
        curve = dpsgd_rdp(m, sample_rate, steps, orders=INTEGER_ORDERS)
        return epsilon_of(curve, delta, orders=INTEGER_ORDERS)[0]

    return smallest_sigma(full, fast, epsilon)


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
    """The smallest σ (to a ratio 1.002) whose Opacus-style local run (rate
    1/⌈n/b⌉, that many steps per round, ``rounds`` rounds) stays within ε."""
    batches = max(1, math.ceil(n / min(batch, n)))
    rate, steps = 1.0 / batches, batches * rounds

    def full(sigma: float) -> float:
        return dpsgd_charge(sigma, rate, steps, delta, max_grad_norm=1.0).epsilon

    def fast(sigma: float) -> float:
        curve = dpsgd_rdp(sigma, rate, steps, orders=INTEGER_ORDERS)
        return epsilon_of(curve, delta, orders=INTEGER_ORDERS)[0]

    return smallest_sigma(full, fast, epsilon)


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
