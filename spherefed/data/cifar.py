"""CIFAR-10/100 from the standard python-pickle directory already on disk.

Loading never executes code from a file: the pickles go through
:class:`RestrictedUnpickler`, which only rebuilds plain arrays, bytes and lists.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spherecal.spherefed.data.arrays import ArrayDataset, DatasetSplits

# Per-channel statistics of the CIFAR training sets on the [0, 1] scale (the values
# computed from the training images themselves, as used by most CIFAR FL code).
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN: tuple[float, float, float] = (0.5071, 0.4865, 0.4409)
CIFAR100_STD: tuple[float, float, float] = (0.2673, 0.2564, 0.2762)


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
