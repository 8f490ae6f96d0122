"""scikit-learn's bundled 8×8 digits (no network), split stratified by ``seed``."""

from __future__ import annotations

import numpy as np

from spherecal.spherefed.data.arrays import ArrayDataset, DatasetSplits, stratified_split

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
