"""Federated learning primitives: local training and the server step, on sums.

The server step is written on *sums* — ``Σ_k n_k (θ_k − θ)`` and ``Σ_k n_k`` — rather
than on a list of client models, because that is exactly what secure aggregation can
deliver: the coordinator learns the weighted sum of updates and nothing per client.

- **FedAvg** (McMahan et al. 2017): ``θ ← θ + Σ_k n_k Δ_k / Σ_k n_k``.
- **FedProx** (Li et al. 2020): the same server step; the local objective adds
  ``(μ/2)‖θ − θ_global‖²``.

:func:`local_train` also takes an optional ``objective`` (a loss computed from the
model and a batch, e.g. FedUV's regularised loss or CE with a temperature) and an
optional ``gradient_correction`` (SCAFFOLD's ``c − c_k``, added to every minibatch
gradient). Both default to ``None``, which is the FedAvg/FedProx path exactly; the
other algorithms (FedNova, FedOpt, SCAFFOLD) and the rival fixes live in
:mod:`spherecal.spherefed.algorithms`.

Determinism: all randomness in local training (minibatch order) comes from a
``torch.Generator`` seeded by :func:`derive_seed` from ``(run seed, round,
participant)``, so the in-process reference runner and a participant process at
another site make the same steps from the same inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from spherecal.spherefed.losses import make_loss

#: A local training objective: ``objective(model, x_batch, y_batch) -> scalar loss``.
LocalObjective = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]

#: State entries never aggregated: the fixed classifier is rebuilt from its seed by
#: every participant and overwritten only by calibration.
FIXED_STATE_SUFFIXES: tuple[str, ...] = ("head.fixed_weight",)


def derive_seed(seed: int, *labels: object) -> int:
    """A 63-bit seed from a base seed and labels, e.g. ``derive_seed(s, "train", r, k)``.

    SHA-256 based, so it is stable across processes, Python versions and platforms
    (unlike ``hash()``), and distinct labels give independent streams.
    """
    text = "/".join([str(int(seed)), *map(str, labels)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def model_seeds(seed: int) -> tuple[int, int]:
    """``(classifier_seed, init_seed)`` of a federation's model, derived from its seed.

    One definition, because every participant process, the coordinator and the
    reference runner must build byte-identical initial weights and fixed classifiers.
    """
    return derive_seed(seed, "classifier") % (2**32), derive_seed(seed, "init")


def aggregated_keys(model: nn.Module) -> list[str]:
    """Floating-point state entries that federated averaging moves, in state order.

    Parameters and float buffers (BatchNorm running statistics) — but not the fixed
    classifier, nor integer buffers such as ``num_batches_tracked``.
    """
    return [
        name
        for name, value in model.state_dict().items()
        if value.is_floating_point() and not name.endswith(FIXED_STATE_SUFFIXES)
    ]


def state_vector(model: nn.Module, keys: list[str] | None = None) -> np.ndarray:
    """The aggregated state flattened into one float64 vector (the wire layout)."""
    state = model.state_dict()
    names = aggregated_keys(model) if keys is None else keys
    if not names:
        return np.zeros(0)
    return torch.cat([state[k].detach().reshape(-1).double() for k in names]).numpy()


def load_state_vector(model: nn.Module, vector: np.ndarray, keys: list[str] | None = None) -> None:
    """Write a flat vector (from :func:`state_vector`'s layout) back into the model."""
    state = model.state_dict()
    names = aggregated_keys(model) if keys is None else keys
    vec = np.asarray(vector, dtype=np.float64)
    expected = sum(state[k].numel() for k in names)
    if vec.shape != (expected,):
        raise ValueError(f"state vector must have {expected} entries, got shape {vec.shape}")
    if not np.isfinite(vec).all():
        raise ValueError("state vector contains NaN or Inf")
    offset = 0
    with torch.no_grad():
        for k in names:
            t = state[k]
            n = t.numel()
            t.copy_(torch.from_numpy(vec[offset : offset + n]).reshape(t.shape).to(t.dtype))
            offset += n


@dataclass(frozen=True)
class LocalTrainConfig:
    """Local optimisation settings (SGD with momentum, as the papers use)."""

    epochs: int = 2
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    loss: str = "mse"
    prox_mu: float = 0.0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError("epochs and batch_size must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.prox_mu < 0:
            raise ValueError(f"prox_mu must be >= 0, got {self.prox_mu}")
        make_loss(self.loss)


@dataclass(frozen=True)
class LocalUpdate:
    """What a participant sends after local training (summable across participants).

    ``weighted_delta = n_k (θ_k − θ_global)`` in :func:`state_vector` layout.
    """

    weighted_delta: np.ndarray
    num_samples: int
    num_steps: int
    mean_loss: float


def _correction_tensors(
    model: nn.Module, keys: list[str], vector: np.ndarray
) -> list[torch.Tensor]:
    """Slice a :func:`state_vector`-layout vector into one tensor per trainable parameter.

    The order is that of ``model.parameters()`` (the optimiser's order); entries of the
    layout that are buffers, not parameters, are simply not used.
    """
    state = model.state_dict()
    vec = np.asarray(vector, dtype=np.float64)
    expected = sum(state[k].numel() for k in keys)
    if vec.shape != (expected,):
        raise ValueError(f"gradient correction must have {expected} entries, got {vec.shape}")
    offsets, offset = {}, 0
    for k in keys:
        offsets[k] = (offset, state[k].numel())
        offset += state[k].numel()
    out = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name not in offsets:
            raise ValueError(f"trainable parameter {name!r} is not in the aggregated state")
        lo, size = offsets[name]
        out.append(torch.from_numpy(vec[lo : lo + size]).reshape(p.shape).to(p.dtype))
    return out


def local_steps(n: int, config: LocalTrainConfig) -> int:
    """The optimiser steps :func:`local_train` takes on ``n`` examples: ``epochs``
    passes of ``⌈n/B⌉`` batches, less a one-example tail batch (skipped there)."""
    if n <= 0:
        return 0
    batches = -(-n // config.batch_size)
    if n >= 2 and n % config.batch_size == 1:
        batches -= 1
    return config.epochs * batches


def local_train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LocalTrainConfig,
    *,
    seed: int,
    objective: LocalObjective | None = None,
    gradient_correction: np.ndarray | None = None,
) -> LocalUpdate:
    """Train ``model`` in place on ``(x, y)`` and return its weighted update.

    FedProx's proximal term is added when ``config.prox_mu > 0``. A participant with
    no data returns a zero update of weight 0 (it changes nothing in the average).

    ``objective`` replaces ``config.loss`` (``loss(model(x), y)``) by an arbitrary loss
    of the model and the batch — FedUV's regularisers need the features as well as the
    logits. ``gradient_correction`` (in :func:`state_vector` layout) is added to every
    minibatch gradient before the optimiser step: SCAFFOLD's ``y ← y − η(g + c − c_k)``
    (Karimireddy et al. 2020, Algorithm 1). With both ``None`` this is exactly
    FedAvg/FedProx local SGD.
    """
    keys = aggregated_keys(model)
    start = state_vector(model, keys)
    n = int(x.shape[0])
    if n == 0:
        return LocalUpdate(np.zeros_like(start), 0, 0, 0.0)
    loss_fn = make_loss(config.loss)
    corrections = (
        _correction_tensors(model, keys, gradient_correction)
        if gradient_correction is not None
        else []
    )
    params = [p for p in model.parameters() if p.requires_grad]
    anchors = [p.detach().clone() for p in params] if config.prox_mu > 0 else []
    opt = torch.optim.SGD(
        params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    gen = torch.Generator().manual_seed(seed)
    model.train()
    steps, loss_sum = 0, 0.0  # ends at local_steps(n, config)
    for _ in range(config.epochs):
        order = torch.randperm(n, generator=gen)
        for lo in range(0, n, config.batch_size):
            idx = order[lo : lo + config.batch_size]
            if idx.numel() < 2 and n >= 2:
                # A 1-sample tail batch breaks BatchNorm and adds noise; skip it.
                continue
            opt.zero_grad()
            if objective is None:
                loss = loss_fn(model(x[idx]), y[idx])
            else:
                loss = objective(model, x[idx], y[idx])
            if anchors:
                prox = sum(((p - a) ** 2).sum() for p, a in zip(params, anchors, strict=True))
                loss = loss + 0.5 * config.prox_mu * prox
            loss.backward()
            if corrections:
                for p, c in zip(params, corrections, strict=True):
                    if p.grad is None:
                        p.grad = c.clone()
                    else:
                        p.grad.add_(c)
            opt.step()
            steps += 1
            loss_sum += float(loss.detach())
    end = state_vector(model, keys)
    if not np.isfinite(end).all():
        raise FloatingPointError(
            f"local training diverged (lr={config.lr}, loss={config.loss}); lower the lr"
        )
    return LocalUpdate((end - start) * n, n, steps, loss_sum / max(steps, 1))


def server_step(global_vector: np.ndarray, delta_sum: np.ndarray, weight_sum: float) -> np.ndarray:
    """FedAvg/FedProx server update from sums: ``θ + Σ n_k Δ_k / Σ n_k``."""
    if weight_sum <= 0:
        raise ValueError("no samples in this round's updates (weight sum is 0)")
    if delta_sum.shape != global_vector.shape:
        raise ValueError(
            f"update has {delta_sum.shape} entries but the model has {global_vector.shape}"
        )
    return global_vector + delta_sum / weight_sum


@torch.no_grad()
def count_correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> int:
    """Number of top-1 correct predictions of ``model`` on ``(x, y)``, in eval mode.

    Counts (not fractions) are what federated evaluation sums across participants.
    """
    was_training = model.training
    model.eval()
    correct = 0
    for lo in range(0, x.shape[0], batch_size):
        correct += int((model(x[lo : lo + batch_size]).argmax(1) == y[lo : lo + batch_size]).sum())
    model.train(was_training)
    return correct


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Top-1 accuracy (fraction in [0, 1]) of ``model`` on ``(x, y)``; NaN when empty."""
    if x.shape[0] == 0:
        return float("nan")
    return count_correct(model, x, y, batch_size) / int(x.shape[0])
