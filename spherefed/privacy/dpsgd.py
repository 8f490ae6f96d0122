"""DP-SGD local training of the feature extractor through Opacus, charged to the ledger.

Abadi et al. 2016 via Opacus's :class:`~opacus.PrivacyEngine`: Poisson-sampled
minibatches (sample rate ``q = batch_size / n``), per-example gradient clipping at
``max_grad_norm`` and Gaussian noise ``σ = noise_multiplier · max_grad_norm`` on the
summed gradient. The fixed SphereFed classifier is a *buffer* (no gradient), so only
the extractor is trained — and only its parameters are clipped and noised; the
unit-norm feature map and the classifier cost nothing. Models must use GroupNorm
(BatchNorm mixes examples within a batch and has no per-example gradient; Opacus's
validator refuses it, and so do we, before training).

ε is Opacus's RDP accountant on the sampled Gaussian mechanism; the returned
:class:`~spherecal.spherefed.privacy.charge.PrivacyCharge` carries the same curve on the
ledger's orders so DP-SGD composes with the calibration releases.

What is *not* exact here, and documented as such: Opacus draws its Gaussian noise
with torch's floating-point sampler (``secure_mode=False``; ``secure_mode=True``
needs ``torchcsprng``, which is not installed). The integer-exact noise of
:mod:`spherecal.crypto.dp` covers the calibration statistics only.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from spherecal.spherefed.losses import make_loss
from spherecal.spherefed.privacy.charge import PrivacyCharge, dpsgd_charge

__all__ = [
    "DPSGDConfig",
    "DPSGDResult",
    "UnsupportedModel",
    "dp_local_train",
    "empty_batch_gradients",
]


class UnsupportedModel(ValueError):
    """The model has layers without per-example gradients (e.g. BatchNorm)."""


@dataclass(frozen=True)
class DPSGDConfig:
    """Local DP-SGD settings. Give ``noise_multiplier`` or ``target_epsilon``."""

    epochs: int = 1
    batch_size: int = 32
    """Expected batch size; the sample rate is ``batch_size / n``."""
    lr: float = 0.1
    momentum: float = 0.0
    max_grad_norm: float = 1.0
    noise_multiplier: float | None = 1.0
    target_epsilon: float | None = None
    delta: float = 1e-5
    loss: str = "mse"

    def __post_init__(self) -> None:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        if self.epochs < 1 or self.batch_size < 1 or not self.max_grad_norm > 0:
            raise ValueError("epochs, batch_size and max_grad_norm must be positive")
        make_loss(self.loss)


@dataclass(frozen=True)
class DPSGDResult:
    epsilon: float
    """Opacus's RDP-accountant ε at ``delta``."""
    delta: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    mean_loss: float
    charge: PrivacyCharge


def empty_batch_gradients(params: Sequence[torch.Tensor]) -> None:
    """Give each parameter the per-example gradients of an empty batch (none), so
    that Opacus's step clips nothing and adds its noise to a zero sum: DP-SGD's
    guarantee counts that step like any other (Abadi et al.'s noisy step with an
    empty sample), and without them Opacus refuses the step."""
    for p in params:
        p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype)  # type: ignore[attr-defined]


def dp_local_train(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: DPSGDConfig
) -> DPSGDResult:
    """Train ``model`` in place with DP-SGD on ``(x, y)``; return ε and the ledger charge."""
    # Imported here, not at the top: every participant imports this module (for
    # UnsupportedModel), and Opacus's import costs seconds a non-DP-SGD one never uses.
    from opacus import PrivacyEngine
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise UnsupportedModel(
            "DP-SGD needs per-example gradients; unsupported layers: "
            + "; ".join(str(e) for e in errors[:5])
        )
    n = int(x.shape[0])
    if n == 0:
        raise ValueError("no training examples")
    work = copy.deepcopy(model)
    for module in work.modules():  # in-place activations break Opacus's backward hooks
        if getattr(module, "inplace", False):
            module.inplace = False  # type: ignore[assignment]
    work.train()
    params = [p for p in work.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum)
    loader = DataLoader(TensorDataset(x, y), batch_size=min(config.batch_size, n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # secure_mode and "optimal alpha" notices
        engine = PrivacyEngine(accountant="rdp")
        if config.target_epsilon is not None:
            private, optimizer, loader = engine.make_private_with_epsilon(
                module=work,
                optimizer=optimizer,
                data_loader=loader,
                target_epsilon=config.target_epsilon,
                target_delta=config.delta,
                epochs=config.epochs,
                max_grad_norm=config.max_grad_norm,
            )
        else:
            private, optimizer, loader = engine.make_private(
                module=work,
                optimizer=optimizer,
                data_loader=loader,
                noise_multiplier=config.noise_multiplier,
                max_grad_norm=config.max_grad_norm,
            )
    loss_fn = make_loss(config.loss)
    steps, loss_sum = 0, 0.0
    for _ in range(config.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            if xb.shape[0] == 0:
                # Poisson sampling draws an empty batch (probability (1 − q)^n a step):
                # the step still adds its noise — the guarantee counts every step —
                # from per-example gradients of none (Opacus clips an empty batch)
                empty_batch_gradients(params)
                optimizer.step()
                steps += 1
                continue
            loss = loss_fn(private(xb), yb)
            with warnings.catch_warnings():  # Opacus's hooks on input-free modules
                warnings.simplefilter("ignore", UserWarning)
                loss.backward()
            optimizer.step()
            steps += 1
            loss_sum += float(loss.detach())
    with torch.no_grad():
        trained = {k.removeprefix("_module."): v for k, v in private.state_dict().items()}
        model.load_state_dict(trained)
    sigma = float(optimizer.noise_multiplier)
    sample_rate = 1.0 / len(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps = float(engine.get_epsilon(config.delta))
    charge = dpsgd_charge(
        sigma, sample_rate, steps, config.delta, max_grad_norm=config.max_grad_norm
    )
    return DPSGDResult(
        epsilon=eps,
        delta=config.delta,
        noise_multiplier=sigma,
        sample_rate=sample_rate,
        steps=steps,
        mean_loss=loss_sum / max(steps, 1),
        charge=charge,
    )
