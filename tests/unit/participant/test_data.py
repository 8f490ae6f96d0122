"""Local data slices reproduce the reference runner's partition."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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


def test_mnist1d_slice_is_the_reference_partition_with_the_sample_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPHERECAL_CACHE", str(tmp_path))
    ref = ReferenceConfig(dataset="mnist1d", samples=400, participants=3, alpha=0.5, seed=2)
    data = prepare_data(ref)
    assert len(data.train) + len(data.validation) == 320  # the package's 80 % of 400
    local = load_local_data(
        DataSettings(dataset="mnist1d", samples=400, slice_index=1, slice_of=3, alpha=0.5, seed=2)
    )
    assert np.array_equal(local.train_x.numpy(), data.participant(1).x)
    assert local.image_shape == (40, 1, 1)


def test_samples_is_refused_for_other_datasets() -> None:
    with pytest.raises(ValueError, match="samples"):
        DataSettings(dataset="digits", samples=100)
