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
