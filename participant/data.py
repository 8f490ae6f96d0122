"""The participant's local data: its own files, or its slice of a shared dataset.

Slice mode reproduces ``spherecal.spherefed.reference.prepare_data`` bit for bit — each
participant loads the dataset, splits off validation, partitions with the run's seed
and keeps partition ``k`` — so that a simulated federation trains on exactly the
data the reference runner gives participant ``k``. The local *test* split is the
reference test split partitioned with the same scheme under seed
``derive_seed(seed, "partition", "test")`` (no minimum size); the slices cover the
test split exactly once, so summing every participant's correct/total counts gives
the reference runner's test accuracy. The local *validation* split is the reference
validation split partitioned the same way under ``derive_seed(seed, "partition",
"validation")``, so the summed validation counts are the reference's validation
accuracy (the calibrators' grid is chosen there).

In whole mode (a real site with its own files) ``validation_fraction`` of the site's
train split is held out by a seeded stratified split
(:func:`~spherecal.spherefed.data.arrays.stratified_split`, seed ``derive_seed(seed,
"validation")`` — the reference runner's rule, applied to the site's own data), so
the same files always give the same split; the rest trains. With
``validation_fraction = 0`` nothing is held out: such a site contributes zero
validation counts, and when no site has any the coordinator uses default
hyper-parameters and reports them as such (never a choice made on test).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from spherecal.participant.settings import DataSettings
from spherecal.spherefed.data import ArrayDataset, load_dataset, load_npz_pair
from spherecal.spherefed.data.arrays import stratified_split
from spherecal.spherefed.fl import derive_seed
from spherecal.spherefed.network import ModelSpec
from spherecal.spherefed.partition import partition
from spherecal.spherefed.reference import FederationData, ReferenceConfig, prepare_data

__all__ = [
    "DataOutsideModel",
    "LocalData",
    "check_fits_model",
    "load_local_data",
    "load_local_slices",
]


@dataclass(frozen=True)
class LocalData:
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    image_shape: tuple[int, int, int]
    name: str
    val_x: torch.Tensor | None = None
    val_y: torch.Tensor | None = None
    """The local validation split: the calibrators' grid is scored here, never on test."""

    @property
    def train_size(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def test_size(self) -> int:
        return int(self.test_y.shape[0])


class DataOutsideModel(ValueError):
    """This site's data does not fit the federation's model (:func:`check_fits_model`).

    The message, for the site's own log, names both sides; :attr:`public` is what the
    site may tell the coordinator when it refuses the plan for it: the images' shape
    (which the join already carried) or, for labels, only that they do not fit the
    plan's class count — never which labels the site holds."""

    def __init__(self, message: str, *, public: str) -> None:
        super().__init__(message)
        self.public = public


def check_fits_model(data: LocalData, spec: ModelSpec) -> None:
    """This site's data against the federation's model, checked *here*: labels below
    the model's class count (a site without the highest classes takes part as it is)
    and the images' shape. The join carries the images' shape but not the site's
    label range (``max(label) + 1`` would tell the coordinator whether the site holds
    any record of the highest classes), so this check is the site's own. Raises
    :class:`DataOutsideModel`, whose message names both sides."""
    size = spec.image_size
    image_shape = (spec.in_channels, *((size, size) if isinstance(size, int) else size))
    num_classes = spec.num_classes
    if tuple(data.image_shape) != tuple(image_shape):
        message = (
            f"local images are (channels, height, width) = {tuple(data.image_shape)}, the "
            f"federation's model takes {tuple(image_shape)}"
        )
        raise DataOutsideModel(message, public=message)
    if data.num_classes > num_classes:
        raise DataOutsideModel(
            f"local labels reach class {data.num_classes - 1} ([data] num_classes or the "
            f"highest label), the federation's model has {num_classes} classes",
            public=(
                f"this site's labels do not fit the plan's model of {num_classes} classes "
                "(which labels it holds stays in the site's own log)"
            ),
        )


def fingerprint(data: LocalData, split: str) -> bytes:
    """SHA-256 of one local split's examples and labels (``train``, ``test`` or
    ``validation``): the release ledger's key for "the same data" across
    federations (``spherecal.participant.release_ledger``). Computed from the
    tensors the site computes on, so a renamed dataset is the same data."""
    pairs = {
        "train": (data.train_x, data.train_y),
        "test": (data.test_x, data.test_y),
        "validation": (data.val_x, data.val_y),
    }
    x, y = pairs[split]
    h = hashlib.sha256(b"spherecal/local-data/v1\0" + split.encode() + b"\0")
    for t in (x, y):
        if t is None:
            h.update(b"none")
            continue
        array = np.ascontiguousarray(t.numpy())
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(array.tobytes())
    return h.digest()


def _tensors(ds: ArrayDataset) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(ds.x), torch.from_numpy(ds.y)


def local_test_slices(
    settings: DataSettings, test: ArrayDataset, n: int, *, split: str = "test"
) -> list[ArrayDataset]:
    """The reference test (or validation) split partitioned into ``n`` local splits
    (seed ``derive_seed(seed, "partition", split)``); together they cover it once.

    No minimum size: with more participants than test samples (1,000 participants
    on digits' 449 test images) an IID split gives some participants an empty test
    slice — the same permutation cut as ``spherecal.spherefed.partition.iid_partition``, which
    refuses empty parts because it partitions *training* data."""
    seed = derive_seed(settings.seed, "partition", split)
    if settings.partition == "iid" and n > len(test.y):
        perm = np.random.default_rng(seed).permutation(len(test.y))
        return [test.subset(np.sort(p).astype(np.int64)) for p in np.array_split(perm, n)]
    parts = partition(
        test.y,
        n,
        scheme=settings.partition,
        alpha=settings.alpha if settings.partition == "dirichlet" else None,
        shards_per_client=settings.shards_per_client if settings.partition == "shards" else None,
        seed=seed,
        min_size=0,
    )
    return [test.subset(p) for p in parts]


def load_local_data(settings: DataSettings) -> LocalData:
    return load_local_slices([settings])[0]


def load_local_slices(many: Sequence[DataSettings]) -> list[LocalData]:
    """:func:`load_local_data` for many participants at once: settings that differ
    only in ``slice_index`` share one load-split-partition of the dataset (a host of
    hundreds of virtual participants would otherwise repeat it hundreds of times).
    The slices are exactly the ones :func:`load_local_data` gives one by one."""
    prepared: dict[DataSettings, tuple[FederationData, list[ArrayDataset], list[ArrayDataset]]] = {}
    out: list[LocalData] = []
    for settings in many:
        if settings.slice_index is None or settings.slice_of is None:
            out.append(_load_whole(settings))
            continue
        key = replace(settings, slice_index=0)
        if key not in prepared:
            data = prepare_data(
                ReferenceConfig(
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
            )
            prepared[key] = (
                data,
                local_test_slices(settings, data.test, settings.slice_of),
                local_test_slices(settings, data.validation, settings.slice_of, split="validation"),
            )
        data, tests, validations = prepared[key]
        k = settings.slice_index
        train, test = data.participant(k), tests[k]
        name = f"{settings.dataset} slice {k}/{settings.slice_of}"
        out.append(_local(train, test, name, settings, validations[k]))
    return out


def _load_whole(settings: DataSettings) -> LocalData:
    if settings.test_root is not None:
        if settings.root is None:
            raise ValueError("[data] root is required with test_root")
        splits = load_npz_pair(settings.root, settings.test_root)
    else:
        splits = load_dataset(
            settings.dataset,
            root=settings.root,
            seed=settings.seed,
            samples=settings.samples,
            test_fraction=settings.test_fraction,
        )
    train, validation = split_off_validation(splits.train, settings)
    return _local(train, splits.test, f"{settings.dataset} (whole)", settings, validation)


def split_off_validation(
    train: ArrayDataset, settings: DataSettings
) -> tuple[ArrayDataset, ArrayDataset | None]:
    """A whole-mode site's (train, validation): ``validation_fraction`` of its train
    split, stratified and seeded (``derive_seed(seed, "validation")``), or ``None``
    with ``validation_fraction = 0``. A train split too small to spare a sample
    (fewer than 2) is refused: the site would train on nothing."""
    if settings.validation_fraction == 0.0:
        return train, None
    if len(train.y) < 2:
        raise ValueError(
            f"[data] validation_fraction = {settings.validation_fraction}: the train split "
            f"has {len(train.y)} sample(s), too few to hold any out (set it to 0)"
        )
    train_idx, val_idx = stratified_split(
        train.y,
        test_fraction=settings.validation_fraction,
        seed=derive_seed(settings.seed, "validation"),
    )
    return train.subset(train_idx), train.subset(val_idx)


def _local(
    train: ArrayDataset,
    test: ArrayDataset,
    name: str,
    settings: DataSettings,
    validation: ArrayDataset | None = None,
) -> LocalData:
    num_classes = train.num_classes
    if settings.num_classes is not None:  # a site without the highest classes
        if settings.num_classes < num_classes:
            raise ValueError(
                f"[data] num_classes = {settings.num_classes}, but the data has labels up to "
                f"{num_classes - 1}"
            )
        num_classes = settings.num_classes
    train_x, train_y = _tensors(train)
    test_x, test_y = _tensors(test)
    val_x, val_y = _tensors(validation) if validation is not None else (None, None)
    return LocalData(
        train_x,
        train_y,
        test_x,
        test_y,
        num_classes,
        train.image_shape,
        name,
        val_x=val_x,
        val_y=val_y,
    )
