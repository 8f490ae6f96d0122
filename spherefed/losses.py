"""Training losses: MSE on one-hot targets (SphereFed Eq. 5) and cross-entropy.

Why MSE: with unit-norm features and unit-norm fixed classifier rows every logit lies
in ``[-1, 1]``, and softmax + CE is scale-sensitive — it barely separates classes at
that scale without a temperature. SphereFed therefore trains with
``(1/N) Σ_i ‖W z_i − e_{y_i}‖²`` (Eq. 5: squared error summed over the C outputs,
averaged over the batch).

An honest caveat: the FedFN paper (Kim et al. 2023, appendix D.5) could not reproduce
SphereFed's numbers and observed that MSE on unit-norm outputs needs learning rates
roughly 10× larger than CE to train at all. The reference runner therefore sweeps the
learning rate rather than reusing CE's; see docs/reference.md for what we measured.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LOSS_NAMES: tuple[str, ...] = ("mse", "ce")


def mse_onehot_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """SphereFed Eq. 5: squared error to one-hot, summed over classes, mean over batch."""
    target = F.one_hot(labels.long(), num_classes=logits.shape[1]).to(logits.dtype)
    return ((logits - target) ** 2).sum(dim=1).mean()


def ce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy, mean over the batch."""
    return F.cross_entropy(logits, labels.long())


def make_loss(name: str) -> LossFn:
    """The loss function called ``name`` (``"mse"`` or ``"ce"``)."""
    if name == "mse":
        return mse_onehot_loss
    if name == "ce":
        return ce_loss
    raise ValueError(f"unknown loss {name!r}; expected one of {LOSS_NAMES}")
