"""A user's own feature extractor, as a site would bring one (``docs/models.md``).

Used by the tests as ``tests.custom_extractor:tiny_cnn``: importable in every process
the tests start (the repository root is on their ``PYTHONPATH``).
"""

from __future__ import annotations

import torch
from torch import nn


class TinyCNN(nn.Module):
    """Conv(3×3) → ReLU → global average pool → Linear: a network unlike the built-ins."""

    def __init__(self, in_channels: int, feature_dim: int) -> None:
        super().__init__()
        self.feature_dim = feature_dim
        self.conv = nn.Conv2d(in_channels, 16, kernel_size=3, padding=1)
        self.fc = nn.Linear(16, feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        out: torch.Tensor = self.fc(h)
        return out


def tiny_cnn(
    *, in_channels: int, image_size: tuple[int, int], feature_dim: int | None
) -> nn.Module:
    """The factory contract: keyword arguments, a module with ``feature_dim``."""
    del image_size  # global pooling: any size
    return TinyCNN(in_channels, feature_dim or 24)


def no_feature_dim(
    *, in_channels: int, image_size: tuple[int, int], feature_dim: int | None
) -> nn.Module:
    """Breaks the contract: no declared feature dimension."""
    return nn.Flatten()


def wrong_width(
    *, in_channels: int, image_size: tuple[int, int], feature_dim: int | None
) -> nn.Module:
    """Breaks the contract: declares 7 features but computes ``C·H·W``."""
    net = nn.Flatten()
    net.feature_dim = 7  # type: ignore[assignment]
    return net


def not_a_module(
    *, in_channels: int, image_size: tuple[int, int], feature_dim: int | None
) -> object:
    """Breaks the contract: returns something that is not an ``nn.Module``."""
    return object()
