"""A classification network = feature extractor + head, built deterministically.

Every participant must start from the same initial weights and the same fixed
classifier, so :func:`build_model` seeds its own RNG scope (``torch.random.fork_rng``)
from the spec's seeds instead of relying on whatever the global RNG holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from spherecal.spherefed.custom import build_custom_extractor, is_custom
from spherecal.spherefed.heads import Head, make_head
from spherecal.spherefed.models import FeatureExtractor, build_extractor

_GLOBAL_RNG = threading.Lock()
"""Held while :func:`build_model` uses torch's process-global RNG: participants
hosted as threads of one process (``spherecal.engines.virtual``) build their models
concurrently, and interleaved draws from the one generator would give each a
different initialisation than it gets alone in its own process."""


class Net(nn.Module):
    """``logits = head(extractor(x))``; ``features(x)`` is the head's input ``z``."""

    def __init__(self, extractor: FeatureExtractor, head: Head) -> None:
        super().__init__()
        if extractor.feature_dim != head.feature_dim:
            raise ValueError(
                f"extractor gives {extractor.feature_dim}-d features but the head expects "
                f"{head.feature_dim}"
            )
        self.extractor = extractor
        self.head = head

    @property
    def feature_dim(self) -> int:
        return int(self.extractor.feature_dim)

    @property
    def num_classes(self) -> int:
        return int(self.head.num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The vector FFC/CCVR statistics are taken of (normalised for sphere/fn heads)."""
        return self.head.features(self.extractor(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.extractor(x))


@contextmanager
def classifier_swapped(model: Net, weight: np.ndarray | torch.Tensor | None) -> Iterator[Net]:
    """Temporarily replace ``model``'s classifier (e.g. by an FFC/CCVR solution).

    The original weight is restored on exit, also on error, so evaluating or saving a
    calibrated variant never leaves the shared model changed. ``None`` swaps nothing.
    """
    if weight is None:
        yield model
        return
    original = model.head.weight.detach().clone()
    model.head.set_weight(weight)
    try:
        yield model
    finally:
        model.head.set_weight(original)


@torch.no_grad()
def compute_features(model: Net, x: torch.Tensor, *, batch_size: int = 512) -> np.ndarray:
    """``model.features(x)`` in eval mode, batched, as float64 numpy (N×l).

    The batch size is part of the result's last bits (BLAS blocking), so the reference
    runner and the participant process both use this one function.
    """
    model.eval()
    chunks = [model.features(x[lo : lo + batch_size]) for lo in range(0, x.shape[0], batch_size)]
    return torch.cat(chunks).double().numpy() if chunks else np.zeros((0, model.feature_dim))


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild the same network in any process."""

    extractor: str = "digits_cnn"
    head: str = "sphere"
    norm: str = "group"
    classifier: str = "orthonormal"
    classifier_seed: int = 0
    init_seed: int = 0
    num_classes: int = 10
    in_channels: int = 1
    image_size: int | tuple[int, int] = 8
    feature_dim: int | None = None


def build_model(spec: ModelSpec) -> Net:
    """Build ``spec``'s network; same spec ⇒ identical parameters in any process
    (and in any thread: the seeded scope is held under a lock)."""
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        extractor: FeatureExtractor
        if is_custom(spec.extractor):  # a user's own network, "package.module:factory"
            size = spec.image_size
            extractor = build_custom_extractor(
                spec.extractor,
                in_channels=spec.in_channels,
                image_size=(size, size) if isinstance(size, int) else (size[0], size[1]),
                feature_dim=spec.feature_dim,
            )
        else:
            extractor = build_extractor(
                spec.extractor,
                in_channels=spec.in_channels,
                image_size=spec.image_size,
                norm=spec.norm,
                feature_dim=spec.feature_dim,
            )
        head = make_head(
            spec.head,
            feature_dim=extractor.feature_dim,
            num_classes=spec.num_classes,
            classifier=spec.classifier,
            classifier_seed=spec.classifier_seed,
        )
    return Net(extractor, head)
