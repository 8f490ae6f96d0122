"""Splitting a training set across federated clients: IID, Dirichlet(α), shards.

These simulate the label skew the papers study: SphereFed §5 and CCVR §5 partition
"according to a Dirichlet distribution with a concentration parameter α" (Hsu et
al. 2019); FedFN §5 uses McMahan et al.'s shards. They are only used by the
in-process reference runner and the simulation harness — a real institution
brings its own data.

Guarantees of every scheme (tested):

- every sample index is assigned to exactly one client;
- each client's index array is sorted ascending, ``int64``;
- seeded with ``np.random.default_rng(seed)`` only — the same ``(labels,
  num_clients, scheme, parameters, seed)`` gives identical partitions in any
  process, so the coordinator and every participant of a simulation agree;
- vectorised numpy: loops run over clients / classes / retries, never samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "SCHEMES",
    "dirichlet_partition",
    "iid_partition",
    "partition",
    "partition_summary",
    "shard_partition",
]

SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "shards")
"""Every ``scheme`` :func:`partition` accepts."""

_MAX_RETRIES = 1000

LabelsLike = np.ndarray | Sequence[int]


# ----------------------------------------------------------------------------- helpers


def _check_labels(labels: LabelsLike) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if y.size == 0:
        raise ValueError("labels is empty: nothing to partition")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    if int(y.min()) < 0:
        raise ValueError("labels must be non-negative class ids")
    return y.astype(np.int64, copy=False)


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_clients(num_clients: object, n: int) -> int:
    k = _check_int(num_clients, "num_clients", 1)
    if k > n:
        raise ValueError(
            f"num_clients={k} exceeds the number of samples ({n}); "
            "every client needs at least one sample"
        )
    return k


def _group(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Turn ``owner[i] = client of sample i`` into per-client sorted int64 index arrays."""
    order = np.argsort(owner, kind="stable")  # stable ⇒ indices ascending within a client
    sizes = np.bincount(owner, minlength=num_clients)
    return [part.astype(np.int64) for part in np.split(order, np.cumsum(sizes)[:-1])]


# ----------------------------------------------------------------------------- schemes


def iid_partition(labels: LabelsLike, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """Uniformly random partition into ``num_clients`` parts whose sizes differ by ≤ 1.

    The papers' "IID" baseline: a random permutation cut into near-equal pieces.
    """
    y = _check_labels(labels)
    k = _check_clients(num_clients, y.shape[0])
    rng = np.random.default_rng(seed)
    perm = rng.permutation(y.shape[0])
    return [np.sort(part).astype(np.int64) for part in np.array_split(perm, k)]


def dirichlet_partition(
    labels: LabelsLike,
    num_clients: int,
    *,
    alpha: float,
    seed: int,
    min_size: int = 1,
    max_retries: int = _MAX_RETRIES,
) -> list[np.ndarray]:
    """Label-skewed partition: for each class ``c``, ``p_c ~ Dir(α·1_K)`` over the ``K``
    clients and client ``k`` receives ``⌊n_c · Σ_{j≤k} p_{c,j}⌋ − ⌊n_c · Σ_{j<k} p_{c,j}⌋``
    of class ``c``'s samples, chosen at random.

    This is the scheme of Hsu et al. (2019) used by SphereFed §5, CCVR §5 and
    FedFN §5 ("sample p_c ~ Dir(α) and allocate a proportion p_{c,k} of instances of
    class c to client k"). Small α ⇒ each class concentrated on few clients;
    α → ∞ ⇒ IID. Client sizes are *not* balanced — that is part of the skew.

    Small α can leave a client with (almost) nothing. As in the papers' public code,
    the whole draw is repeated until every client has at least ``min_size``
    samples; after ``max_retries`` failed draws a ``ValueError`` explains what to
    change. Retries consume the same seeded generator, so the result is still a
    deterministic function of the arguments.
    """
    y = _check_labels(labels)
    n = int(y.shape[0])
    k = _check_clients(num_clients, n)
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a positive number, got {alpha!r}") from None
    if not np.isfinite(a) or a <= 0.0:
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    min_size = _check_int(min_size, "min_size", 0)
    max_retries = _check_int(max_retries, "max_retries", 1)
    if min_size * k > n:
        raise ValueError(
            f"cannot give each of {k} clients min_size={min_size} samples: only {n} samples"
        )

    classes, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(n) - np.repeat(starts, counts)  # position within its class block
    rng = np.random.default_rng(seed)
    smallest = 0
    for _ in range(max_retries):
        # Random order within each class block.
        perm = rng.permutation(n)
        grouped = perm[np.argsort(inverse[perm], kind="stable")]
        props = rng.dirichlet(np.full(k, a), size=classes.shape[0])  # (classes, K)
        # Cut points: the first ``bounds[c, j]`` samples of class c go to clients ≤ j.
        bounds = np.floor(np.cumsum(props, axis=1) * counts[:, None]).astype(np.int64)
        bounds[:, -1] = counts  # guard against float round-off in the last cumsum
        # Client of the sample at within-class rank r: number of cut points ≤ r.
        client_sorted = np.empty(n, dtype=np.int64)
        for c in range(classes.shape[0]):  # per class, vectorised over its samples
            sl = slice(starts[c], starts[c] + counts[c])
            client_sorted[sl] = np.searchsorted(bounds[c], rank[sl], side="right")
        owner = np.empty(n, dtype=np.int64)
        owner[grouped] = client_sorted
        sizes = np.bincount(owner, minlength=k)
        smallest = int(sizes.min())
        if smallest >= min_size:
            return _group(owner, k)
    raise ValueError(
        f"dirichlet_partition: after {max_retries} draws with alpha={a} some client still "
        f"had fewer than min_size={min_size} samples (smallest: {smallest}); use a larger "
        "alpha, fewer clients or a smaller min_size"
    )


def shard_partition(
    labels: LabelsLike, num_clients: int, *, shards_per_client: int, seed: int
) -> list[np.ndarray]:
    """McMahan et al. (2017) / FedFN §5 shards: sort by label, cut into
    ``num_clients · s`` shards of near-equal size (differing by ≤ 1), give each client
    ``s`` random shards.

    Within a class the order is random (so which samples form a shard is seeded).
    A shard holds a single class whenever class sizes are multiples of the shard
    size (FedFN's "each client can hold samples from up to s classes"); otherwise a
    shard can straddle a class boundary, so a client holds at most
    ``s · (1 + ⌈shard_size / smallest class⌉)`` classes — at most ``2s`` when
    every class has at least one shard's worth of samples.
    """
    y = _check_labels(labels)
    n = int(y.shape[0])
    k = _check_clients(num_clients, n)
    s = _check_int(shards_per_client, "shards_per_client", 1)
    num_shards = k * s
    if num_shards > n:
        raise ValueError(f"{k} clients × {s} shards = {num_shards} shards exceeds the {n} samples")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    by_label = perm[np.argsort(y[perm], kind="stable")]
    shard_sizes = np.full(num_shards, n // num_shards, dtype=np.int64)
    shard_sizes[: n % num_shards] += 1
    shard_of_position = np.repeat(np.arange(num_shards), shard_sizes)
    client_of_shard = np.empty(num_shards, dtype=np.int64)
    client_of_shard[rng.permutation(num_shards)] = np.repeat(np.arange(k), s)
    owner = np.empty(n, dtype=np.int64)
    owner[by_label] = client_of_shard[shard_of_position]
    return _group(owner, k)


# ----------------------------------------------------------------------------- dispatch


def partition(
    labels: LabelsLike,
    num_clients: int,
    *,
    scheme: str,
    alpha: float | None = None,
    shards_per_client: int | None = None,
    seed: int = 0,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Partition by scheme name (one of :data:`SCHEMES`).

    ``alpha`` is required for ``"dirichlet"`` and ``shards_per_client`` for
    ``"shards"``; a parameter that the chosen scheme does not use is ignored (so a
    CLI can always pass its ``--alpha``). ``min_size`` applies to ``"dirichlet"``.
    """
    if scheme == "iid":
        return iid_partition(labels, num_clients, seed=seed)
    if scheme == "dirichlet":
        if alpha is None:
            raise ValueError("scheme 'dirichlet' needs alpha (the Dirichlet concentration)")
        return dirichlet_partition(labels, num_clients, alpha=alpha, seed=seed, min_size=min_size)
    if scheme == "shards":
        if shards_per_client is None:
            raise ValueError("scheme 'shards' needs shards_per_client")
        return shard_partition(labels, num_clients, shards_per_client=shards_per_client, seed=seed)
    raise ValueError(f"unknown partition scheme {scheme!r}; valid schemes: {', '.join(SCHEMES)}")


def partition_summary(
    labels: LabelsLike, parts: Sequence[np.ndarray], num_classes: int
) -> np.ndarray:
    """Clients × classes matrix of sample counts (``int64``): row ``k`` is client
    ``k``'s label histogram. Useful to print or test the skew of a partition."""
    y = _check_labels(labels)
    c = _check_int(num_classes, "num_classes", 1)
    if int(y.max()) >= c:
        raise ValueError(f"labels go up to {int(y.max())} but num_classes={c}")
    out = np.zeros((len(parts), c), dtype=np.int64)
    for i, part in enumerate(parts):
        idx = np.asarray(part)
        if idx.size:
            if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
                raise ValueError(f"part {i} must be a 1-D integer index array")
            out[i] = np.bincount(y[idx], minlength=c)
    return out
