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
import os
import platform
import sys
import time
from typing import Any

import numpy as np
import torch

import spherecal.spherefed.reference as runner
from spherecal.spherefed.fl import count_correct
from spherecal.spherefed.network import Net
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.dpsgd_compare import (
    site_tensors,
    train_central,
    train_distributed,
    train_local,
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _accuracy(model: Net, x: torch.Tensor, y: torch.Tensor) -> float:
    return count_correct(model, x, y) / int(y.shape[0])


def run_one(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    config = runner.ReferenceConfig(
        dataset="mnist1d", participants=args.participants, alpha=args.alpha, model="mlp", seed=seed
    )
    data = runner.prepare_data(config)
    spec = runner.model_spec(config, data)
    sites, test_x, test_y = site_tensors(data)
    n_total = sum(int(x.shape[0]) for x, _ in sites)
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
        model = train_distributed(
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
    model, eps_opacus = train_central(
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
    out["central_sample_rate"] = q
    _log(
        f"  central: {out['accuracy']['central']:.4f} (Opacus ε {eps_opacus:.4f}, "
        f"{time.perf_counter() - t:.0f}s)"
    )
    if "local" not in args.methods:
        out["seconds"] = time.perf_counter() - t0
        return out
    t = time.perf_counter()
    model, sigmas = train_local(
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
