"""An institution's own data from a ``.npz`` file, read with ``allow_pickle=False``."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from spherecal.spherefed.data.arrays import ArrayDataset, DatasetSplits, stratified_split

# ----------------------------------------------------------------------------- npz

_ZIP_MAGIC = b"PK\x03\x04"  # np.savez writes a zip archive
_NPY_MAGIC = b"\x93NUMPY"  # np.save writes one array


def open_npz(path: Path) -> np.lib.npyio.NpzFile:
    """Open an ``.npz`` archive with ``allow_pickle=False``, saying what a wrong file is.

    Why look at the first bytes before ``np.load``: given anything that is neither a
    zip nor an ``.npy`` (a CSV renamed ``.npz``, an empty file), numpy falls back to
    unpickling and — pickles being refused — reports "pickled data", which sends a
    user looking for object arrays that are not there."""
    if not path.is_file():
        raise FileNotFoundError(f"npz file not found: {path}")
    with path.open("rb") as handle:
        head = handle.read(len(_NPY_MAGIC))
    if head.startswith(_NPY_MAGIC):
        raise ValueError(f"{path}: expected an .npz archive (np.savez), got a single array")
    if not head.startswith(_ZIP_MAGIC):
        what = "empty" if not head else "no zip archive"
        if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head):
            what = "text, not a zip archive"
        raise ValueError(f"{path}: not a valid .npz file ({what}; np.savez writes a zip archive)")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:  # truncated, garbled
        raise ValueError(f"{path}: not a valid .npz file ({exc})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # pragma: no cover - magic checked
        raise ValueError(f"{path}: expected an .npz archive (np.savez), got a single array")
    return loaded



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
    split_keys = ("x_train", "y_train", "x_test", "y_test")
    with open_npz(path) as npz:
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
    with open_npz(path) as npz:
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
