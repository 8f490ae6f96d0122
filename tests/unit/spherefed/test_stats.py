"""FFC / CCVR statistics: exactness, additivity over partitions, layouts, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.spherefed.stats import (
    CCVRAccumulator,
    CCVRStatistics,
    FFCAccumulator,
    FFCStatistics,
    ccvr_layout_size,
    ccvr_statistics,
    collect_statistics,
    ffc_from_ccvr,
    ffc_layout_size,
    ffc_statistics,
    pack_ccvr,
    pack_ffc,
    unit_norm_entry_bound,
    unit_norm_examples_within,
    unpack_ccvr,
    unpack_ffc,
)


def _data(n: int, l: int, C: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, l))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return z, rng.integers(0, C, size=n)


def test_ffc_equals_direct_matrix_products() -> None:
    z, y = _data(200, 12, 5, 0)
    s = ffc_statistics(z, y, 5)
    Y = np.eye(5)[y]
    np.testing.assert_allclose(s.V, z.T @ z, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s.U, z.T @ Y, rtol=1e-12, atol=1e-12)
    assert s.count == 200
    np.testing.assert_array_equal(s.V, s.V.T)


def test_torch_input_is_accepted_and_float64_out() -> None:
    z, y = _data(30, 6, 3, 1)
    s = ffc_statistics(torch.tensor(z, dtype=torch.float32), torch.tensor(y), 3)
    assert s.V.dtype == np.float64
    np.testing.assert_allclose(s.V, z.T @ z, rtol=1e-5, atol=1e-5)


def test_ccvr_equals_per_class_products() -> None:
    z, y = _data(150, 8, 4, 2)
    s = ccvr_statistics(z, y, 4)
    for c in range(4):
        zc = z[y == c]
        assert s.counts[c] == len(zc)
        np.testing.assert_allclose(s.sums[c], zc.sum(axis=0), atol=1e-12)
        np.testing.assert_allclose(s.second_moments[c], zc.T @ zc, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 120),
    l=st.integers(1, 9),
    C=st.integers(1, 6),
    clients=st.integers(1, 7),
    seed=st.integers(0, 2**31),
)
def test_client_statistics_sum_to_pooled(n: int, l: int, C: int, clients: int, seed: int) -> None:
    z, y = _data(n, l, C, seed)
    owner = np.random.default_rng(seed + 1).integers(0, clients, size=n)
    ffc_total = FFCStatistics(np.zeros((l, l)), np.zeros((l, C)), 0.0)
    ccvr_total = CCVRStatistics(np.zeros(C), np.zeros((C, l)), np.zeros((C, l, l)))
    for k in range(clients):
        mine = owner == k
        ffc_total = ffc_total + ffc_statistics(z[mine], y[mine], C)
        ccvr_total = ccvr_total + ccvr_statistics(z[mine], y[mine], C)
    pooled = ffc_statistics(z, y, C)
    np.testing.assert_allclose(ffc_total.V, pooled.V, atol=1e-10)
    np.testing.assert_allclose(ffc_total.U, pooled.U, atol=1e-10)
    assert ffc_total.count == pooled.count == n
    pooled_c = ccvr_statistics(z, y, C)
    np.testing.assert_allclose(ccvr_total.second_moments, pooled_c.second_moments, atol=1e-10)
    np.testing.assert_allclose(ccvr_total.sums, pooled_c.sums, atol=1e-10)
    np.testing.assert_array_equal(ccvr_total.counts, pooled_c.counts)
    derived = ffc_from_ccvr(ccvr_total)
    np.testing.assert_allclose(derived.V, pooled.V, atol=1e-10)
    np.testing.assert_allclose(derived.U, pooled.U, atol=1e-10)
    assert derived.count == n


@pytest.mark.parametrize("isometric", [False, True])
def test_pack_unpack_roundtrip_and_layout(isometric: bool) -> None:
    z, y = _data(40, 5, 3, 4)
    f = ffc_statistics(z, y, 3)
    vec = pack_ffc(f, isometric=isometric)
    assert vec.shape == (ffc_layout_size(5, 3),) == (1 + 15 + 15,)
    assert vec[0] == 40
    back = unpack_ffc(vec, 5, 3, isometric=isometric)
    np.testing.assert_allclose(back.V, f.V, atol=1e-14)
    np.testing.assert_array_equal(back.U, f.U)
    # Documented layout: V's upper triangle row-major right after the count.
    assert vec[1] == pytest.approx(f.V[0, 0])
    assert vec[2] == pytest.approx(f.V[0, 1] * (np.sqrt(2) if isometric else 1))
    np.testing.assert_array_equal(vec[16:], f.U.reshape(-1))
    c = ccvr_statistics(z, y, 3)
    cvec = pack_ccvr(c, isometric=isometric)
    assert cvec.shape == (ccvr_layout_size(5, 3),) == (3 + 15 + 45,)
    np.testing.assert_array_equal(cvec[:3], c.counts)
    cback = unpack_ccvr(cvec, 5, 3, isometric=isometric)
    np.testing.assert_allclose(cback.second_moments, c.second_moments, atol=1e-14)


def test_isometric_triangle_norm_equals_frobenius() -> None:
    z, y = _data(1, 6, 2, 5)
    f = ffc_statistics(z, y, 2)  # one sample: V = z zᵀ, ‖V‖_F = 1
    tri = pack_ffc(f, isometric=True)[1 : 1 + 21]
    assert np.linalg.norm(tri) == pytest.approx(np.linalg.norm(f.V), rel=1e-12)
    assert np.linalg.norm(tri) == pytest.approx(1.0, rel=1e-12)


def test_unpack_wrong_length_is_clear() -> None:
    with pytest.raises(ValueError, match="31 entries"):
        unpack_ffc(np.zeros(30), 5, 3)
    with pytest.raises(ValueError, match="entries"):
        unpack_ccvr(np.zeros(10), 5, 3)


@pytest.mark.parametrize(
    ("features", "labels", "match"),
    [
        (np.zeros((3, 2, 1)), np.zeros(3, dtype=int), "2-D"),
        (np.array([[np.nan, 0.0]]), np.zeros(1, dtype=int), "NaN"),
        (np.array([[np.inf, 0.0]]), np.zeros(1, dtype=int), "NaN or Inf"),
        (np.zeros((3, 2)), np.zeros(2, dtype=int), "length 3"),
        (np.zeros((2, 2)), np.array([0, 5]), r"\[0, 3\)"),
        (np.zeros((2, 2)), np.array([-1, 0]), r"\[0, 3\)"),
        (np.zeros((2, 2)), np.array([0.5, 1.0]), "integers"),
    ],
)
def test_bad_input_is_refused(features: np.ndarray, labels: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ffc_statistics(features, labels, 3)
    with pytest.raises(ValueError, match=match):
        ccvr_statistics(features, labels, 3)


def test_accumulators_stream_in_batches_like_one_shot() -> None:
    z, y = _data(97, 7, 4, 6)
    fa, ca = FFCAccumulator(7, 4), CCVRAccumulator(7, 4)
    for lo in range(0, 97, 10):
        fa.update(z[lo : lo + 10], y[lo : lo + 10])
        ca.update(z[lo : lo + 10], y[lo : lo + 10])
    np.testing.assert_allclose(fa.result().V, ffc_statistics(z, y, 4).V, atol=1e-12)
    np.testing.assert_allclose(
        ca.result().second_moments, ccvr_statistics(z, y, 4).second_moments, atol=1e-12
    )
    with pytest.raises(ValueError, match="7 columns"):
        fa.update(np.zeros((2, 3)), np.zeros(2, dtype=int))


class _Identity(torch.nn.Module):
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_collect_statistics_over_loader_and_empty_loader() -> None:
    z, y = _data(50, 4, 3, 7)
    ds = torch.utils.data.TensorDataset(torch.tensor(z), torch.tensor(y))
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    s = collect_statistics(_Identity(), loader, num_classes=3, kind="ccvr")
    assert isinstance(s, CCVRStatistics)
    np.testing.assert_allclose(s.second_moments, ccvr_statistics(z, y, 3).second_moments)
    empty = collect_statistics(_Identity(), [], num_classes=3, kind="ffc", dim=4)
    assert isinstance(empty, FFCStatistics) and empty.count == 0 and not empty.V.any()
    with pytest.raises(ValueError, match="empty"):
        collect_statistics(_Identity(), [], num_classes=3)
    with pytest.raises(ValueError, match="unknown statistics kind"):
        collect_statistics(_Identity(), loader, num_classes=3, kind="x")


@pytest.mark.parametrize("m", [1, 2, 3, 1023, 1024, 1025, 1213, 10**5, 2**41 + 7, 2**42 + 3, 2**50])
def test_the_count_within_a_bound_inverts_the_unit_norm_bound_at_its_edges(m: int) -> None:
    """A site fits its unit-norm statistics to a job's bound by this inverse: at the
    bound of ``m`` examples exactly ``m``, one ulp below ``m - 1``, one ulp above ``m``."""
    bound = unit_norm_entry_bound(m)
    assert unit_norm_examples_within(bound) == m
    assert unit_norm_examples_within(float(np.nextafter(bound, 0.0))) == m - 1
    assert unit_norm_examples_within(float(np.nextafter(bound, np.inf))) == m


def test_the_count_within_a_bound_matches_every_count_tried() -> None:
    counts = np.arange(0, 5000)
    for bound in np.concatenate([np.linspace(0.01, 4000.0, 997), [1.0, 1024.0, 1025.0]]):
        expected = int(counts[counts * (1.0 + 2.0**-10) <= bound].max())
        assert unit_norm_examples_within(float(bound)) == expected


@pytest.mark.parametrize("bound", [0.0, -1.0, float("nan"), float("inf")])
def test_the_count_within_a_bound_needs_a_positive_finite_bound(bound: float) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        unit_norm_examples_within(bound)


def test_the_count_within_a_huge_bound_stops_where_counts_are_exact() -> None:
    assert unit_norm_examples_within(1e300) == 2**52
