"""Datasets: containers, digits, CIFAR pickles (incl. a malicious one), npz, dispatch."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.spherefed.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    ArrayDataset,
    DatasetSplits,
    RestrictedUnpickler,
    load_cifar,
    load_dataset,
    load_digits,
    load_npz,
    stratified_split,
)

REPO = Path(__file__).resolve().parents[3]


def _ds(n: int = 6, c: int = 3) -> ArrayDataset:
    x = np.arange(n * 1 * 2 * 2, dtype=np.float32).reshape(n, 1, 2, 2)
    y = (np.arange(n) % c).astype(np.int64)
    return ArrayDataset(x, y, c, "toy")


# ----------------------------------------------------------------------------- ArrayDataset


def test_array_dataset_basics() -> None:
    ds = _ds()
    assert len(ds) == 6
    assert ds.image_shape == (1, 2, 2)
    sub = ds.subset(np.array([4, 1]))
    assert len(sub) == 2 and sub.num_classes == 3
    np.testing.assert_array_equal(sub.y, [1, 1])
    np.testing.assert_array_equal(sub.x[0], ds.x[4])
    assert len(ds.subset(np.array([], dtype=np.int64))) == 0
    tds = ds.to_tensor_dataset()
    xb, yb = tds[2]
    assert xb.dtype == torch.float32 and yb.dtype == torch.int64
    assert xb.shape == (1, 2, 2) and int(yb) == 2


def test_array_dataset_validation() -> None:
    x = np.zeros((3, 1, 2, 2), np.float32)
    y = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="float32"):
        ArrayDataset(x.astype(np.float64), y, 2, "t")
    with pytest.raises(ValueError, match="N, C, H, W"):
        ArrayDataset(x.reshape(3, 4), y, 2, "t")
    with pytest.raises(ValueError, match="int64"):
        ArrayDataset(x, y.astype(np.int32), 2, "t")
    with pytest.raises(ValueError, match="3 images but 2 labels"):
        ArrayDataset(x, y[:2], 2, "t")
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        ArrayDataset(x, np.array([0, 1, 2], np.int64), 2, "t")
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        ArrayDataset(x, np.array([0, -1, 1], np.int64), 2, "t")
    bad = x.copy()
    bad[1, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ArrayDataset(bad, y, 2, "t")
    with pytest.raises(ValueError, match="num_classes"):
        ArrayDataset(x, y, 0, "t")
    ds = _ds()
    with pytest.raises(ValueError, match="integer"):
        ds.subset(np.ones(6, dtype=bool))
    with pytest.raises(ValueError, match="must lie in"):
        ds.subset(np.array([6]))
    with pytest.raises(ValueError, match="classes"):
        DatasetSplits(_ds(c=3), _ds(c=4))


# ----------------------------------------------------------------------------- split


@settings(max_examples=40, deadline=None)
@given(
    labels=st.lists(st.integers(0, 5), min_size=2, max_size=200),
    frac=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**32 - 1),
)
def test_stratified_split_properties(labels: list[int], frac: float, seed: int) -> None:
    y = np.array(labels, dtype=np.int64)
    tr, te = stratified_split(y, test_fraction=frac, seed=seed)
    assert tr.dtype == np.int64 and te.dtype == np.int64
    np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), np.arange(len(y)))
    assert np.all(np.diff(tr) > 0) and np.all(np.diff(te) > 0)
    assert len(te) == min(max(round(len(y) * frac), 1), len(y) - 1)
    # Each class's test count is within one sample of its exact share.
    share = len(te) / len(y)
    for c in np.unique(y):
        n_c = int((y == c).sum())
        t_c = int((y[te] == c).sum())
        assert abs(t_c - n_c * share) < 1.0 + 1e-9
    tr2, te2 = stratified_split(y, test_fraction=frac, seed=seed)
    np.testing.assert_array_equal(te, te2)


def test_stratified_split_rejects_bad_args() -> None:
    y = np.array([0, 1, 0, 1])
    for frac in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="test_fraction"):
            stratified_split(y, test_fraction=frac, seed=0)
    with pytest.raises(ValueError, match="at least 2"):
        stratified_split(np.array([0]), test_fraction=0.5, seed=0)


# ----------------------------------------------------------------------------- digits


def test_digits() -> None:
    d = load_digits(seed=0)
    assert d.num_classes == 10
    assert d.train.num_classes == d.test.num_classes == 10
    assert len(d.train) + len(d.test) == 1797
    assert len(d.test) == round(1797 * 0.25)
    for part in (d.train, d.test):
        assert part.x.dtype == np.float32 and part.y.dtype == np.int64
        assert part.image_shape == (1, 8, 8)
        assert part.x.min() == 0.0 and part.x.max() == 1.0
        assert set(np.unique(part.y)) == set(range(10))
    # Stratified: each class's test share within one sample of 25 %.
    total = np.bincount(d.train.y, minlength=10) + np.bincount(d.test.y, minlength=10)
    expected = total * len(d.test) / 1797
    assert np.all(np.abs(np.bincount(d.test.y, minlength=10) - expected) < 1.0)
    # Reproducible, and a different seed gives a different split.
    again = load_digits(seed=0)
    np.testing.assert_array_equal(again.test.x, d.test.x)
    np.testing.assert_array_equal(again.train.y, d.train.y)
    other = load_digits(seed=1)
    assert not np.array_equal(other.test.x, d.test.x)
    small = load_digits(seed=0, test_fraction=0.1)
    assert len(small.test) == round(1797 * 0.1)


def _digest(splits: DatasetSplits) -> str:
    h = hashlib.sha256()
    for arr in (splits.train.x, splits.train.y, splits.test.x, splits.test.y):
        h.update(arr.tobytes())
    return h.hexdigest()


def test_digits_split_identical_in_another_process() -> None:
    code = (
        "import hashlib; from spherecal.spherefed.data import load_digits\n"
        "d = load_digits(seed=3); h = hashlib.sha256()\n"
        "for a in (d.train.x, d.train.y, d.test.x, d.test.y): h.update(a.tobytes())\n"
        "print(h.hexdigest())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "123"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == _digest(load_digits(seed=3))


# ----------------------------------------------------------------------------- CIFAR


def _write_batch(path: Path, data: np.ndarray, labels: list[int], label_key: bytes) -> None:
    """A file in the exact official format: a dict with bytes keys, pickle protocol 2."""
    batch = {
        b"batch_label": b"testing batch 1 of 1",
        label_key: labels,
        b"data": data,
        b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
    }
    if label_key == b"fine_labels":
        batch[b"coarse_labels"] = [lab // 5 for lab in labels]
    with path.open("wb") as f:
        pickle.dump(batch, f, protocol=2)


def _random_pixels(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def _make_cifar10(root: Path, per_batch: int = 3, n_test: int = 4) -> tuple[np.ndarray, ...]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    datas, labels = [], []
    for i in range(1, 6):
        data = _random_pixels(rng, per_batch)
        lab = [int(v) for v in rng.integers(0, 10, per_batch)]
        _write_batch(folder / f"data_batch_{i}", data, lab, b"labels")
        datas.append(data)
        labels += lab
    test_data = _random_pixels(rng, n_test)
    test_labels = [int(v) for v in rng.integers(0, 10, n_test)]
    _write_batch(folder / "test_batch", test_data, test_labels, b"labels")
    return np.concatenate(datas), np.array(labels), test_data, np.array(test_labels)


def _expected(data: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    x = data.reshape(-1, 3, 32, 32).astype(np.float64) / 255.0
    return (x - np.array(mean).reshape(1, 3, 1, 1)) / np.array(std).reshape(1, 3, 1, 1)


def test_cifar10_layout(tmp_path: Path) -> None:
    tr_data, tr_labels, te_data, te_labels = _make_cifar10(tmp_path)
    for root in (tmp_path, tmp_path / "cifar-10-batches-py", str(tmp_path)):
        d = load_cifar(root)
        assert d.num_classes == 10
        assert d.train.x.shape == (15, 3, 32, 32) and d.test.x.shape == (4, 3, 32, 32)
        assert d.train.x.dtype == np.float32
        np.testing.assert_array_equal(d.train.y, tr_labels)
        np.testing.assert_array_equal(d.test.y, te_labels)
        np.testing.assert_allclose(
            d.train.x, _expected(tr_data, CIFAR10_MEAN, CIFAR10_STD), atol=1e-5
        )
        np.testing.assert_allclose(
            d.test.x, _expected(te_data, CIFAR10_MEAN, CIFAR10_STD), atol=1e-5
        )
    # Channel-major layout: pixel (c=1, h=2, w=3) is column 1*1024 + 2*32 + 3.
    d = load_cifar(tmp_path)
    want = (tr_data[0, 1024 + 67] / 255.0 - CIFAR10_MEAN[1]) / CIFAR10_STD[1]
    assert d.train.x[0, 1, 2, 3] == pytest.approx(want, abs=1e-5)
    via_dispatch = load_dataset("cifar10", root=tmp_path)
    np.testing.assert_array_equal(via_dispatch.train.x, d.train.x)


def test_cifar100_layout(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(1)
    tr, te = _random_pixels(rng, 6), _random_pixels(rng, 2)
    tr_lab, te_lab = [0, 99, 5, 42, 7, 99], [3, 98]
    _write_batch(folder / "train", tr, tr_lab, b"fine_labels")
    _write_batch(folder / "test", te, te_lab, b"fine_labels")
    d = load_dataset("cifar100", root=tmp_path)
    assert d.num_classes == 100
    assert d.train.x.shape == (6, 3, 32, 32) and d.test.x.shape == (2, 3, 32, 32)
    np.testing.assert_array_equal(d.train.y, tr_lab)
    np.testing.assert_array_equal(d.test.y, te_lab)
    np.testing.assert_allclose(d.train.x, _expected(tr, CIFAR100_MEAN, CIFAR100_STD), atol=1e-5)


def test_cifar_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        load_cifar(tmp_path)
    with pytest.raises(FileNotFoundError, match="cifar-100-python"):
        load_cifar(tmp_path, num_classes=100)
    with pytest.raises(ValueError, match="10 .* or 100"):
        load_cifar(tmp_path, num_classes=20)
    with pytest.raises(ValueError, match="root"):
        load_dataset("cifar10")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused(tmp_path: Path) -> None:
    _make_cifar10(tmp_path)
    marker = tmp_path / "pwned"
    evil = {b"data": _Evil(marker), b"labels": [0]}
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="refusing to load global"):
        load_cifar(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [(eval, ("1+1",)), (np.load, ("x.npy",))])
def test_restricted_unpickler_refuses_other_globals(payload: tuple[object, tuple]) -> None:
    class Reducer:
        def __reduce__(self) -> tuple[object, tuple]:
            return payload

    blob = pickle.dumps({b"data": Reducer()}, protocol=2)
    with pytest.raises(pickle.UnpicklingError):
        RestrictedUnpickler(io.BytesIO(blob), encoding="bytes").load()
    # A plain numpy array (what the real files hold) goes through.
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    for protocol in (2, 3, 4):
        blob = pickle.dumps({b"data": arr}, protocol=protocol)
        out = RestrictedUnpickler(io.BytesIO(blob), encoding="bytes").load()
        np.testing.assert_array_equal(out[b"data"], arr)


def test_cifar_wrong_contents(tmp_path: Path) -> None:
    _make_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    _write_batch(path, np.zeros((2, 3072), np.float32), [0, 1], b"labels")
    with pytest.raises(ValueError, match="uint8"):
        load_cifar(tmp_path)
    with path.open("wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8)}, f, protocol=2)
    with pytest.raises(ValueError, match="missing key"):
        load_cifar(tmp_path)


# ----------------------------------------------------------------------------- npz


def test_npz_xy_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 5))
    y = np.repeat(np.arange(4), 10)
    path = tmp_path / "hospital.npz"
    np.savez(path, x=x, y=y)
    d = load_npz(path, seed=1)
    assert d.num_classes == 4
    assert d.train.image_shape == (5, 1, 1)  # (N, D) is stored as D channels of 1x1
    assert len(d.train) == 30 and len(d.test) == 10
    assert sorted(np.bincount(d.test.y).tolist()) == [2, 2, 3, 3]  # stratified
    # Every sample appears once across the split.
    both = np.concatenate([d.train.x, d.test.x]).reshape(40, 5)
    np.testing.assert_allclose(
        np.sort(both, axis=0), np.sort(x.astype(np.float32), axis=0), rtol=0, atol=0
    )
    np.testing.assert_array_equal(load_npz(path, seed=1).test.x, d.test.x)
    # (N, H, W) gets a channel axis; load_dataset dispatches with root=path.
    np.savez(tmp_path / "gray.npz", x=rng.random((8, 4, 6)), y=np.arange(8) % 2)
    g = load_dataset("npz", root=tmp_path / "gray.npz", seed=0)
    assert g.train.image_shape == (1, 4, 6)


def test_npz_split_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "split.npz"
    np.savez(
        path,
        x_train=rng.random((6, 3, 4, 4)).astype(np.float32),
        y_train=np.array([0, 1, 2, 0, 1, 2], dtype=np.int32),
        x_test=rng.random((2, 3, 4, 4)),
        y_test=np.array([4, 0], dtype=np.uint8),
    )
    d = load_npz(path)
    assert len(d.train) == 6 and len(d.test) == 2
    assert d.num_classes == 5  # max label over train and test, plus one
    assert d.train.image_shape == (3, 4, 4)
    assert d.train.y.dtype == np.int64 and d.test.x.dtype == np.float32


def test_npz_errors(tmp_path: Path) -> None:
    def write(name: str, **arrays: Any) -> Path:
        p = tmp_path / name
        np.savez(p, **arrays)
        return p

    x, y = np.zeros((4, 3)), np.array([0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"missing keys \['y'\]"):
        load_npz(write("a.npz", x=x))
    with pytest.raises(ValueError, match="missing keys"):
        load_npz(write("b.npz", x_train=x, y_train=y))
    with pytest.raises(ValueError, match="ambiguous"):
        load_npz(write("c.npz", x=x, y=y, x_train=x, y_train=y, x_test=x, y_test=y))
    bad = x.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        load_npz(write("d.npz", x=bad, y=y))
    inf = x.copy()
    inf[0, 0] = np.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        load_npz(write("e.npz", x=inf, y=y))
    with pytest.raises(ValueError, match="integer"):
        load_npz(write("f.npz", x=x, y=y.astype(np.float64)))
    with pytest.raises(ValueError, match="negative"):
        load_npz(write("g.npz", x=x, y=np.array([0, -1, 0, 1])))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        load_npz(write("h.npz", x=x, y=np.array([0, 1])))
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        load_npz(write("i.npz", x=np.zeros((4, 1, 1, 1, 1)), y=y))
    with pytest.raises(ValueError, match="object arrays"):
        load_npz(write("j.npz", x=np.array([{}, {}, {}, {}], dtype=object), y=y))
    with pytest.raises(ValueError, match="x_test samples"):
        load_npz(write("k.npz", x_train=x, y_train=y, x_test=np.zeros((4, 2)), y_test=y))
    with pytest.raises(FileNotFoundError):
        load_npz(tmp_path / "missing.npz")
    single = tmp_path / "single.npy"
    np.save(single, x)
    with pytest.raises(ValueError, match="npz"):
        load_npz(single)


def test_load_dataset_dispatch() -> None:
    d = load_dataset("digits", seed=0)
    assert d.train.image_shape == (1, 8, 8)
    with pytest.raises(ValueError, match="valid names: digits, mnist1d, cifar10, cifar100, npz"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="root"):
        load_dataset("npz")
