"""Local data slices reproduce the reference runner's partition."""

from __future__ import annotations

import numpy as np

from participant.data import load_local_data, local_test_slices
from participant.settings import DataSettings
from spherefed.runner import ReferenceConfig, prepare_data


def test_slices_are_the_reference_partition_and_cover_the_test_split() -> None:
    n = 4
    data = prepare_data(ReferenceConfig(participants=n, alpha=0.3, seed=7))
    settings = DataSettings(slice_of=n, slice_index=0, alpha=0.3, seed=7)
    tests = local_test_slices(settings, data.test, n)
    assert sum(len(t) for t in tests) == len(data.test)
    for k in range(n):
        local = load_local_data(DataSettings(slice_index=k, slice_of=n, alpha=0.3, seed=7))
        expected = data.participant(k)
        assert np.array_equal(local.train_x.numpy(), expected.x)
        assert np.array_equal(local.train_y.numpy(), expected.y)
        assert np.array_equal(local.test_y.numpy(), tests[k].y)


def test_many_slices_at_once_equal_one_by_one() -> None:
    from dataclasses import replace

    from participant.data import load_local_slices

    base = DataSettings(dataset="digits", slice_index=0, slice_of=5, alpha=0.5, seed=2)
    wanted = [replace(base, slice_index=k) for k in (4, 0, 2)] + [
        replace(base, slice_index=1, seed=3)  # another partition in the same call
    ]
    together = load_local_slices(wanted)
    for settings, got in zip(wanted, together, strict=True):
        alone = load_local_data(settings)
        assert got.name == alone.name
        for field in ("train_x", "train_y", "test_x", "test_y"):
            assert np.array_equal(getattr(got, field).numpy(), getattr(alone, field).numpy())
    assert not np.array_equal(together[2].train_y.numpy(), together[3].train_y.numpy())
