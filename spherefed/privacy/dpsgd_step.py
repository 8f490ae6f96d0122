"""One site's share of a distributed DP-SGD step: Poisson sampling at the federation's
rate ``q``, per-example gradients clipped to ``C``, summed — no averaging, no noise.

Why a sum and not a mean: DP-SGD (Abadi et al. 2016, Algorithm 1) bounds each
record's influence on the *sum* of clipped gradients by ``C`` (the L2 sensitivity);
the federation's sum of the sites' sums is then the central algorithm's sum over the
union of the data, sampled with the same rate. The noise (each site's share, in the
ring, :mod:`spherecal.crypto.dp`) and the division by the expected batch size
``q·N`` happen elsewhere: the noise at the site before masking, the division at the
coordinator on the unmasked noisy sum.

The sampling randomness is the site's own (``os.urandom``): the amplification by
subsampling assumes the adversary does not know which records were drawn, so a seed
the coordinator hands out would void it. The draw itself is NumPy's float sampler,
not an exact Bernoulli; the per-example gradients are torch's float32 (Opacus makes
the same choices).

Per-example gradients come from ``torch.func`` (``vmap`` over ``grad`` of the loss of
one example), in chunks so that memory stays ``chunk × parameters``. Only
trainable parameters have gradients; the other entries of the
:func:`~spherecal.spherefed.fl.state_vector` layout (buffers) are zero in the sum,
and the coordinator moves trainable entries only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from spherecal.spherefed.fl import aggregated_keys
from spherecal.spherefed.losses import make_loss

__all__ = ["ClippedSum", "clipped_gradient_sum", "poisson_sample"]

CHUNK = 256


@dataclass(frozen=True)
class ClippedSum:
    """A site's clipped gradient sum (state-vector layout) and what produced it."""

    vector: npt.NDArray[np.float64]
    batch_size: int
    """Records drawn this step (never leaves the site: only the noisy sum does)."""
    clipped: int
    """Records whose gradient norm exceeded ``C`` and was scaled down to it."""


def _one_example_loss(name: str, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """:func:`~spherecal.spherefed.losses.make_loss` ``(name)`` of a batch of one,
    written on a one-hot target so that ``vmap`` can batch it (tested equal)."""
    t = target.to(logits.dtype)
    if name == "mse":  # SphereFed Eq. 5
        return ((logits - t) ** 2).sum()
    return -(t * torch.log_softmax(logits, dim=-1)).sum()


def poisson_sample(
    n: int, rate: float, rng: np.random.Generator | None = None
) -> npt.NDArray[np.int64]:
    """Indices of the records in this step's batch: each independently with
    probability ``rate``. Without ``rng`` the draw is keyed from ``os.urandom``."""
    if not 0 < rate <= 1:
        raise ValueError(f"sample rate must lie in (0, 1], got {rate}")
    gen = rng if rng is not None else np.random.default_rng(int.from_bytes(os.urandom(16)))
    return np.flatnonzero(gen.random(n) < rate).astype(np.int64)


def clipped_gradient_sum(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    max_grad_norm: float,
    sample_rate: float,
    rng: np.random.Generator | None = None,
    indices: npt.NDArray[np.int64] | None = None,
) -> ClippedSum:
    """Σ over a Poisson sample of ``(x, y)`` of each example's loss gradient, clipped
    to L2 norm ``max_grad_norm`` over all trainable parameters together (the
    sensitivity of the sum), in the :func:`~spherecal.spherefed.fl.state_vector`
    layout of ``model`` at its current weights. ``indices`` fixes the batch: a site
    above its step's bound on records draws it within a random subset
    (``spherecal.participant.distributed_dpsgd.step_input``); tests fix it outright."""
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm}")
    from torch.func import functional_call, grad, vmap

    keys = aggregated_keys(model)
    state = model.state_dict()
    batch = indices if indices is not None else poisson_sample(int(x.shape[0]), sample_rate, rng)
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    make_loss(loss)  # an unknown name fails here, before any gradient
    classes = int(getattr(model, "num_classes", 0))
    if not classes and len(x):
        with torch.no_grad():
            classes = int(model(x[:1]).shape[1])

    def example_loss(
        p: dict[str, torch.Tensor], xi: torch.Tensor, ti: torch.Tensor
    ) -> torch.Tensor:
        out = functional_call(model, (p, frozen, buffers), (xi.unsqueeze(0),))[0]
        return _one_example_loss(loss, out, ti)

    per_example = vmap(grad(example_loss), in_dims=(None, 0, 0), randomness="different")
    total = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    clipped = 0
    was_training = model.training
    model.train()
    try:
        for start in range(0, len(batch), CHUNK):
            idx = torch.from_numpy(batch[start : start + CHUNK])
            # one-hot targets outside vmap (``one_hot`` is data-dependent control flow)
            targets = torch.nn.functional.one_hot(y[idx].long(), num_classes=classes)
            grads = per_example(params, x[idx], targets)
            # per-parameter norms in the gradients' own float32 (a float64 copy of
            # chunk × parameters cost 3× the gradients themselves), combined in
            # float64; the clipped sum as one matrix-vector product per parameter,
            # the running total in float64
            norms = torch.sqrt(
                sum(
                    torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).double() ** 2
                    for g in grads.values()
                )
            )
            factor = torch.clamp(max_grad_norm / torch.clamp(norms, min=1e-300), max=1.0)
            clipped += int((norms > max_grad_norm).sum())
            for name, g in grads.items():
                flat = factor.to(g.dtype) @ g.reshape(g.shape[0], -1)
                total[name] += flat.reshape(g.shape[1:]).double()
    finally:
        model.train(was_training)
    parts = [
        total[k].reshape(-1).numpy() if k in total else np.zeros(state[k].numel(), dtype=np.float64)
        for k in keys
    ]
    vector = np.concatenate(parts) if parts else np.zeros(0)
    return ClippedSum(vector=vector, batch_size=int(len(batch)), clipped=clipped)
