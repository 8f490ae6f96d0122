"""FFC and CCVR sufficient statistics, computed streaming in float64.

Both calibrations need only *additive* statistics of the (normalised) features
``z`` of the final global feature extractor:

- **FFC** (SphereFed Eq. 8–9): ``V = Σ z zᵀ`` (l×l, symmetric), ``U = Σ z e_yᵀ``
  (l×C) and the sample count. Summed over participants they give Eq. 10's
  ``W* = V⁻¹ U`` exactly.
- **CCVR** (CCVR Eq. 2–4): per class ``N_c``, ``S_c = Σ_{y=c} z`` and
  ``M_c = Σ_{y=c} z zᵀ``. The paper uploads ``(μ_{c,k}, Σ_{c,k})``; the raw sums are
  equivalent (Eq. 4 is written in them) and, unlike means, they *add*, which is what
  secure aggregation needs. FFC follows for free: ``V = Σ_c M_c``, ``U[:, c] = S_c``.

Flat layouts (float64; this exact vector is what secure aggregation carries):

FFC, length ``1 + l(l+1)/2 + l·C``::

    [0]                 count
    [1 : 1+T]           V upper triangle incl. diagonal, row-major (np.triu_indices(l))
    [1+T : 1+T+l·C]     U, row-major (l×C)

CCVR, length ``C + C·l + C·l(l+1)/2``::

    [0 : C]             counts N_c
    [C : C+C·l]         sums S_c, class-major (row c is S_c)
    [C+C·l : ]          upper triangles of M_c, class-major, each row-major as above

``isometric=True`` multiplies every off-diagonal triangle entry by √2, so that the
Euclidean norm of the packed triangle equals the Frobenius norm of the full symmetric
matrix (the privacy issue needs this: the triangle then has the sensitivity of the
full matrix). Unpacking with the same flag undoes it exactly up to float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spherecal.spherefed.heads import UNIT_NORM_HEADS

SQRT2 = float(np.sqrt(2.0))

UNIT_NORM_SLACK = 2.0**-10
"""Relative room above a site's example count in :func:`unit_norm_entry_bound`, for the
float rounding of a unit norm (a float32 ``z / ‖z‖`` has ``‖z‖² = 1`` to within about
1e-7). It costs the secure-aggregation ring at most one bit of scale, and only when the
count is a power of two."""


_EXACT_COUNTS = 2**52
"""Above this many examples float64 no longer tells ``m`` from ``m + 1``
(:func:`unit_norm_examples_within` stops there)."""

FALLBACK_STATISTICS_BOUND = 1e6
"""The service's statistics bound for a head whose features have no unit norm (nothing
bounds ``‖z‖``) unless one is configured (``[secure_aggregation] statistics_bound``)."""


def statistics_entry_bound(head: str, max_examples: int) -> float:
    """The service's default bound on one site's statistics entries: for a unit-norm
    head (``heads.UNIT_NORM_HEADS``) :func:`unit_norm_entry_bound`, for any other
    :data:`FALLBACK_STATISTICS_BOUND`."""
    if head in UNIT_NORM_HEADS:
        return unit_norm_entry_bound(max_examples)
    return FALLBACK_STATISTICS_BOUND


def unit_norm_entry_bound(max_examples: int) -> float:
    """The largest ``|entry|`` of one site's packed FFC or CCVR statistics (not
    ``isometric``) when every feature has ``‖z‖ ≤ 1`` and the site holds at most
    ``max_examples`` examples: ``|z_j z_k| ≤ ‖z‖² ≤ 1`` bounds every entry of ``V`` and
    of each ``M_c`` by the number of features summed, ``|z_j| ≤ 1`` every entry of ``U``
    and of each ``S_c``, and the counts are that number (SphereFed Eq. 8–9, CCVR Eq. 2).
    Plus :data:`UNIT_NORM_SLACK`.

    Why it matters (issue #24): the bound sets the fixed-point scale of a statistics job
    (``spherecal.crypto.ring.choose_scale_bits``: ``bound · 2^f ≤ 2^50``), so a bound that
    follows the data — 400 examples: ``2^-41`` — rounds ~2000× finer than a fixed 1e6
    (``2^-30``). The rounding noise of a coarse scale also lifts the null space of a
    rank-deficient ``V`` off zero, which slows its eigendecomposition in the FFC solve.
    """
    if max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    return float(max_examples) * (1.0 + UNIT_NORM_SLACK)


def unit_norm_examples_within(bound: float) -> int:
    """The largest example count ``m >= 0`` whose :func:`unit_norm_entry_bound` is at
    most ``bound`` (0 when not even one example's is): the inverse of that bound,
    exact at its edges — ``unit_norm_examples_within(unit_norm_entry_bound(m)) == m``,
    and one ulp below that bound gives ``m - 1``.

    Why: the coordinator chooses each secure statistics job's ``bound``. A site whose
    unit-norm statistics do not fit it would refuse, and that refusal — its own, past
    secure aggregation — answers "does this site hold more than ``m`` examples?"
    exactly, once per bound the coordinator asks with. A site instead computes exact
    statistics over a random subset of this many of its examples
    (``spherecal.participant.statistics_task``), which fit whatever its count."""
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"bound must be a positive finite number, got {bound!r}")
    if bound / (1.0 + UNIT_NORM_SLACK) >= _EXACT_COUNTS:
        return _EXACT_COUNTS  # no site holds that many; float64 counts stop being exact
    m = int(bound / (1.0 + UNIT_NORM_SLACK))
    # the float quotient can land one either side of the exact inverse: step onto it
    while m >= 1 and unit_norm_entry_bound(m) > bound:
        m -= 1
    while unit_norm_entry_bound(m + 1) <= bound:
        m += 1
    return m


def _as_float64_matrix(features: Any) -> np.ndarray:
    if isinstance(features, torch.Tensor):
        features = features.detach().cpu().numpy()
    z = np.asarray(features, dtype=np.float64)
    if z.ndim != 2:
        raise ValueError(f"features must be 2-D (N×l), got shape {z.shape}")
    if not np.isfinite(z).all():
        raise ValueError("features contain NaN or Inf")
    return z


def _as_labels(labels: Any, n: int, num_classes: int) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    y = np.asarray(labels)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"labels must be 1-D of length {n} (one per feature row), got {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0):
        raise ValueError("labels must be integers")
    y = y.astype(np.int64)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{y.min()}, {y.max()}]")
    return y


def triangle_size(dim: int) -> int:
    """Entries in the upper triangle of an l×l matrix, diagonal included."""
    return dim * (dim + 1) // 2


def ffc_layout_size(dim: int, num_classes: int) -> int:
    """Length of the packed FFC vector: ``1 + l(l+1)/2 + l·C``."""
    return 1 + triangle_size(dim) + dim * num_classes


def ccvr_layout_size(dim: int, num_classes: int) -> int:
    """Length of the packed CCVR vector: ``C + C·l + C·l(l+1)/2``."""
    return num_classes * (1 + dim + triangle_size(dim))


def _triangle_scale(dim: int) -> np.ndarray:
    rows, cols = np.triu_indices(dim)
    return np.where(rows == cols, 1.0, SQRT2)


def pack_symmetric(matrices: np.ndarray, *, isometric: bool = False) -> np.ndarray:
    """Upper triangles (diagonal included, row-major) of ``(..., l, l)`` → ``(..., T)``."""
    dim = matrices.shape[-1]
    rows, cols = np.triu_indices(dim)
    tri = matrices[..., rows, cols]
    if isometric:
        tri = tri * _triangle_scale(dim)
    return tri


def unpack_symmetric(triangles: np.ndarray, dim: int, *, isometric: bool = False) -> np.ndarray:
    """Inverse of :func:`pack_symmetric`: ``(..., T)`` → full symmetric ``(..., l, l)``."""
    if triangles.shape[-1] != triangle_size(dim):
        raise ValueError(
            f"a {dim}×{dim} triangle has {triangle_size(dim)} entries, got {triangles.shape[-1]}"
        )
    tri = triangles / _triangle_scale(dim) if isometric else triangles
    rows, cols = np.triu_indices(dim)
    out = np.zeros((*triangles.shape[:-1], dim, dim), dtype=np.float64)
    out[..., rows, cols] = tri
    out[..., cols, rows] = tri
    return out


@dataclass(frozen=True)
class FFCStatistics:
    """FFC sufficient statistics (SphereFed Eq. 9): ``V`` (l×l), ``U`` (l×C), count."""

    V: np.ndarray
    U: np.ndarray
    count: float

    def __post_init__(self) -> None:
        if self.V.ndim != 2 or self.V.shape[0] != self.V.shape[1]:
            raise ValueError(f"V must be square l×l, got {self.V.shape}")
        if self.U.ndim != 2 or self.U.shape[0] != self.V.shape[0]:
            raise ValueError(f"U must be l×C with l={self.V.shape[0]}, got {self.U.shape}")

    @property
    def dim(self) -> int:
        return int(self.V.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.U.shape[1])

    def __add__(self, other: FFCStatistics) -> FFCStatistics:
        if (self.dim, self.num_classes) != (other.dim, other.num_classes):
            raise ValueError("cannot add FFC statistics of different shapes")
        return FFCStatistics(self.V + other.V, self.U + other.U, self.count + other.count)

    def pack(self, *, isometric: bool = False) -> np.ndarray:
        """The documented flat float64 layout (module docstring)."""
        return np.concatenate(
            [
                np.array([self.count], dtype=np.float64),
                pack_symmetric(self.V, isometric=isometric),
                self.U.reshape(-1),
            ]
        )

    @classmethod
    def unpack(
        cls, vector: np.ndarray, dim: int, num_classes: int, *, isometric: bool = False
    ) -> FFCStatistics:
        vec = np.asarray(vector, dtype=np.float64)
        expected = ffc_layout_size(dim, num_classes)
        if vec.shape != (expected,):
            raise ValueError(
                f"packed FFC statistics for l={dim}, C={num_classes} have {expected} entries, "
                f"got shape {vec.shape}"
            )
        t = triangle_size(dim)
        V = unpack_symmetric(vec[1 : 1 + t], dim, isometric=isometric)
        U = vec[1 + t :].reshape(dim, num_classes).copy()
        return cls(V=V, U=U, count=float(vec[0]))


@dataclass(frozen=True)
class CCVRStatistics:
    """CCVR per-class sums (CCVR Eq. 2–4).

    ``counts`` (C), ``sums`` (C×l), ``second_moments`` (C×l×l, symmetric).
    """

    counts: np.ndarray
    sums: np.ndarray
    second_moments: np.ndarray

    def __post_init__(self) -> None:
        c = self.counts.shape[0]
        if self.counts.ndim != 1 or self.sums.ndim != 2 or self.sums.shape[0] != c:
            raise ValueError(
                f"counts must be (C,), sums (C×l); got {self.counts.shape}, {self.sums.shape}"
            )
        dim = self.sums.shape[1]
        if self.second_moments.shape != (c, dim, dim):
            raise ValueError(
                f"second_moments must be ({c}, {dim}, {dim}), got {self.second_moments.shape}"
            )

    @property
    def dim(self) -> int:
        return int(self.sums.shape[1])

    @property
    def num_classes(self) -> int:
        return int(self.counts.shape[0])

    def __add__(self, other: CCVRStatistics) -> CCVRStatistics:
        if (self.dim, self.num_classes) != (other.dim, other.num_classes):
            raise ValueError("cannot add CCVR statistics of different shapes")
        return CCVRStatistics(
            self.counts + other.counts,
            self.sums + other.sums,
            self.second_moments + other.second_moments,
        )

    def to_ffc(self) -> FFCStatistics:
        """FFC follows from CCVR: ``V = Σ_c M_c``, ``U[:, c] = S_c``, count ``Σ_c N_c``."""
        return FFCStatistics(
            V=self.second_moments.sum(axis=0),
            U=self.sums.T.copy(),
            count=float(self.counts.sum()),
        )

    def pack(self, *, isometric: bool = False) -> np.ndarray:
        """The documented flat float64 layout (module docstring)."""
        return np.concatenate(
            [
                self.counts.astype(np.float64),
                self.sums.reshape(-1),
                pack_symmetric(self.second_moments, isometric=isometric).reshape(-1),
            ]
        )

    @classmethod
    def unpack(
        cls, vector: np.ndarray, dim: int, num_classes: int, *, isometric: bool = False
    ) -> CCVRStatistics:
        vec = np.asarray(vector, dtype=np.float64)
        expected = ccvr_layout_size(dim, num_classes)
        if vec.shape != (expected,):
            raise ValueError(
                f"packed CCVR statistics for l={dim}, C={num_classes} have {expected} "
                f"entries, got shape {vec.shape}"
            )
        c, cl = num_classes, num_classes * dim
        triangles = vec[c + cl :].reshape(num_classes, triangle_size(dim))
        return cls(
            counts=vec[:c].copy(),
            sums=vec[c : c + cl].reshape(num_classes, dim).copy(),
            second_moments=unpack_symmetric(triangles, dim, isometric=isometric),
        )


def ffc_from_ccvr(stats: CCVRStatistics) -> FFCStatistics:
    """Derive FFC statistics from CCVR statistics (exact; see :meth:`CCVRStatistics.to_ffc`)."""
    return stats.to_ffc()


def pack_ffc(stats: FFCStatistics, *, isometric: bool = False) -> np.ndarray:
    return stats.pack(isometric=isometric)


def unpack_ffc(
    vector: np.ndarray, dim: int, num_classes: int, *, isometric: bool = False
) -> FFCStatistics:
    return FFCStatistics.unpack(vector, dim, num_classes, isometric=isometric)


def pack_ccvr(stats: CCVRStatistics, *, isometric: bool = False) -> np.ndarray:
    return stats.pack(isometric=isometric)


def unpack_ccvr(
    vector: np.ndarray, dim: int, num_classes: int, *, isometric: bool = False
) -> CCVRStatistics:
    return CCVRStatistics.unpack(vector, dim, num_classes, isometric=isometric)


class FFCAccumulator:
    """Streaming ``V``, ``U``, count over batches, in float64 (memory O(l² + lC))."""

    def __init__(self, dim: int, num_classes: int) -> None:
        self.dim, self.num_classes = dim, num_classes
        self._V = np.zeros((dim, dim))
        self._U = np.zeros((dim, num_classes))
        self._count = 0

    def update(self, features: Any, labels: Any) -> None:
        z = _as_float64_matrix(features)
        if z.shape[1] != self.dim:
            raise ValueError(f"features must have {self.dim} columns, got {z.shape[1]}")
        y = _as_labels(labels, z.shape[0], self.num_classes)
        self._V += z.T @ z
        # U += zᵀ onehot(y): scatter-add rows of z into their label's column.
        np.add.at(self._U.T, y, z)
        self._count += int(z.shape[0])

    def result(self) -> FFCStatistics:
        # Symmetrise away the last-bit asymmetry BLAS may leave in zᵀz.
        V = (self._V + self._V.T) / 2.0
        return FFCStatistics(V=V, U=self._U.copy(), count=float(self._count))


class CCVRAccumulator:
    """Streaming per-class ``N_c``, ``S_c``, ``M_c`` in float64 (memory O(C l²))."""

    def __init__(self, dim: int, num_classes: int) -> None:
        self.dim, self.num_classes = dim, num_classes
        self._counts = np.zeros(num_classes)
        self._sums = np.zeros((num_classes, dim))
        self._second = np.zeros((num_classes, dim, dim))

    def update(self, features: Any, labels: Any) -> None:
        z = _as_float64_matrix(features)
        if z.shape[1] != self.dim:
            raise ValueError(f"features must have {self.dim} columns, got {z.shape[1]}")
        y = _as_labels(labels, z.shape[0], self.num_classes)
        if y.size == 0:
            return
        self._counts += np.bincount(y, minlength=self.num_classes)
        np.add.at(self._sums, y, z)
        # One GEMM per class present in the batch (a loop over ≤ C classes, not samples).
        order = np.argsort(y, kind="stable")
        classes, starts = np.unique(y[order], return_index=True)
        ends = np.append(starts[1:], len(y))
        for c, lo, hi in zip(classes, starts, ends, strict=True):
            zc = z[order[lo:hi]]
            self._second[c] += zc.T @ zc

    def result(self) -> CCVRStatistics:
        second = (self._second + np.swapaxes(self._second, 1, 2)) / 2.0
        return CCVRStatistics(self._counts.copy(), self._sums.copy(), second)


def ffc_statistics(features: Any, labels: Any, num_classes: int) -> FFCStatistics:
    """FFC statistics of one feature matrix (SphereFed Eq. 9). Inputs numpy or torch."""
    z = _as_float64_matrix(features)
    acc = FFCAccumulator(z.shape[1], num_classes)
    acc.update(z, labels)
    return acc.result()


def ccvr_statistics(features: Any, labels: Any, num_classes: int) -> CCVRStatistics:
    """CCVR per-class statistics of one feature matrix (CCVR Eq. 2, as sums)."""
    z = _as_float64_matrix(features)
    acc = CCVRAccumulator(z.shape[1], num_classes)
    acc.update(z, labels)
    return acc.result()


@torch.no_grad()
def extract_features(
    model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(z, y)`` per batch, ``z = model.features(x)``, with the model in eval mode."""
    was_training = model.training
    model.eval()
    try:
        for x, y in batches:
            yield model.features(x), y  # type: ignore[operator]
    finally:
        model.train(was_training)


def make_accumulator(kind: str, dim: int, num_classes: int) -> FFCAccumulator | CCVRAccumulator:
    """A streaming accumulator for ``kind`` in ``{"ffc", "ccvr"}``."""
    if kind == "ffc":
        return FFCAccumulator(dim, num_classes)
    if kind == "ccvr":
        return CCVRAccumulator(dim, num_classes)
    raise ValueError(f"unknown statistics kind {kind!r}; expected 'ffc' or 'ccvr'")


def collect_statistics(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    num_classes: int,
    kind: str = "ffc",
    dim: int | None = None,
) -> FFCStatistics | CCVRStatistics:
    """Stream a model's features over a DataLoader into FFC or CCVR statistics.

    With ``dim`` given, an empty loader yields all-zero statistics (a participant
    with no data still contributes a well-formed zero vector to secure aggregation);
    without it, an empty loader is an error because the shape is unknown.
    """
    acc = None if dim is None else make_accumulator(kind, dim, num_classes)
    for z, y in extract_features(model, batches):
        if acc is None:
            acc = make_accumulator(kind, int(z.shape[1]), num_classes)
        acc.update(z, y)
    if acc is None:
        raise ValueError("no batches and no dim: cannot compute statistics of an empty dataset")
    return acc.result()
