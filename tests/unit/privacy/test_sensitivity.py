"""Sensitivity bounds: checked on real neighbouring datasets through the real encoder."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spherecal.crypto.ring import encode
from spherecal.spherefed.privacy.sensitivity import (
    exact_ccvr_statistics,
    exact_ffc_statistics,
    l2_sensitivity,
    quantize_unit_features,
    release_length,
    ring_sensitivity,
)
from spherecal.spherefed.stats import ffc_statistics

Q = 10


def ring_diff(a: np.ndarray, b: np.ndarray, f: int, bound: float) -> np.ndarray:
    ea = encode(a, scale_bits=f, bound=bound).view(np.int64)
    eb = encode(b, scale_bits=f, bound=bound).view(np.int64)
    return (ea - eb).astype(np.float64)


def test_quantised_features_have_norm_at_most_one_in_integers() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(500, 33))
    z[0] = 0.0
    z[1] = np.eye(33)[3] * 7.0  # on-grid unit vector after normalisation
    q = quantize_unit_features(z, Q)
    assert ((q * q).sum(axis=1) <= (1 << (2 * Q))).all()
    unit = z[2:] / np.linalg.norm(z[2:], axis=1, keepdims=True)
    assert (np.abs(q[2:]) <= np.abs(unit) * 2**Q + 1e-9).all()  # truncation toward zero
    assert (q[0] == 0).all() and q[1, 3] == 1 << Q


def test_exact_statistics_do_not_depend_on_row_order_and_match_float_ones() -> None:
    rng = np.random.default_rng(1)
    z, y = rng.normal(size=(300, 16)), rng.integers(0, 4, 300)
    a = exact_ffc_statistics(z, y, 4, quant_bits=Q)
    perm = rng.permutation(300)
    b = exact_ffc_statistics(z[perm], y[perm], 4, quant_bits=Q)
    assert np.array_equal(a.pack(), b.pack())  # bit-identical: exact sums
    ref = ffc_statistics(z / np.linalg.norm(z, axis=1, keepdims=True), y, 4)
    assert np.allclose(a.V, ref.V, atol=300 * 16 * 2.0**-Q) and a.count == 300
    c = exact_ccvr_statistics(z, y, 4, quant_bits=Q)
    assert np.array_equal(c.to_ffc().V, a.V) and np.array_equal(c.to_ffc().U, a.U)


def test_isometric_triangle_has_the_frobenius_norm() -> None:
    rng = np.random.default_rng(2)
    z = rng.normal(size=(1, 12))
    s = exact_ffc_statistics(z, [0], 3, quant_bits=Q)
    tri = s.pack(isometric=True)[1 : 1 + 78]
    assert math.isclose(np.linalg.norm(tri), np.linalg.norm(s.V), rel_tol=1e-12)
    assert np.linalg.norm(s.pack(isometric=True)) <= math.sqrt(3) + 1e-12  # count, V, U


@pytest.mark.parametrize("kind", ["ffc", "ccvr"])
def test_neighbouring_releases_stay_within_the_ring_sensitivity(kind: str) -> None:
    rng = np.random.default_rng(3)
    dim, classes, n = 24, 5, 60
    sens = ring_sensitivity(kind, dim, classes, scale_bits=2 * Q, quant_bits=Q, max_examples=n + 1)
    assert sens.l2 == pytest.approx(math.sqrt(3)) and sens.rounding_inflation < 1e-3
    stat = exact_ffc_statistics if kind == "ffc" else exact_ccvr_statistics
    worst_l2 = worst_l1 = 0.0
    for trial in range(40):
        z, y = rng.normal(size=(n + 1, dim)), rng.integers(0, classes, n + 1)
        if trial % 2:  # adversarial: many near-equal features (coherent rounding)
            z[:] = z[0] + 1e-4 * rng.normal(size=z.shape)
        big = stat(z, y, classes, quant_bits=Q).pack(isometric=True)
        small = stat(z[:-1], y[:-1], classes, quant_bits=Q).pack(isometric=True)
        d = ring_diff(big, small, 2 * Q, float(n + 1))
        worst_l2 = max(worst_l2, float(np.linalg.norm(d)))
        worst_l1 = max(worst_l1, float(np.abs(d).sum()))
    assert worst_l2 <= sens.l2_ring
    assert worst_l1 <= sens.l1_ring
    assert worst_l2 > 0.9 * 2 ** (2 * Q)  # the bound is not vacuous: changes are ~√3·2^f


def test_bound_is_violated_without_the_rounding_inflation() -> None:
    """The inflation term is needed: at a coarse scale some neighbouring pair's encoded
    difference exceeds the un-inflated ``2^f·√3`` (so the test above can fail), while
    every pair stays within the inflated bound."""
    rng = np.random.default_rng(5)
    q = f = 3
    dim = 6
    canary = np.zeros((1, dim))
    canary[0, :4] = 0.5  # on the 1/8 grid with norm exactly 1
    sens = ring_sensitivity("ffc", dim, 2, scale_bits=f, quant_bits=q, max_examples=31)
    norms = []
    for _ in range(300):
        z, y = rng.normal(size=(30, dim)), rng.integers(0, 2, 31)
        big = exact_ffc_statistics(np.vstack([z, canary]), y, 2, quant_bits=q).pack(isometric=True)
        small = exact_ffc_statistics(z, y[:-1], 2, quant_bits=q).pack(isometric=True)
        norms.append(float(np.linalg.norm(ring_diff(big, small, f, 31.0))))
    assert max(norms) > math.sqrt(3) * 2**f
    assert max(norms) <= sens.l2_ring


def test_shapes_and_argument_checks() -> None:
    assert release_length("ffc", 4, 3) == 1 + 10 + 12
    assert release_length("ccvr", 4, 3) == 3 * (1 + 4 + 10)
    assert l2_sensitivity("ffc", blocks=6) == pytest.approx(math.sqrt(6))
    with pytest.raises(ValueError):
        ring_sensitivity("ffc", 4, 3, scale_bits=5, quant_bits=Q, max_examples=10)
    with pytest.raises(ValueError):
        release_length("nope", 4, 3)
    with pytest.raises(ValueError):
        exact_ffc_statistics(np.ones((2, 3)), [0, 5], 3, quant_bits=Q)
