"""The participant's local data: its own files, or its slice of a shared dataset.

Slice mode reproduces ``spherefed.runner.prepare_data`` bit for bit — each
participant loads the dataset, splits off validation, partitions with the run's seed
and keeps partition ``k`` — so that a simulated federation trains on exactly the
data the reference runner gives participant ``k``. The local *test* split is the
reference test split partitioned with the same scheme under seed
``derive_seed(seed, "partition", "test")`` (no minimum size); the slices cover the
test split exactly once, so summing every participant's correct/total counts gives
the reference runner's test accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spherefed.data import ArrayDataset, load_dataset
from spherefed.fl import derive_seed
from spherefed.partition import partition
from spherefed.runner import ReferenceConfig, prepare_data

from .settings import DataSettings

__all__ = ["LocalData", "load_local_data"]


@dataclass(frozen=True)
class LocalData:
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    image_shape: tuple[int, int, int]
    name: str

    @property
    def train_size(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def test_size(self) -> int:
        return int(self.test_y.shape[0])


def _tensors(ds: ArrayDataset) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(ds.x), torch.from_numpy(ds.y)


def local_test_slices(settings: DataSettings, test: ArrayDataset, n: int) -> list[ArrayDataset]:
    """The reference test split partitioned into ``n`` local test splits."""
    parts = partition(
        test.y,
        n,
        scheme=settings.partition,
        alpha=settings.alpha if settings.partition == "dirichlet" else None,
        shards_per_client=settings.shards_per_client if settings.partition == "shards" else None,
        seed=derive_seed(settings.seed, "partition", "test"),
        min_size=0,
    )
    return [test.subset(p) for p in parts]


def load_local_data(settings: DataSettings) -> LocalData:
    if settings.slice_index is None or settings.slice_of is None:
        splits = load_dataset(
            settings.dataset, root=settings.root, seed=settings.seed, samples=settings.samples
        )
        train, test = splits.train, splits.test
        name = f"{settings.dataset} (whole)"
    else:
        config = ReferenceConfig(
            dataset=settings.dataset,
            data_root=settings.root,
            samples=settings.samples,
            participants=settings.slice_of,
            partition=settings.partition,
            alpha=settings.alpha,
            shards_per_client=settings.shards_per_client,
            validation_fraction=settings.validation_fraction,
            seed=settings.seed,
        )
        data = prepare_data(config)
        train = data.participant(settings.slice_index)
        test = local_test_slices(settings, data.test, settings.slice_of)[settings.slice_index]
        name = f"{settings.dataset} slice {settings.slice_index}/{settings.slice_of}"
    train_x, train_y = _tensors(train)
    test_x, test_y = _tensors(test)
    return LocalData(train_x, train_y, test_x, test_y, train.num_classes, train.image_shape, name)
