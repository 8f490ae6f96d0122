"""A real site's own data (whole mode): the local test split and its settings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from spherecal.config import parse_participant_config
from spherecal.participant.data import load_local_data
from spherecal.participant.settings import DataSettings


def _npz(path: Path, n: int, classes: int = 5, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    np.savez(path, x=rng.standard_normal((n, 6)).astype(np.float32), y=y)
    return path


def test_default_test_split_is_a_quarter_and_test_fraction_sets_it(tmp_path: Path) -> None:
    root = str(_npz(tmp_path / "site.npz", 100))
    default = load_local_data(DataSettings(dataset="npz", root=root))
    assert default.val_y is not None  # 10 % of the 75 training samples: validation
    assert (default.train_size, int(default.val_y.shape[0]), default.test_size) == (67, 8, 25)
    whole = DataSettings(dataset="npz", root=root, validation_fraction=0.0)
    assert (load_local_data(whole).train_size, load_local_data(whole).test_size) == (75, 25)
    tenth = load_local_data(replace(whole, test_fraction=0.1))
    assert (tenth.train_size, tenth.test_size) == (90, 10)
    # stratified: every class keeps its share in the test split
    assert np.bincount(tenth.test_y.numpy(), minlength=5).tolist() == [2] * 5
    assert tenth.image_shape == (6, 1, 1)  # tabular (N, D) -> (N, D, 1, 1)


def test_separate_test_file_trains_on_all_of_root(tmp_path: Path) -> None:
    root = _npz(tmp_path / "train.npz", 30)
    test = _npz(tmp_path / "test.npz", 12, seed=1)
    data = load_local_data(
        DataSettings(dataset="npz", root=str(root), test_root=str(test), validation_fraction=0.0)
    )
    assert (data.train_size, data.test_size) == (30, 12)
    np.testing.assert_array_equal(data.test_y.numpy(), np.arange(12) % 5)


def test_num_classes_for_a_site_without_the_highest_classes(tmp_path: Path) -> None:
    root = str(_npz(tmp_path / "site.npz", 40, classes=4))
    assert load_local_data(DataSettings(dataset="npz", root=root)).num_classes == 4
    assert load_local_data(DataSettings(dataset="npz", root=root, num_classes=10)).num_classes == 10
    with pytest.raises(ValueError, match="labels up to 3"):
        load_local_data(DataSettings(dataset="npz", root=root, num_classes=3))


def test_participant_config_keys(tmp_path: Path) -> None:
    settings = parse_participant_config(
        {
            "participant": {
                "id": "b",
                "insecure": True,
                "out_dir": "models",
                "extractors": ["pkg.nets:small"],
            },
            "data": {
                "dataset": "npz",
                "root": "train.npz",
                "test_root": "test.npz",
                "num_classes": 10,
            },
        },
        base=tmp_path,
    )
    assert settings.out_dir == tmp_path / "models"
    assert settings.extractors == ("pkg.nets:small",)
    assert settings.data.test_root == str(tmp_path / "test.npz")
    assert settings.data.num_classes == 10
    default = parse_participant_config({"participant": {"id": "b"}}, base=tmp_path)
    assert default.out_dir == tmp_path / "participant-b-out"
    with pytest.raises(ValueError, match="test_fraction"):
        parse_participant_config(
            {"participant": {"id": "b"}, "data": {"test_fraction": 0.0}}, base=tmp_path
        )


def test_whole_mode_validation_split_is_stratified_seeded_and_disjoint(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    y = np.repeat(np.arange(4), [40, 30, 20, 10])
    x = rng.standard_normal((100, 6)).astype(np.float32)
    x[:, 0] = np.arange(100)  # a sample's identity, to follow it through the splits
    root = tmp_path / "train.npz"
    np.savez(root, x=x, y=y)
    test = _npz(tmp_path / "test.npz", 8, classes=4)
    base = DataSettings(dataset="npz", root=str(root), test_root=str(test))
    data = load_local_data(base)  # default validation_fraction = 0.1
    assert data.val_x is not None and data.val_y is not None
    assert (data.train_size, int(data.val_y.shape[0])) == (90, 10)
    # stratified: every class keeps its 10 % share
    assert np.bincount(data.val_y.numpy(), minlength=4).tolist() == [4, 3, 2, 1]
    ids_train = data.train_x.numpy()[:, 0, 0, 0]
    ids_val = data.val_x.numpy()[:, 0, 0, 0]
    assert set(ids_train).isdisjoint(ids_val)
    np.testing.assert_array_equal(np.sort(np.concatenate([ids_train, ids_val])), np.arange(100))
    # labels travel with their samples
    np.testing.assert_array_equal(data.val_y.numpy(), y[ids_val.astype(np.int64)])
    again = load_local_data(base)
    assert again.val_x is not None
    np.testing.assert_array_equal(again.val_x.numpy(), data.val_x.numpy())
    other = load_local_data(replace(base, seed=1))
    assert other.val_x is not None
    assert not np.array_equal(other.val_x.numpy()[:, 0, 0, 0], ids_val)
    quarter = load_local_data(replace(base, validation_fraction=0.25))
    assert quarter.val_y is not None and int(quarter.val_y.shape[0]) == 25
    nothing = load_local_data(replace(base, validation_fraction=0.0))
    assert nothing.val_x is None and nothing.train_size == 100


def test_validation_fraction_bounds_and_too_small_site(tmp_path: Path) -> None:
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="validation_fraction must be in"):
            DataSettings(validation_fraction=bad)
    with pytest.raises(ValueError, match="whole mode"):
        DataSettings(slice_index=0, slice_of=2, validation_fraction=0.0)
    one = _npz(tmp_path / "one.npz", 1)
    test = _npz(tmp_path / "t.npz", 4, seed=1)
    with pytest.raises(ValueError, match="too few to hold any out"):
        load_local_data(DataSettings(dataset="npz", root=str(one), test_root=str(test)))
    alone = load_local_data(
        DataSettings(dataset="npz", root=str(one), test_root=str(test), validation_fraction=0.0)
    )
    assert alone.train_size == 1 and alone.val_x is None


def test_validation_fraction_config_key(tmp_path: Path) -> None:
    settings = parse_participant_config(
        {"participant": {"id": "b"}, "data": {"validation_fraction": 0.0}}, base=tmp_path
    )
    assert settings.data.validation_fraction == 0.0
    with pytest.raises(ValueError, match="validation_fraction"):
        parse_participant_config(
            {"participant": {"id": "b"}, "data": {"validation_fraction": 1.0}}, base=tmp_path
        )
