"""Classification heads: what sits between the feature extractor and the logits.

- ``sphere`` — SphereFed (§4.1): ``FeatureNorm`` then the fixed classifier ``W``
  (no bias). ``W`` is a *buffer*, not a parameter: it receives no gradient, is never
  communicated during training (every participant rebuilds it from the seed), and
  calibration (FFC/CCVR) overwrites it once at the end.
- ``learnable`` — a plain bias-free linear layer on raw features (FedAvg-CE).
- ``fn`` — ``FeatureNorm`` then a learnable bias-free linear layer (FedFN, Kim et al. 2023, §4).
- ``fixed`` — the fixed classifier ``W`` on *raw* features, no ``FeatureNorm``: BABU
  (Oh et al. 2022: frozen random classifier) and the "Fix (R)" / "Fix (OU)" columns of
  SphereFed's ablation (Tab. 3), which fix the classifier without normalising.

All heads expose ``features(h)`` (the vector the linear map consumes, i.e. the ``z``
whose statistics FFC/CCVR collect) and ``weight`` (C×l) / ``set_weight`` so that
calibration treats every head the same way. Bias is omitted throughout, as the paper
does ("For simplicity, we omit the bias term"; Tab. 11 ``FC(..., bias=False)``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from spherecal.spherefed.classifier import fixed_classifier

HEAD_KINDS: tuple[str, ...] = ("sphere", "learnable", "fn", "fixed")
UNIT_NORM_HEADS: frozenset[str] = frozenset({"sphere", "fn"})
"""The heads whose features pass :class:`FeatureNorm` (``‖z‖ = 1``): the statistics'
invariants and entry bounds rely on it."""


class FeatureNorm(nn.Module):
    """``z = h / ‖h‖₂`` row-wise (SphereFed §4.1): features live on the unit sphere."""

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h / h.norm(dim=1, keepdim=True).clamp_min(self.eps)


class Head(nn.Module):
    """Common interface: ``features`` → ``z``, ``forward`` → logits ``z Wᵀ``."""

    num_classes: int
    feature_dim: int

    def features(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def weight(self) -> torch.Tensor:
        raise NotImplementedError

    def set_weight(self, weight: np.ndarray | torch.Tensor) -> None:
        """Replace the classifier (C×l) in place, e.g. with an FFC/CCVR solution."""
        w = torch.as_tensor(np.asarray(weight), dtype=self.weight.dtype)
        if tuple(w.shape) != (self.num_classes, self.feature_dim):
            raise ValueError(
                f"classifier weight must be ({self.num_classes}, {self.feature_dim}), "
                f"got {tuple(w.shape)}"
            )
        if not torch.isfinite(w).all():
            raise ValueError("classifier weight contains NaN or Inf")
        with torch.no_grad():
            self.weight.copy_(w)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.features(h) @ self.weight.t()


class SphereHead(Head):
    """FeatureNorm + fixed classifier (SphereFed). ``W`` is a buffer: never trained."""

    fixed_weight: torch.Tensor

    def __init__(self, fixed_weight: np.ndarray | torch.Tensor) -> None:
        super().__init__()
        w = torch.as_tensor(np.asarray(fixed_weight), dtype=torch.float32).clone()
        if w.ndim != 2:
            raise ValueError(f"fixed classifier must be 2-D (C×l), got shape {tuple(w.shape)}")
        self.num_classes, self.feature_dim = int(w.shape[0]), int(w.shape[1])
        self.norm = FeatureNorm()
        self.register_buffer("fixed_weight", w)

    def features(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)

    @property
    def weight(self) -> torch.Tensor:
        return self.fixed_weight


class FixedHead(SphereHead):
    """Fixed classifier on raw features (BABU; SphereFed Tab. 3 "Fix" without "Norm").

    Same buffer as :class:`SphereHead` (``fixed_weight``: never trained, never
    aggregated), but the features are not projected onto the sphere.
    """

    def features(self, h: torch.Tensor) -> torch.Tensor:
        return h


class LearnableHead(Head):
    """Plain bias-free linear classifier on raw features (FedAvg with CE)."""

    def __init__(self, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.num_classes, self.feature_dim = num_classes, feature_dim
        self.linear = nn.Linear(feature_dim, num_classes, bias=False)

    def features(self, h: torch.Tensor) -> torch.Tensor:
        return h

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight


class FNHead(LearnableHead):
    """FeatureNorm + learnable bias-free linear classifier (FedFN)."""

    def __init__(self, feature_dim: int, num_classes: int) -> None:
        super().__init__(feature_dim, num_classes)
        self.norm = FeatureNorm()

    def features(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)


def make_head(
    kind: str,
    *,
    feature_dim: int,
    num_classes: int,
    classifier: str = "orthonormal",
    classifier_seed: int = 0,
) -> Head:
    """Build a head. ``classifier``/``classifier_seed`` only matter for ``sphere``/``fixed``."""
    if kind == "sphere":
        weight = fixed_classifier(num_classes, feature_dim, kind=classifier, seed=classifier_seed)
        return SphereHead(weight)
    if kind == "fixed":
        weight = fixed_classifier(num_classes, feature_dim, kind=classifier, seed=classifier_seed)
        return FixedHead(weight)
    if kind == "learnable":
        return LearnableHead(feature_dim, num_classes)
    if kind == "fn":
        return FNHead(feature_dim, num_classes)
    raise ValueError(f"unknown head {kind!r}; expected one of {HEAD_KINDS}")
