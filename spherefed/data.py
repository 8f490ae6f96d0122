"""Datasets as plain numpy arrays: embedded digits, CIFAR-10/100, an institution's ``.npz``.

Every loader returns a :class:`DatasetSplits` of two :class:`ArrayDataset` s holding
``float32`` images ``(N, C, H, W)`` and ``int64`` labels ``(N,)``. Numpy (not a torch
``Dataset`` class) because partitions (``spherefed.partition``) index by label
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
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "DATASET_NAMES",
    "ArrayDataset",
    "DatasetSplits",
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
    "stratified_split",
]

DATASET_NAMES: tuple[str, ...] = ("digits", "mnist1d", "cifar10", "cifar100", "npz", "synthetic")
"""Every name :func:`load_dataset` accepts."""

# Per-channel statistics of the CIFAR training sets on the [0, 1] scale (the values
# computed from the training images themselves, as used by most CIFAR FL code).
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN: tuple[float, float, float] = (0.5071, 0.4865, 0.4409)
CIFAR100_STD: tuple[float, float, float] = (0.2673, 0.2564, 0.2762)


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


# ----------------------------------------------------------------------------- digits


def load_digits(*, seed: int = 0, test_fraction: float = 0.25) -> DatasetSplits:
    """scikit-learn's bundled 8×8 handwritten digits (1797 samples, 10 classes).

    Pixels are integers 0..16 and are divided by 16 to ``[0, 1]``; shape
    ``(N, 1, 8, 8)``. The train/test split is :func:`stratified_split` with
    ``seed`` — identical in every process, so the coordinator and all
    participants agree on it. Bundled with scikit-learn, hence no download.
    """
    from sklearn.datasets import load_digits as _sk_load_digits

    x_flat, y = _sk_load_digits(return_X_y=True)
    x = (np.asarray(x_flat, dtype=np.float64) / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y64 = np.asarray(y, dtype=np.int64)
    train_idx, test_idx = stratified_split(y64, test_fraction=test_fraction, seed=seed)
    return DatasetSplits(
        train=ArrayDataset(x[train_idx], y64[train_idx], 10, "digits/train"),
        test=ArrayDataset(x[test_idx], y64[test_idx], 10, "digits/test"),
    )


# ----------------------------------------------------------------------------- MNIST-1D

MNIST1D_SAMPLES = 12_000
"""Default MNIST-1D size (train + test) — the issue-11 benchmark size; the package's
own default is 5,000. Every other generator argument is the package's default."""

MNIST1D_ARGS: dict[str, Any] = {
    "train_split": 0.8,
    "template_len": 12,
    "padding": [36, 60],
    "scale_coeff": 0.4,
    "max_translation": 48,
    "corr_noise_scale": 0.25,
    "iid_noise_scale": 2e-2,
    "shear_scale": 0.75,
    "shuffle_seq": False,
    "final_seq_length": 40,
    "seed": 42,
}
"""The ``mnist1d`` package's default generator arguments (``get_dataset_args``, v0.0.2),
written out here so that the benchmark cannot drift with a package upgrade and the
cache key needs no import."""

MNIST1D_ENV_CACHE = "SPHERECAL_CACHE"
"""Environment variable naming the cache directory (default ``~/.cache/spherecal``)."""


def mnist1d_cache_dir() -> Path:
    """Where generated datasets are cached: ``$SPHERECAL_CACHE`` or ``~/.cache/spherecal``."""
    import os

    env = os.environ.get(MNIST1D_ENV_CACHE)
    return Path(env) if env else Path.home() / ".cache" / "spherecal"


def _mnist1d_generate(num_samples: int) -> dict[str, np.ndarray]:
    """Run the package's *procedural* generator (``make_dataset``), never ``get_dataset``:
    the latter tries to download a pickle and unpickles it. The generator seeds and
    draws from numpy's and Python's *global* RNGs, so both are saved and restored —
    loading a dataset must not change anyone else's random stream."""
    import random

    from mnist1d.data import make_dataset
    from mnist1d.utils import ObjectView

    args = ObjectView({**MNIST1D_ARGS, "num_samples": int(num_samples)})
    np_state, py_state = np.random.get_state(), random.getstate()  # noqa: NPY002
    try:
        raw = make_dataset(args)
    finally:
        np.random.set_state(np_state)  # noqa: NPY002
        random.setstate(py_state)
    return {k: np.asarray(raw[k]) for k in ("x", "y", "x_test", "y_test")}


def _mnist1d_key(num_samples: int) -> str:
    import hashlib
    import json

    text = json.dumps({**MNIST1D_ARGS, "num_samples": int(num_samples)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_mnist1d(
    *, num_samples: int = MNIST1D_SAMPLES, cache_dir: str | Path | None = None
) -> DatasetSplits:
    """MNIST-1D (Greydanus 2020): 10 classes of 40-sample 1-D signals.

    Generated by ``mnist1d.data.make_dataset`` with the package's default arguments
    (:data:`MNIST1D_ARGS`: template length 12, padding 36–60, translation ≤ 48,
    correlated noise 0.25, i.i.d. noise 0.02, shear 0.75, final length 40, **its seed
    42**) except
    ``num_samples``; the package's own 80/20 train/test split is kept (a fixed test
    set, like CIFAR's). Samples are stored as ``(N, 40, 1, 1)`` — the tabular layout
    the ``mlp`` extractor reads. Float32 after generation in float64.

    Generation takes seconds for 12,000 samples, so the arrays are cached in
    ``cache_dir`` (default :func:`mnist1d_cache_dir`) as ``mnist1d-<key>.npz``, the key
    a hash of every generator argument. Written atomically (temporary file + rename),
    read back with ``allow_pickle=False``. The generator is deterministic given its
    seed, so every process — cached or not — gets the same bytes.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 20:
        raise ValueError(f"mnist1d num_samples must be an int >= 20, got {num_samples!r}")
    import os

    folder = Path(cache_dir) if cache_dir is not None else mnist1d_cache_dir()
    path = folder / f"mnist1d-{_mnist1d_key(num_samples)}.npz"
    arrays: dict[str, np.ndarray] | None = None
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in ("x", "y", "x_test", "y_test")}
        except (OSError, ValueError, KeyError):
            arrays = None  # a damaged cache file is regenerated
    if arrays is None:
        arrays = _mnist1d_generate(num_samples)
        arrays = {
            "x": arrays["x"].astype(np.float32),
            "y": arrays["y"].astype(np.int64),
            "x_test": arrays["x_test"].astype(np.float32),
            "y_test": arrays["y_test"].astype(np.int64),
        }
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{path.name}.{os.getpid()}.tmp.npz"
        np.savez(
            tmp, x=arrays["x"], y=arrays["y"], x_test=arrays["x_test"], y_test=arrays["y_test"]
        )
        os.replace(tmp, path)

    def build(x: np.ndarray, y: np.ndarray, name: str) -> ArrayDataset:
        x32 = np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape[0], -1, 1, 1)
        return ArrayDataset(x32, np.asarray(y, dtype=np.int64), 10, name)

    return DatasetSplits(
        train=build(arrays["x"], arrays["y"], "mnist1d/train"),
        test=build(arrays["x_test"], arrays["y_test"], "mnist1d/test"),
    )


# ----------------------------------------------------------------------------- CIFAR


def _reconstruct_fn() -> Any:
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return _reconstruct


def _codecs_encode() -> Any:
    import _codecs

    return _codecs.encode


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler for the official CIFAR python files that cannot run code.

    The CIFAR "python version" files are pickles: ``pickle.load`` on an untrusted
    copy would let whoever wrote it run arbitrary code (any importable callable can
    be referenced as a global and called). The legitimate files need only:

    - ``numpy.core.multiarray._reconstruct`` (``numpy._core...`` when written by
      numpy 2), ``numpy.ndarray``, ``numpy.dtype`` — how numpy pickles the uint8
      ``data`` array. ``_reconstruct`` only makes an empty array of the given
      subclass, and the subclass itself must come from this list, i.e. ``ndarray``.
    - ``_codecs.encode`` — how Python 3 writes ``bytes`` at pickle protocol 2 (the
      protocol of the official Python 2 files); it only turns a str into bytes.
      (PyTorch's ``weights_only`` unpickler allows it for the same reason.)

    Everything else — every other global — is refused with
    ``pickle.UnpicklingError`` before it is imported. Objects are returned from
    this fixed table, never looked up by the module name found in the file.
    """

    _ALLOWED: dict[tuple[str, str], Any] = {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct_fn(),
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct_fn(),
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _codecs_encode(),
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}: CIFAR files only contain "
                "dicts, bytes, lists and numpy arrays"
            ) from None


def _load_restricted(path: Path) -> dict[bytes, Any]:
    data = path.read_bytes()
    if not data:
        raise ValueError(f"{path}: empty file (expected a CIFAR python-pickle batch)")
    try:
        obj = RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    except pickle.UnpicklingError as exc:
        if "refusing to load global" in str(exc):
            raise pickle.UnpicklingError(f"{path}: {exc}") from None
        raise ValueError(f"{path}: not a CIFAR python-pickle batch ({exc})") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, UnicodeDecodeError) as exc:
        # A truncated or garbled pickle surfaces as any of these from the unpickler.
        raise ValueError(
            f"{path}: not a CIFAR python-pickle batch (truncated or garbled: {type(exc).__name__})"
        ) from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a dict, got {type(obj).__name__}")
    return obj


def _read_cifar_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    batch = _load_restricted(path)
    if b"data" not in batch or label_key not in batch:
        raise ValueError(
            f"{path}: missing key b'data' or {label_key!r}; found {sorted(map(repr, batch))}"
        )
    data = batch[b"data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise ValueError(f"{path}: b'data' must be a uint8 array of shape (N, 3072)")
    if data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: b'data' rows must have 3072 values, got {data.shape[1]}")
    labels = np.asarray(batch[label_key])
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise ValueError(f"{path}: {data.shape[0]} images but labels of shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: labels must be integers, got {labels.dtype}")
    return data, labels.astype(np.int64)


def _find_cifar_dir(root: Path, dirname: str, required: Sequence[str]) -> Path:
    for candidate in (root / dirname, root):
        if all((candidate / f).is_file() for f in required):
            return candidate
    raise FileNotFoundError(
        f"CIFAR files not found: expected {', '.join(required)} in {root / dirname} "
        f"(or in {root} itself) — the standard python-pickle layout '{dirname}/'"
    )


def _standardise(data: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    x = data.reshape(-1, 3, 32, 32).astype(np.float32) / np.float32(255.0)
    m = np.asarray(mean, dtype=np.float32).reshape(1, 3, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, 3, 1, 1)
    x -= m
    x /= s
    return x


def load_cifar(root: str | Path, *, num_classes: int = 10) -> DatasetSplits:
    """CIFAR-10 or CIFAR-100 from the standard python-pickle directory.

    ``root`` is the directory that contains ``cifar-10-batches-py/``
    (``data_batch_1`` … ``data_batch_5``, ``test_batch``; labels under ``b"labels"``)
    or ``cifar-100-python/`` (``train``, ``test``; labels under ``b"fine_labels"``),
    or that directory itself. Images (``b"data"``, uint8 N×3072, channel-major) are
    scaled to ``[0, 1]`` and standardised per channel with the usual CIFAR
    constants (:data:`CIFAR10_MEAN` / :data:`CIFAR10_STD` or the CIFAR-100 ones);
    shape ``(N, 3, 32, 32)``. The official train/test split is kept. Files are read
    with :class:`RestrictedUnpickler`, never ``pickle.load``.

    Raises:
        FileNotFoundError: the expected files are not there (the message names them).
        pickle.UnpicklingError: a file references anything beyond the allow-list.
        ValueError: a file is not in the official format (keys, dtype, shape).
    """
    root = Path(root)
    if num_classes == 10:
        files = [f"data_batch_{i}" for i in range(1, 6)]
        folder = _find_cifar_dir(root, "cifar-10-batches-py", [*files, "test_batch"])
        train = [_read_cifar_batch(folder / f, b"labels") for f in files]
        test = _read_cifar_batch(folder / "test_batch", b"labels")
        mean, std, name = CIFAR10_MEAN, CIFAR10_STD, "cifar10"
    elif num_classes == 100:
        folder = _find_cifar_dir(root, "cifar-100-python", ["train", "test"])
        train = [_read_cifar_batch(folder / "train", b"fine_labels")]
        test = _read_cifar_batch(folder / "test", b"fine_labels")
        mean, std, name = CIFAR100_MEAN, CIFAR100_STD, "cifar100"
    else:
        raise ValueError(f"num_classes must be 10 (CIFAR-10) or 100 (CIFAR-100), got {num_classes}")
    x_train = _standardise(np.concatenate([d for d, _ in train]), mean, std)
    y_train = np.concatenate([lab for _, lab in train])
    return DatasetSplits(
        train=ArrayDataset(x_train, y_train, num_classes, f"{name}/train"),
        test=ArrayDataset(_standardise(test[0], mean, std), test[1], num_classes, f"{name}/test"),
    )


# ----------------------------------------------------------------------------- npz


def _npz_images(arr: np.ndarray, key: str, path: Path) -> np.ndarray:
    """Bring an institution's feature array to ``(N, C, H, W)`` float32.

    - ``(N, D)`` (tabular) → ``(N, D, 1, 1)``: a 1×1 "image" with ``D`` channels,
      so the ``mlp`` extractor built with ``in_channels=D, image_size=1`` sees
      exactly ``D`` inputs (and ``image_size`` stays a square side).
    - ``(N, H, W)`` (grey-scale) → ``(N, 1, H, W)``.
    - ``(N, C, H, W)`` is kept (channels first, as torch expects).
    """
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{path}: {key!r} must be numeric, got dtype {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[:, :, None, None]
    elif arr.ndim == 3:
        arr = arr[:, None, :, :]
    elif arr.ndim != 4:
        raise ValueError(
            f"{path}: {key!r} must have shape (N, D), (N, H, W) or (N, C, H, W), got {arr.shape}"
        )
    out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(out).all():
        raise ValueError(f"{path}: {key!r} contains NaN or Inf (or values beyond float32)")
    return out


def _npz_labels(arr: np.ndarray, key: str, n: int, path: Path) -> np.ndarray:
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{path}: {key!r} must have shape ({n},), got {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{path}: {key!r} must hold integer class ids, got dtype {arr.dtype}")
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"{path}: {key!r} has negative labels; classes must be 0..C-1")
    return arr.astype(np.int64)


def load_npz(path: str | Path, *, seed: int = 0, test_fraction: float = 0.25) -> DatasetSplits:
    """An institution's own data from a ``.npz`` file.

    Key layouts (exactly one):

    - ``x``, ``y``: split with :func:`stratified_split` (``seed``, ``test_fraction``);
    - ``x_train``, ``y_train``, ``x_test``, ``y_test``: the given split is kept.

    ``x`` may be ``(N, D)``, ``(N, H, W)`` or ``(N, C, H, W)`` (see
    :func:`_npz_images`), any real numeric dtype, converted to float32 as is (no
    rescaling: the institution's own preprocessing is respected); NaN/Inf are
    refused. ``y`` holds integer class ids ``0..C-1`` with ``C = max(y) + 1`` over
    train and test. Loaded with ``allow_pickle=False``: an ``.npz`` with object
    arrays (which would need unpickling, i.e. could run code) is refused.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"npz dataset not found: {path}")
    split_keys = ("x_train", "y_train", "x_test", "y_test")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # a pickle renamed .npz, empty, garbled
        raise ValueError(f"{path}: not a valid .npz file ({exc})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: expected an .npz archive (np.savez), got a single array")
    with loaded as npz:
        keys = set(npz.files)
        has_split = any(k in keys for k in split_keys)
        has_xy = "x" in keys or "y" in keys
        if has_split and has_xy:
            raise ValueError(
                f"{path}: ambiguous keys {sorted(keys)}: use either x, y or "
                "x_train, y_train, x_test, y_test"
            )
        try:
            if has_split:
                missing = [k for k in split_keys if k not in keys]
                if missing:
                    raise ValueError(f"{path}: missing keys {missing} (found {sorted(keys)})")
                arrays = {k: npz[k] for k in split_keys}
            else:
                missing = [k for k in ("x", "y") if k not in keys]
                if missing:
                    raise ValueError(
                        f"{path}: missing keys {missing} (found {sorted(keys)}); expected "
                        "x, y or x_train, y_train, x_test, y_test"
                    )
                arrays = {"x": npz["x"], "y": npz["y"]}
        except ValueError as exc:
            if "allow_pickle" in str(exc):
                raise ValueError(f"{path}: object arrays are not allowed in a dataset") from exc
            raise

    stem = path.stem
    if has_split:
        x_tr = _npz_images(arrays["x_train"], "x_train", path)
        x_te = _npz_images(arrays["x_test"], "x_test", path)
        y_tr = _npz_labels(arrays["y_train"], "y_train", x_tr.shape[0], path)
        y_te = _npz_labels(arrays["y_test"], "y_test", x_te.shape[0], path)
        if x_tr.shape[1:] != x_te.shape[1:]:
            raise ValueError(
                f"{path}: x_train samples have shape {x_tr.shape[1:]} but x_test "
                f"samples {x_te.shape[1:]}"
            )
    else:
        x = _npz_images(arrays["x"], "x", path)
        y = _npz_labels(arrays["y"], "y", x.shape[0], path)
        train_idx, test_idx = stratified_split(y, test_fraction=test_fraction, seed=seed)
        x_tr, y_tr, x_te, y_te = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    if y_tr.size == 0:
        raise ValueError(f"{path}: no training samples")
    num_classes = int(max(y_tr.max(), y_te.max() if y_te.size else 0)) + 1
    return DatasetSplits(
        train=ArrayDataset(x_tr, y_tr, num_classes, f"npz:{stem}/train"),
        test=ArrayDataset(x_te, y_te, num_classes, f"npz:{stem}/test"),
    )


def load_npz_pair(train_path: str | Path, test_path: str | Path) -> DatasetSplits:
    """A site's data as two files: all of ``train_path``'s ``x``, ``y`` trains, all of
    ``test_path``'s evaluates (same conversions and checks as :func:`load_npz`)."""
    train = _whole_npz(Path(train_path))
    test = _whole_npz(Path(test_path))
    if train.x.shape[1:] != test.x.shape[1:]:
        raise ValueError(
            f"{train_path}: samples have shape {train.x.shape[1:]} but {test_path}'s "
            f"have {test.x.shape[1:]}"
        )
    num_classes = max(train.num_classes, test.num_classes)
    return DatasetSplits(
        train=ArrayDataset(train.x, train.y, num_classes, train.name),
        test=ArrayDataset(test.x, test.y, num_classes, test.name),
    )


def _whole_npz(path: Path) -> ArrayDataset:
    if not path.is_file():
        raise FileNotFoundError(f"npz dataset not found: {path}")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a valid .npz file ({exc})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: expected an .npz archive (np.savez), got a single array")
    with loaded as npz:
        missing = [k for k in ("x", "y") if k not in npz.files]
        if missing:
            raise ValueError(f"{path}: missing keys {missing} (found {sorted(npz.files)})")
        try:
            x = _npz_images(npz["x"], "x", path)
            y = _npz_labels(npz["y"], "y", x.shape[0], path)
        except ValueError as exc:
            if "allow_pickle" in str(exc):
                raise ValueError(f"{path}: object arrays are not allowed in a dataset") from None
            raise
    if y.size == 0:
        raise ValueError(f"{path}: no samples")
    return ArrayDataset(x, y, int(y.max()) + 1, f"npz:{path.stem}")


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
