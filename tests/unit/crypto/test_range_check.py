"""The server refuses a decoded sum that no set of in-bound inputs could produce."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spherecal.crypto import AggregateOutOfRange, JobAborted, SecAggPolicy, Stage
from spherecal.crypto.ring import RING_DTYPE, entries_out_of_range, max_entry_magnitude

from .helpers import Net


def _net(**kwargs: object) -> Net:
    net = Net(4, threshold=3, consistency=True, policy=SecAggPolicy(), length=9, **kwargs)  # type: ignore[arg-type]
    net.advertise()
    net.share()
    net.deliver_bundles()
    return net


def _finish(net: Net) -> object:
    for p in net.ids:
        net.upload(p)
    net.server.close_stage()
    net.consistency()
    return net.unmask()


def _cheat(net: Net, pid: str, units: int) -> None:
    """A malicious participant bypasses ``set_input``'s bound check: its masked
    upload is well formed (right length, right masks) but encodes ``units`` ring
    units in entry 3 — far beyond ``bound``."""
    client = net.clients[pid]
    encoded = np.zeros(net.spec.length, dtype=RING_DTYPE)
    encoded[3] = np.uint64(units % (1 << 64))
    client._encoded = encoded  # the participant's own input buffer, before masking


@pytest.mark.parametrize("sign", [+1, -1])
def test_out_of_bound_upload_aborts_instead_of_returning_the_sum(sign: int) -> None:
    net = _net()
    per_input = max_entry_magnitude(net.spec.bound, net.spec.scale_bits)
    # The three honest inputs contribute at most 3 × per_input: the sum exceeds the
    # 4 × per_input any four in-bound inputs could reach.
    _cheat(net, "p01", sign * 8 * per_input)
    with pytest.raises(AggregateOutOfRange, match="1 of 9 entries") as err:
        _finish(net)
    assert err.value.kind == "aggregate_out_of_range"
    assert net.server.stage is Stage.ABORTED and net.server.result is None
    with pytest.raises(JobAborted):
        net.server.finish()


def test_sums_at_the_bound_and_with_declared_noise_are_accepted() -> None:
    net = _net()
    for p in net.ids:  # every honest input at +bound: the extreme honest sum
        net.inputs[p] = np.full(net.spec.length, net.spec.bound)
        net.clients[p].set_input(net.inputs[p])
    result = _finish(net)
    assert np.allclose(result.values, 4 * net.spec.bound)  # type: ignore[attr-defined]

    noisy = _net(noise_bound=1000)
    for p in noisy.ids:
        noisy.inputs[p] = np.full(noisy.spec.length, -noisy.spec.bound)
        noisy.clients[p].set_input(noisy.inputs[p], noise=np.full(noisy.spec.length, -1000))
    result = _finish(noisy)
    expected = -4 * (max_entry_magnitude(noisy.spec.bound, noisy.spec.scale_bits) + 1000)
    assert int(result.ring_sum.view(np.int64)[0]) == expected  # type: ignore[attr-defined]


def test_noise_beyond_the_declared_allowance_is_refused() -> None:
    net = _net(noise_bound=1000)
    per_input = max_entry_magnitude(net.spec.bound, net.spec.scale_bits, 1000)
    _cheat(net, "p00", 8 * per_input)
    with pytest.raises(AggregateOutOfRange):
        _finish(net)


def test_entries_out_of_range_counts_against_an_independent_computation() -> None:
    rng = np.random.default_rng(4)
    bound, scale_bits, inputs = 2.0, 20, 3
    limit = inputs * math.ceil(bound * 2**scale_bits)
    signed = rng.integers(-2 * limit, 2 * limit, 1000, dtype=np.int64)
    signed[:2] = (limit, -limit)  # the edges are in range
    expected = sum(1 for v in signed.tolist() if abs(v) > limit)
    got = entries_out_of_range(
        signed.view(np.uint64), inputs=inputs, bound=bound, scale_bits=scale_bits, noise_bound=0
    )
    assert got == expected > 0
    inside = np.clip(signed, -limit, limit).view(np.uint64)
    assert entries_out_of_range(inside, inputs=3, bound=bound, scale_bits=20, noise_bound=0) == 0
