"""A real site's own data (whole mode): the local test split and its settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from participant.data import load_local_data
from participant.settings import DataSettings
from spherecal.config import parse_participant_config


def _npz(path: Path, n: int, classes: int = 5, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    np.savez(path, x=rng.standard_normal((n, 6)).astype(np.float32), y=y)
    return path


def test_default_test_split_is_a_quarter_and_test_fraction_sets_it(tmp_path: Path) -> None:
    root = str(_npz(tmp_path / "site.npz", 100))
    default = load_local_data(DataSettings(dataset="npz", root=root))
    assert (default.train_size, default.test_size) == (75, 25)
    tenth = load_local_data(DataSettings(dataset="npz", root=root, test_fraction=0.1))
    assert (tenth.train_size, tenth.test_size) == (90, 10)
    # stratified: every class keeps its share in the test split
    assert np.bincount(tenth.test_y.numpy(), minlength=5).tolist() == [2] * 5
    assert tenth.image_shape == (6, 1, 1)  # tabular (N, D) -> (N, D, 1, 1)


def test_separate_test_file_trains_on_all_of_root(tmp_path: Path) -> None:
    root = _npz(tmp_path / "train.npz", 30)
    test = _npz(tmp_path / "test.npz", 12, seed=1)
    data = load_local_data(DataSettings(dataset="npz", root=str(root), test_root=str(test)))
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
