from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.crypto import EncodingOverflow, InvalidSpec, WrongLength
from spherecal.crypto.ring import (
    MAX_SIGNED,
    PRECISION_BITS,
    RING_DTYPE,
    add_noise,
    choose_scale_bits,
    decode,
    encode,
    max_entry_magnitude,
    sum_fits,
)


def test_negative_values_use_twos_complement() -> None:
    out = encode([-1.5, 0.0, 2.25], scale_bits=2, bound=4.0)
    assert out.dtype == RING_DTYPE
    assert out.tolist() == [(1 << 64) - 6, 0, 9]
    assert decode(out, scale_bits=2).tolist() == [-1.5, 0.0, 2.25]


def test_rounds_to_nearest_multiple_of_the_scale() -> None:
    out = encode([0.3, -0.3], scale_bits=3, bound=1.0)  # 2.4 -> 2, -2.4 -> -2
    assert decode(out, scale_bits=3).tolist() == [0.25, -0.25]


def test_refuses_out_of_bound_naming_count_and_bound_not_values() -> None:
    x = np.zeros(10)
    x[[1, 4, 7]] = [123.456, -2.0, 1.0000001]
    with pytest.raises(EncodingOverflow) as err:
        encode(x, scale_bits=10, bound=1.0)
    message = str(err.value)
    assert "3 of 10 entries" in message
    assert "1.0" in message
    assert "123.456" not in message  # never echo private values


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_refuses_nan_and_inf(bad: float) -> None:
    with pytest.raises(EncodingOverflow, match="1 of them NaN or infinite"):
        encode([0.0, bad], scale_bits=10, bound=1.0)


def test_wrong_length_and_shape() -> None:
    with pytest.raises(WrongLength, match="length 3"):
        encode([0.0, 1.0], scale_bits=1, bound=1.0, length=3)
    with pytest.raises(WrongLength, match="1-D"):
        encode(np.zeros((2, 2)), scale_bits=1, bound=1.0)


def test_boundary_value_is_accepted() -> None:
    out = encode([1.0, -1.0], scale_bits=5, bound=1.0)
    assert decode(out, scale_bits=5).tolist() == [1.0, -1.0]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 5000),
    bound=st.floats(1e-6, 1e12, allow_nan=False, allow_infinity=False),
    noise=st.integers(0, 1 << 20),
)
def test_chosen_scale_cannot_overflow_even_at_the_bound(n: int, bound: float, noise: int) -> None:
    f = choose_scale_bits(n, bound, noise)
    assert sum_fits(n, bound, f, noise)
    assert n * max_entry_magnitude(bound, f, noise) <= MAX_SIGNED
    assert math.ldexp(bound, f) <= 2.0**PRECISION_BITS or f == 0
    # Worst case: every participant at +bound (or -bound) plus maximal noise: the
    # exact integer sum stays inside int64, so the ring sum cannot wrap.
    top = encode(np.array([bound, -bound]), scale_bits=f, bound=bound).view("<i8")
    assert abs(int(top[0])) <= max_entry_magnitude(bound, f, 0)
    assert n * (abs(int(top[0])) + noise) <= MAX_SIGNED
    assert n * (abs(int(top[1])) + noise) <= MAX_SIGNED
    if f < 62:  # and it is the finest such scale (or capped for float precision)
        assert (
            not sum_fits(n, bound, f + 1, noise) or math.ldexp(bound, f + 1) > 2.0**PRECISION_BITS
        )


def test_no_scale_fits_a_huge_bound() -> None:
    with pytest.raises(InvalidSpec, match="no scale fits"):
        choose_scale_bits(10, 2.0**62, 0)
    with pytest.raises(InvalidSpec):
        choose_scale_bits(10, math.nan, 0)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 30),
    length=st.integers(1, 50),
    bound=st.sampled_from([1e-3, 0.5, 1.0, 3.0, 1e6]),
    seed=st.integers(0, 2**32 - 1),
)
def test_ring_sum_decodes_within_n_ulps_of_the_exact_sum(
    n: int, length: int, bound: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-bound, bound, (n, length))
    f = choose_scale_bits(n, bound)
    total = np.zeros(length, dtype=RING_DTYPE)
    for row in xs:
        np.add(total, encode(row, scale_bits=f, bound=bound), out=total)
    exact = np.array([math.fsum(col) for col in xs.T])
    assert np.all(np.abs(decode(total, scale_bits=f) - exact) <= n * math.ldexp(1.0, -f))


def test_noise_is_added_in_the_ring_and_bounded() -> None:
    enc = encode([0.0, 0.5, -0.5], scale_bits=4, bound=1.0)
    add_noise(enc, np.array([3, -2, 0], dtype=np.int64), noise_bound=3)
    assert enc.view("<i8").tolist() == [3, 6, -8]
    with pytest.raises(EncodingOverflow, match="1 of 3 entries exceed the job's noise bound 3"):
        add_noise(enc, np.array([4, 0, 0]), noise_bound=3)
    with pytest.raises(EncodingOverflow, match="integer"):
        add_noise(enc, np.array([0.5, 0.0, 0.0]), noise_bound=3)
    with pytest.raises(WrongLength):
        add_noise(enc, np.array([0, 0]), noise_bound=3)
    assert enc.view("<i8").tolist() == [3, 6, -8]  # refused noise changed nothing
