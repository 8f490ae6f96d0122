"""Containers for a dataset as plain numpy arrays, and the stratified train/test split.

Numpy (not a torch ``Dataset`` class) because partitions (``spherecal.spherefed.partition``)
index by label arrays, and because a participant process needs nothing more than
its own arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import TensorDataset

# ----------------------------------------------------------------------------- containers


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """An immutable labelled image set.

    Attributes:
        x: ``float32`` images, shape ``(N, C, H, W)``, all finite.
        y: ``int64`` labels, shape ``(N,)``, each in ``[0, num_classes)``.
        num_classes: ``C`` — the width of the one-hot targets and of ``U``; taken
            from the whole dataset, not from the labels present (a client's subset
            keeps the global class count).
        name: a human-readable name (``"digits/train"``...).

    Validated on construction so that a bad array fails here, with a clear
    message, rather than deep inside training or statistics code. ``eq=False``:
    comparing arrays with ``==`` is ambiguous, so datasets compare by identity.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str

    def __post_init__(self) -> None:
        x, y = self.x, self.y
        if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
            raise ValueError(f"{self.name}: x and y must be numpy arrays")
        if x.dtype != np.float32:
            raise ValueError(f"{self.name}: x must be float32, got {x.dtype}")
        if x.ndim != 4:
            raise ValueError(f"{self.name}: x must have shape (N, C, H, W), got {x.shape}")
        if y.dtype != np.int64:
            raise ValueError(f"{self.name}: y must be int64, got {y.dtype}")
        if y.ndim != 1:
            raise ValueError(f"{self.name}: y must have shape (N,), got {y.shape}")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{self.name}: {x.shape[0]} images but {y.shape[0]} labels")
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int | np.integer):
            raise ValueError(f"{self.name}: num_classes must be an int, got {self.num_classes!r}")
        if self.num_classes < 1:
            raise ValueError(f"{self.name}: num_classes must be >= 1, got {self.num_classes}")
        object.__setattr__(self, "num_classes", int(self.num_classes))
        if y.size and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise ValueError(
                f"{self.name}: labels must lie in [0, {self.num_classes}), "
                f"got range [{int(y.min())}, {int(y.max())}]"
            )
        if not np.isfinite(x).all():
            raise ValueError(f"{self.name}: x contains NaN or Inf")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one sample — what ``build_extractor`` needs."""
        _, c, h, w = self.x.shape
        return int(c), int(h), int(w)

    def subset(self, indices: np.ndarray | Sequence[int]) -> ArrayDataset:
        """The samples at ``indices`` (e.g. one client's partition), same ``num_classes``.

        Indices must be integers (a boolean mask is refused: a mask of the wrong
        length would silently select the wrong samples).
        """
        idx = np.asarray(indices)
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(
                f"{self.name}: subset indices must be a 1-D integer array, "
                f"got shape {idx.shape} dtype {idx.dtype}"
            )
        n = len(self)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(f"{self.name}: subset indices must lie in [0, {n})")
        return ArrayDataset(
            x=self.x[idx], y=self.y[idx], num_classes=self.num_classes, name=self.name
        )

    def to_tensor_dataset(self) -> TensorDataset:
        """A ``TensorDataset(x float32, y int64)``; shares memory with the arrays."""
        return TensorDataset(
            torch.from_numpy(np.ascontiguousarray(self.x)),
            torch.from_numpy(np.ascontiguousarray(self.y)),
        )


@dataclass(frozen=True, eq=False)
class DatasetSplits:
    """A train and a test :class:`ArrayDataset` with the same class count and image shape."""

    train: ArrayDataset
    test: ArrayDataset

    def __post_init__(self) -> None:
        if self.train.num_classes != self.test.num_classes:
            raise ValueError(
                f"train has {self.train.num_classes} classes but test has {self.test.num_classes}"
            )
        if self.train.image_shape != self.test.image_shape:
            raise ValueError(
                f"train images are {self.train.image_shape} but test images are "
                f"{self.test.image_shape}"
            )

    @property
    def num_classes(self) -> int:
        return self.train.num_classes


# ----------------------------------------------------------------------------- splitting


def stratified_split(
    labels: np.ndarray, *, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified train/test split → ``(train_idx, test_idx)``, sorted int64.

    The test set has ``round(N · test_fraction)`` samples (at least 1, leaving at
    least 1 for training). Each class contributes ``⌊n_c · f⌋`` test samples and
    the remaining test slots go to the classes with the largest fractional parts
    (ties by class index), so every class's test share is within one sample of
    ``f`` — stratification works even for a class with a single sample (it just
    lands on one side). Uses only ``np.random.default_rng(seed)``, so the split is
    identical in any process and independent of scikit-learn's version.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError("labels must be a 1-D integer array")
    n = int(y.shape[0])
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if n < 2:
        raise ValueError(f"need at least 2 samples to split, got {n}")
    n_test = min(max(round(n * float(test_fraction)), 1), n - 1)
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    exact = counts * (n_test / n)
    quota = np.floor(exact).astype(np.int64)
    short = n_test - int(quota.sum())
    if short > 0:
        order = np.argsort(-(exact - quota), kind="stable")
        quota[order[:short]] += 1

    rng = np.random.default_rng(seed)
    # Random order within each class: shuffle, then stable-sort by class.
    perm = rng.permutation(n)
    grouped = perm[np.argsort(inverse[perm], kind="stable")]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(n) - np.repeat(starts, counts)  # position within its class block
    is_test = rank < np.repeat(quota, counts)
    test_idx = np.sort(grouped[is_test]).astype(np.int64)
    train_idx = np.sort(grouped[~is_test]).astype(np.int64)
    return train_idx, test_idx
