"""Distributed DP-SGD against central and local DP-SGD at the same record-level ε
(issue #25, item 1's accuracy): MNIST-1D, 10 sites, Dirichlet α = 0.1, mlp, the
fixed orthonormal SphereFed classifier, MSE; test accuracy of the trained model
(no calibration).

Every private method is charged ε = ``--epsilon`` at δ = ``--delta`` for the whole
training by the same accountant (Opacus's RDP for the sampled Gaussian,
``spherecal.spherefed.privacy.charge.dpsgd_charge``):

``central``          Opacus DP-SGD on the pooled data (the upper bound): Poisson rate
                     ``q``, clipping ``C``, multiplier ``σ``, the sum divided by the
                     expected batch ``q·N``, plain SGD at ``--lr``; ``steps`` the most
                     that stay within ε.
``distributed``      the service's algorithm (``spherefed.privacy.dpsgd_step``): each
                     site samples at ``q`` and sums its clipped gradients, the noise
                     of the sum is the ring plan's (``DistributedDpsgdPlan.ring_noise``)
                     at ``t`` = all 10 sites guaranteed — the same ``σ, q, C, steps``
                     as central.
``distributed_t6``   the same with the service's default for 10 sites: ``t = 6``
                     guaranteed contributors (a majority), so 4 may drop out; with all
                     10 contributing the sum carries ``10/6`` of the planned variance
                     (charged at ``t``: the same ε, more noise).
``local``            each site runs DP-SGD on its own data (Opacus, batch
                     ``--local-batch``, one epoch per round, ``--local-rounds``
                     rounds of FedAvg), each site's σ calibrated so that its own
                     ε over all rounds is ``--epsilon``.
``nonprivate``       the distributed algorithm without noise (and without clipping
                     effects removed: same ``C``, ``q``, steps) — what the noise costs.

The ring's noise is drawn as a Gaussian of exactly the plan's total variance (at
these variances, some 10⁹ ring units², the exact Skellam sum is Gaussian for all that
matters to accuracy; the exact path is tested in
``tests/unit/privacy/test_dpsgd_step.py``). The grid's rounding (``2^-16``) is not
simulated.

    PYTHONPATH=. python bench/dpsgd.py --seeds 0,1,2 > out.json

Prints one JSON document (stdout); progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

import spherecal.spherefed.reference as runner
from spherecal.spherefed.algorithms.base import parameter_mask
from spherecal.spherefed.fl import aggregated_keys, count_correct, load_state_vector, state_vector
from spherecal.spherefed.losses import make_loss
from spherecal.spherefed.network import Net, build_model
from spherecal.spherefed.privacy.charge import dpsgd_charge
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.dpsgd import DPSGDConfig, dp_local_train
from spherecal.spherefed.privacy.dpsgd_step import clipped_gradient_sum


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _accuracy(model: Net, x: torch.Tensor, y: torch.Tensor) -> float:
    return count_correct(model, x, y) / int(y.shape[0])


def _distributed(
    spec: Any,
    sites: list[tuple[torch.Tensor, torch.Tensor]],
    plan: DistributedDpsgdPlan,
    *,
    steps: int,
    lr: float,
    expected_batch: float,
    noise: bool,
    rng: np.random.Generator,
) -> Net:
    model = build_model(spec)
    keys = aggregated_keys(model)
    mask = parameter_mask(model, keys)
    theta = state_vector(model, keys)
    length = theta.shape[0]
    ring = plan.ring_noise(length, len(sites))
    # all sites contribute: the honest sum of every site's share (ring units²)
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


def _central(
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
) -> tuple[Net, float, float]:
    """Opacus on the pooled data; (model, Opacus's ε, its sample rate)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    model = build_model(spec)
    for module in model.modules():  # in-place activations break Opacus's backward hooks
        if getattr(module, "inplace", False):
            module.inplace = False  # type: ignore[assignment]
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
    return out, eps, 1.0 / len(loader)


def _local_sigma(n: int, batch: int, rounds: int, epsilon: float, delta: float) -> float:
    """The smallest σ whose Opacus-style local run (rate 1/⌈n/b⌉, that many steps per
    round) stays within ε over all rounds (bisection)."""
    batches = max(1, math.ceil(n / min(batch, n)))
    rate, steps = 1.0 / batches, batches * rounds
    lo, hi = 0.3, 500.0
    for _ in range(20):  # hi/lo ≤ 1.0004 at the end
        mid = math.sqrt(lo * hi)
        if dpsgd_charge(mid, rate, steps, delta, max_grad_norm=1.0).epsilon > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


def _local(
    spec: Any,
    sites: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    rounds: int,
    batch: int,
    clip: float,
    lr: float,
    epsilon: float,
    delta: float,
) -> tuple[Net, list[float]]:
    model = build_model(spec)
    keys = aggregated_keys(model)
    theta = state_vector(model, keys)
    sigmas = [_local_sigma(int(x.shape[0]), batch, rounds, epsilon, delta) for x, _ in sites]
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


def run_one(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    config = runner.ReferenceConfig(
        dataset="mnist1d", participants=args.participants, alpha=args.alpha, model="mlp", seed=seed
    )
    data = runner.prepare_data(config)
    spec = runner.model_spec(config, data)
    sites = []
    for k in range(len(data.parts)):
        ds = data.participant(k)
        sites.append((torch.from_numpy(ds.x), torch.from_numpy(ds.y)))
    n_total = sum(int(x.shape[0]) for x, _ in sites)
    test_x, test_y = torch.from_numpy(data.test.x), torch.from_numpy(data.test.y)
    q = 1.0 / args.rate_batches
    plan = DistributedDpsgdPlan(
        args.sigma, q, max_grad_norm=args.clip, min_contributors=args.participants
    )
    steps = plan.steps_within(args.epsilon, args.delta)
    charged = plan.charge(steps, args.delta).epsilon
    expected = q * n_total
    rng = np.random.default_rng([seed, 25, 1])
    out: dict[str, Any] = {
        "seed": seed,
        "records": n_total,
        "site_records": [int(x.shape[0]) for x, _ in sites],
        "sample_rate": q,
        "expected_batch": expected,
        "steps": steps,
        "epsilon_charged": charged,
        "accuracy": {},
    }
    _log(f"seed {seed}: N = {n_total}, q = {q:g}, {steps} steps, ε = {charged:.4f}")
    for name, p, noise in (
        ("distributed", plan, True),
        ("distributed_t6", DistributedDpsgdPlan(args.sigma, q, args.clip, 6), True),
        ("nonprivate", plan, False),
    ):
        if name not in args.methods:
            continue
        t = time.perf_counter()
        model = _distributed(
            spec, sites, p, steps=steps, lr=args.lr, expected_batch=expected, noise=noise, rng=rng
        )
        out["accuracy"][name] = _accuracy(model, test_x, test_y)
        _log(f"  {name}: {out['accuracy'][name]:.4f} ({time.perf_counter() - t:.0f}s)")
    if "central" not in args.methods:
        out["seconds"] = time.perf_counter() - t0
        return out
    t = time.perf_counter()
    pooled_x = torch.cat([x for x, _ in sites])
    pooled_y = torch.cat([y for _, y in sites])
    model, eps_opacus, rate = _central(
        spec,
        pooled_x,
        pooled_y,
        sigma=args.sigma,
        clip=args.clip,
        rate_batches=args.rate_batches,
        steps=steps,
        lr=args.lr,
        delta=args.delta,
        seed=seed,
    )
    out["accuracy"]["central"] = _accuracy(model, test_x, test_y)
    out["central_opacus_epsilon"] = eps_opacus
    out["central_sample_rate"] = rate
    _log(
        f"  central: {out['accuracy']['central']:.4f} (Opacus ε {eps_opacus:.4f}, "
        f"{time.perf_counter() - t:.0f}s)"
    )
    if "local" not in args.methods:
        out["seconds"] = time.perf_counter() - t0
        return out
    t = time.perf_counter()
    model, sigmas = _local(
        spec,
        sites,
        rounds=args.local_rounds,
        batch=args.local_batch,
        clip=args.clip,
        lr=args.local_lr,
        epsilon=args.epsilon,
        delta=args.delta,
    )
    out["accuracy"]["local"] = _accuracy(model, test_x, test_y)
    out["local_sigmas"] = sigmas
    _log(f"  local: {out['accuracy']['local']:.4f} ({time.perf_counter() - t:.0f}s)")
    out["seconds"] = time.perf_counter() - t0
    return out


def _gap(mean: dict[str, float], a: str, b: str) -> float | None:
    return mean[a] - mean[b] if a in mean and b in mean else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0")
    p.add_argument("--participants", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--sigma", type=float, default=1.5)
    p.add_argument("--rate-batches", type=int, default=10, help="q = 1/this")
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=10.0)
    p.add_argument("--methods", default="distributed,distributed_t6,nonprivate,central,local")
    p.add_argument("--local-rounds", type=int, default=10)
    p.add_argument("--local-batch", type=int, default=32)
    p.add_argument("--local-lr", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    args.methods = tuple(args.methods.split(","))
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    runs = [run_one(int(s), args) for s in args.seeds.split(",")]
    methods = list(runs[0]["accuracy"])
    mean = {m: float(np.mean([r["accuracy"][m] for r in runs])) for m in methods}
    print(
        json.dumps(
            {
                "bench": "dpsgd",
                "config": vars(args),
                "runs": runs,
                "mean_accuracy": mean,
                "distributed_minus_central": _gap(mean, "distributed", "central"),
                "distributed_minus_local": _gap(mean, "distributed", "local"),
                "seconds": time.perf_counter() - t0,
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "load_average_at_end": list(os.getloadavg()),
                "torch": torch.__version__,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
