"""Datasets as plain numpy arrays: embedded digits, CIFAR-10/100, an institution's ``.npz``.

Every loader returns a :class:`DatasetSplits` of two :class:`ArrayDataset` s holding
``float32`` images ``(N, C, H, W)`` and ``int64`` labels ``(N,)``. Numpy (not a torch
``Dataset`` class) because partitions (``spherecal.spherefed.partition``) index by label
arrays, and because a participant process needs nothing more than its own arrays.

A ``synthetic`` dataset (:func:`load_synthetic`) needs no file at all: class-conditional
Gaussians whose means lie on the unit sphere, with an optional per-participant feature
shift (:func:`apply_feature_shift`), so that larger ``C`` and ``l`` and feature-shift
non-IID settings (FedUV §4.1) can be tried without downloads.

``mnist1d`` (:func:`load_mnist1d`) is MNIST-1D (Greydanus 2020), generated
procedurally by the ``mnist1d`` package and cached on disk: a harder small benchmark
on which calibration matters (digits saturates at 95–98 %).

No network access anywhere: the digits come from scikit-learn's bundled copy, MNIST-1D
from the package's procedural generator (never its download path), CIFAR
from the standard python-pickle directory already on disk, institution data from a
``.npz`` file. Loading never executes code from a file: ``.npz`` goes through
``np.load(allow_pickle=False)`` and the CIFAR pickles through
:class:`RestrictedUnpickler`.

One module per source: :mod:`.arrays` (containers, split), :mod:`.digits`,
:mod:`.mnist1d`, :mod:`.cifar`, :mod:`.npz`, :mod:`.synthetic`; this package re-exports
their public names and dispatches by name (:func:`load_dataset`).
"""

from __future__ import annotations

from pathlib import Path

from spherecal.spherefed.data.arrays import ArrayDataset, DatasetSplits, stratified_split
from spherecal.spherefed.data.cifar import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    RestrictedUnpickler,
    load_cifar,
)
from spherecal.spherefed.data.digits import load_digits
from spherecal.spherefed.data.mnist1d import (
    MNIST1D_ARGS,
    MNIST1D_ENV_CACHE,
    MNIST1D_SAMPLES,
    load_mnist1d,
    mnist1d_cache_dir,
)
from spherecal.spherefed.data.npz import load_npz, load_npz_pair
from spherecal.spherefed.data.synthetic import (
    SyntheticConfig,
    apply_feature_shift,
    feature_shift_offsets,
    load_synthetic,
)

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "DATASET_NAMES",
    "ArrayDataset",
    "DatasetSplits",
    "MNIST1D_ARGS",
    "MNIST1D_ENV_CACHE",
    "MNIST1D_SAMPLES",
    "RestrictedUnpickler",
    "SyntheticConfig",
    "apply_feature_shift",
    "feature_shift_offsets",
    "load_cifar",
    "load_dataset",
    "load_digits",
    "load_mnist1d",
    "load_npz",
    "load_npz_pair",
    "load_synthetic",
    "mnist1d_cache_dir",
    "stratified_split",
]

DATASET_NAMES: tuple[str, ...] = ("digits", "mnist1d", "cifar10", "cifar100", "npz", "synthetic")
"""Every name :func:`load_dataset` accepts."""


# ----------------------------------------------------------------------------- dispatch


def load_dataset(
    name: str,
    *,
    root: str | Path | None = None,
    seed: int = 0,
    synthetic: SyntheticConfig | None = None,
    samples: int | None = None,
    test_fraction: float = 0.25,
) -> DatasetSplits:
    """Load a dataset by name (one of :data:`DATASET_NAMES`).

    ``test_fraction`` is the stratified test share for ``digits`` and for an ``npz``
    holding only ``x``, ``y`` (CIFAR keeps its official split).

    - ``"digits"``: :func:`load_digits` (``root`` is ignored; ``seed`` picks the split).
    - ``"mnist1d"``: :func:`load_mnist1d` with ``samples`` (default
      :data:`MNIST1D_SAMPLES`); ``root``, if given, is the cache directory; ``seed``
      unused (the benchmark's data and split are fixed).
    - ``"cifar10"`` / ``"cifar100"``: :func:`load_cifar` from ``root`` (required;
      the official split, ``seed`` unused).
    - ``"npz"``: :func:`load_npz` with ``root`` = the file path (required).
    - ``"synthetic"``: :func:`load_synthetic` with ``synthetic`` (default
      :class:`SyntheticConfig`) and ``seed``; ``root`` is ignored.
    """
    if samples is not None and name != "mnist1d":
        raise ValueError(f"samples= is only read for 'mnist1d', not for {name!r}")
    if name == "digits":
        return load_digits(seed=seed, test_fraction=test_fraction)
    if name == "mnist1d":
        return load_mnist1d(
            num_samples=MNIST1D_SAMPLES if samples is None else samples, cache_dir=root
        )
    if name in ("cifar10", "cifar100"):
        if root is None:
            raise ValueError(f"dataset {name!r} needs root= the directory holding the CIFAR files")
        return load_cifar(root, num_classes=10 if name == "cifar10" else 100)
    if name == "npz":
        if root is None:
            raise ValueError("dataset 'npz' needs root= the path of the .npz file")
        return load_npz(root, seed=seed, test_fraction=test_fraction)
    if name == "synthetic":
        return load_synthetic(synthetic, seed=seed)
    raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)}")
