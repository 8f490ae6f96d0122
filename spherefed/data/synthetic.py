"""Synthetic data that needs no file: class-conditional Gaussians whose means lie on
the unit sphere, with an optional per-participant feature shift (FedUV §4.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spherecal.spherefed.data.arrays import ArrayDataset, DatasetSplits

# ----------------------------------------------------------------------------- synthetic


@dataclass(frozen=True)
class SyntheticConfig:
    """Shape of the ``synthetic`` dataset (see :func:`load_synthetic`).

    Attributes:
        num_classes: ``C``; any number (for ``C`` above the model's feature dimension
            use the ``tammes`` classifier).
        dim: input dimension ``D`` (samples are stored as ``(N, D, 1, 1)``, the
            tabular layout the ``mlp`` extractor reads).
        train_per_class / test_per_class: samples per class in each split.
        noise: expected norm of a sample's deviation from its (unit-norm) class
            mean: per-coordinate standard deviation ``noise / √D``.
        feature_shift: norm of each participant's private offset (0 = no feature
            shift). Applied by the reference runner after partitioning, see
            :func:`apply_feature_shift`.
    """

    num_classes: int = 10
    dim: int = 32
    train_per_class: int = 150
    test_per_class: int = 50
    noise: float = 1.5
    feature_shift: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_classes", "dim", "train_per_class", "test_per_class"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"synthetic {name} must be a positive int, got {value!r}")
        if self.train_per_class < 2:
            raise ValueError("synthetic train_per_class must be >= 2 (validation is split off)")
        for name in ("noise", "feature_shift"):
            value = float(getattr(self, name))
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"synthetic {name} must be a finite number >= 0, got {value}")


def load_synthetic(config: SyntheticConfig | None = None, *, seed: int = 0) -> DatasetSplits:
    """Class-conditional Gaussians with means on the unit sphere.

    ``μ_c`` = a seeded standard Gaussian vector in ``R^D`` normalised to unit length
    (so the means are spread uniformly over the sphere), and a sample of class ``c``
    is ``x = μ_c + (noise/√D)·ε`` with ``ε ~ N(0, I_D)``. Train and test are drawn
    independently from the same distribution (test is balanced); labels are sorted
    by nothing — the order is a seeded shuffle. Pure numpy from
    ``np.random.default_rng(seed)``, so every process builds the same bytes.
    """
    cfg = config or SyntheticConfig()
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((cfg.num_classes, cfg.dim))
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    scale = cfg.noise / np.sqrt(cfg.dim)

    def draw(per_class: int, name: str) -> ArrayDataset:
        y = np.repeat(np.arange(cfg.num_classes, dtype=np.int64), per_class)
        y = y[rng.permutation(y.shape[0])]
        x = means[y] + scale * rng.standard_normal((y.shape[0], cfg.dim))
        return ArrayDataset(
            x.astype(np.float32).reshape(-1, cfg.dim, 1, 1), y, cfg.num_classes, name
        )

    return DatasetSplits(
        train=draw(cfg.train_per_class, "synthetic/train"),
        test=draw(cfg.test_per_class, "synthetic/test"),
    )


def feature_shift_offsets(num_domains: int, dim: int, magnitude: float, *, seed: int) -> np.ndarray:
    """``num_domains`` seeded random directions in ``R^dim``, each of norm ``magnitude``."""
    rng = np.random.default_rng(seed)
    offsets = rng.standard_normal((num_domains, dim))
    offsets /= np.linalg.norm(offsets, axis=1, keepdims=True)
    return offsets * float(magnitude)


def apply_feature_shift(
    dataset: ArrayDataset, domains: np.ndarray, offsets: np.ndarray
) -> ArrayDataset:
    """Add ``offsets[domains[i]]`` to sample ``i``: a per-domain covariate shift.

    This is the feature-shift non-IID setting of FedUV (§4.1, PACS/Office-Home: each
    client sees its own domain): ``P(x | y)`` differs across participants while the
    class structure is shared. Labels are untouched.
    """
    d = np.asarray(domains)
    if d.shape != (len(dataset),) or not np.issubdtype(d.dtype, np.integer):
        raise ValueError(f"domains must be {len(dataset)} integers, got {d.shape} {d.dtype}")
    flat = dataset.x.reshape(len(dataset), -1)
    if offsets.ndim != 2 or offsets.shape[1] != flat.shape[1]:
        raise ValueError(f"offsets must be (domains, {flat.shape[1]}), got {offsets.shape}")
    if d.size and (int(d.min()) < 0 or int(d.max()) >= offsets.shape[0]):
        raise ValueError(f"domain ids must lie in [0, {offsets.shape[0]})")
    shifted = (flat + offsets[d]).astype(np.float32).reshape(dataset.x.shape)
    return ArrayDataset(shifted, dataset.y, dataset.num_classes, dataset.name)
