"""Local data slices reproduce the reference runner's partition."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spherecal.participant.data import load_local_data, local_test_slices
from spherecal.participant.settings import DataSettings
from spherecal.spherefed.fl import derive_seed
from spherecal.spherefed.reference import ReferenceConfig, prepare_data


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

    from spherecal.participant.data import load_local_slices

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


def test_iid_test_slices_allow_more_participants_than_test_samples() -> None:
    from spherecal.spherefed.partition import iid_partition

    data = prepare_data(ReferenceConfig(dataset="digits", participants=8, partition="iid"))
    settings = DataSettings(dataset="digits", slice_index=0, slice_of=8, partition="iid")
    n_test = len(data.test.y)
    many = local_test_slices(settings, data.test, n_test + 51)
    sizes = [len(s.y) for s in many]
    assert sum(sizes) == n_test and min(sizes) == 0 and max(sizes) == 1
    flat = [s.x.reshape(len(s.y), 64) for s in many]  # digits: 8x8 images
    covered = np.sort(np.concatenate(flat), axis=0)
    assert np.array_equal(covered, np.sort(data.test.x.reshape(n_test, 64), axis=0))
    # up to one participant per test sample: exactly the IID partition, as before
    few = local_test_slices(settings, data.test, 8)
    parts = iid_partition(data.test.y, 8, seed=derive_seed(0, "partition", "test"))
    assert [len(s.y) for s in few] == [len(p) for p in parts]


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
