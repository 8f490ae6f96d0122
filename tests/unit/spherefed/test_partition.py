"""Partitions: invariants (property-based), seeding, skew, shards, argument checks."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.spherefed.partition import (
    SCHEMES,
    dirichlet_partition,
    iid_partition,
    partition,
    partition_summary,
    shard_partition,
)


@cache
def _digits_labels() -> np.ndarray:
    from sklearn.datasets import load_digits

    y = np.asarray(load_digits().target, dtype=np.int64)
    y.setflags(write=False)
    return y


def _check_invariants(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0)  # sorted, no duplicates within a client
    everything = np.concatenate(parts)
    assert everything.shape == (n,)  # no sample in two clients ...
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))  # ... none lost


seeds = st.integers(0, 2**32 - 1)


@st.composite
def labels_and_clients(draw: st.DrawFn, per_client: int = 1) -> tuple[np.ndarray, int]:
    """A random label vector and a client count that it can feed (no filtering,
    so Hypothesis never discards inputs)."""
    labels = draw(st.lists(st.integers(0, 7), min_size=per_client, max_size=300))
    clients = draw(st.integers(1, min(25, len(labels) // per_client)))
    return np.array(labels, dtype=np.int64), clients


@settings(max_examples=60, deadline=None)
@given(data=labels_and_clients(), seed=seeds)
def test_iid_invariants(data: tuple[np.ndarray, int], seed: int) -> None:
    labels, clients = data
    parts = iid_partition(labels, clients, seed=seed)
    _check_invariants(parts, len(labels), clients)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=60, deadline=None)
@given(data=labels_and_clients(), alpha=st.floats(0.01, 100.0), seed=seeds)
def test_dirichlet_invariants(data: tuple[np.ndarray, int], alpha: float, seed: int) -> None:
    labels, clients = data
    parts = dirichlet_partition(labels, clients, alpha=alpha, seed=seed, min_size=0)
    _check_invariants(parts, len(labels), clients)
    again = dirichlet_partition(labels, clients, alpha=alpha, seed=seed, min_size=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 4), seed=seeds, data=st.data())
def test_shard_invariants(s: int, seed: int, data: st.DataObject) -> None:
    labels, clients = data.draw(labels_and_clients(per_client=s))
    parts = shard_partition(labels, clients, shards_per_client=s, seed=seed)
    _check_invariants(parts, len(labels), clients)
    # Shards differ in size by at most one, so clients by at most s.
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= s


@pytest.mark.parametrize(
    ("scheme", "kwargs"),
    [("iid", {}), ("dirichlet", {"alpha": 0.5}), ("shards", {"shards_per_client": 2})],
)
def test_seeding(scheme: str, kwargs: dict[str, Any]) -> None:
    y = _digits_labels()
    a = partition(y, 10, scheme=scheme, seed=5, **kwargs)
    b = partition(y, 10, scheme=scheme, seed=5, **kwargs)
    c = partition(y, 10, scheme=scheme, seed=6, **kwargs)
    _check_invariants(a, len(y), 10)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c, strict=True))


def _mean_label_entropy(counts: np.ndarray) -> float:
    p = counts / counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    return float(h.mean())


def test_dirichlet_alpha_controls_skew() -> None:
    y = _digits_labels()
    entropies = {}
    for alpha in (0.05, 0.5, 100.0):
        vals = []
        for seed in range(3):
            parts = dirichlet_partition(y, 10, alpha=alpha, seed=seed)
            assert min(len(p) for p in parts) >= 1
            vals.append(_mean_label_entropy(partition_summary(y, parts, 10)))
        entropies[alpha] = float(np.mean(vals))
    assert entropies[0.05] < entropies[0.5] < entropies[100.0]
    # alpha -> infinity approaches IID: nearly uniform labels (log 10 = 2.303).
    assert entropies[100.0] > 2.2
    assert entropies[0.05] < 1.5


def test_dirichlet_min_size_and_retries() -> None:
    y = _digits_labels()
    parts = dirichlet_partition(y, 20, alpha=0.1, seed=0, min_size=20)
    assert min(len(p) for p in parts) >= 20
    # Infeasible in practice: 100 samples of 2 classes over 40 clients at tiny alpha.
    y2 = np.repeat([0, 1], 50)
    with pytest.raises(ValueError, match="after 5 draws"):
        dirichlet_partition(y2, 40, alpha=1e-3, seed=0, min_size=2, max_retries=5)
    # Impossible outright.
    with pytest.raises(ValueError, match="min_size"):
        dirichlet_partition(y2, 10, alpha=1.0, seed=0, min_size=11)


def test_shards_limit_classes_per_client() -> None:
    # Class sizes are multiples of the shard size: each shard is a single class,
    # so each client holds at most s classes (FedFN §5).
    y = np.repeat(np.arange(10), 60)
    for s in (1, 2, 3):  # shard sizes 60, 30, 20 all divide the class size
        parts = shard_partition(y, 10, shards_per_client=s, seed=1)
        counts = partition_summary(y, parts, 10)
        assert ((counts > 0).sum(axis=1) <= s).all()
        assert (counts.sum(axis=1) == 60).all()
    # Unequal classes (digits): a shard may straddle one boundary -> at most 2s.
    yd = _digits_labels()
    parts = shard_partition(yd, 10, shards_per_client=2, seed=0)
    counts = partition_summary(yd, parts, 10)
    assert ((counts > 0).sum(axis=1) <= 4).all()
    sizes = counts.sum(axis=1)
    assert sizes.max() - sizes.min() <= 2
    # Far more skewed than IID: most clients see only 2-3 classes.
    assert np.median((counts > 0).sum(axis=1)) <= 3


def test_partition_summary() -> None:
    y = np.array([0, 1, 1, 2, 2, 2])
    parts = [np.array([0, 3]), np.array([1, 2, 4, 5])]
    np.testing.assert_array_equal(partition_summary(y, parts, 4), [[1, 0, 1, 0], [0, 2, 2, 0]])
    assert partition_summary(y, parts, 4).dtype == np.int64
    with pytest.raises(ValueError, match="num_classes"):
        partition_summary(y, parts, 2)


def test_dispatch_and_invalid_arguments() -> None:
    y = np.arange(20) % 4
    assert SCHEMES == ("iid", "dirichlet", "shards")
    # A parameter the scheme does not use is ignored.
    a = partition(y, 4, scheme="iid", alpha=0.1, seed=3)
    b = iid_partition(y, 4, seed=3)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="valid schemes: iid, dirichlet, shards"):
        partition(y, 4, scheme="pathological")
    with pytest.raises(ValueError, match="needs alpha"):
        partition(y, 4, scheme="dirichlet")
    with pytest.raises(ValueError, match="needs shards_per_client"):
        partition(y, 4, scheme="shards")
    for bad_alpha in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha"):
            dirichlet_partition(y, 4, alpha=bad_alpha, seed=0)
    for scheme, kw in (
        ("iid", {}),
        ("dirichlet", {"alpha": 1.0}),
        ("shards", {"shards_per_client": 1}),
    ):
        with pytest.raises(ValueError, match="num_clients"):
            partition(y, 0, scheme=scheme, **kw)
        with pytest.raises(ValueError, match="exceeds the number of samples"):
            partition(y, 21, scheme=scheme, **kw)
    with pytest.raises(ValueError, match="shards exceeds"):
        shard_partition(y, 11, shards_per_client=2, seed=0)
    with pytest.raises(ValueError, match="shards_per_client"):
        shard_partition(y, 2, shards_per_client=0, seed=0)
    with pytest.raises(ValueError, match="1-D"):
        iid_partition(y.reshape(4, 5), 2, seed=0)
    with pytest.raises(ValueError, match="integers"):
        iid_partition(y.astype(float), 2, seed=0)
    with pytest.raises(ValueError, match="non-negative"):
        iid_partition(y - 1, 2, seed=0)
    with pytest.raises(ValueError, match="empty"):
        iid_partition(np.array([], dtype=np.int64), 1, seed=0)
    with pytest.raises(ValueError, match="num_clients must be an int"):
        iid_partition(y, 2.5, seed=0)  # type: ignore[arg-type]
