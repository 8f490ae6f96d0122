# ruff: noqa: NPY002  (the test checks that the *legacy global* RNG is left untouched)
"""MNIST-1D: procedural (no network), cached, the same bytes in every process."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spherecal.spherefed.data import MNIST1D_ARGS, load_dataset, load_mnist1d

SMALL = 200

_DIGEST = """
import hashlib, sys
from spherecal.spherefed.data import load_mnist1d
s = load_mnist1d(num_samples={n}, cache_dir=sys.argv[1])
h = hashlib.sha256()
for a in (s.train.x, s.train.y, s.test.x, s.test.y):
    h.update(a.tobytes())
print(h.hexdigest())
"""


def _digest(cache: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", _DIGEST.format(n=SMALL), str(cache)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    )
    return out.stdout.strip()


@pytest.mark.long  # two fresh interpreters generate the full data set
def test_two_processes_generate_the_same_bytes_and_the_cache_matches(tmp_path: Path) -> None:
    # Two fresh processes, each generating into its own empty cache: the generator is
    # deterministic. A third reads the first one's cache: the cached bytes are the same.
    first, second = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert first == second and len(first) == 64
    assert len(list((tmp_path / "a").glob("mnist1d-*.npz"))) == 1
    assert _digest(tmp_path / "a") == first


def test_shapes_split_and_global_rng_untouched(tmp_path: Path) -> None:
    np.random.seed(123)
    random.seed(123)
    before_np, before_py = np.random.random(), random.random()
    np.random.seed(123)
    random.seed(123)
    s = load_mnist1d(num_samples=SMALL, cache_dir=tmp_path)
    assert (np.random.random(), random.random()) == (before_np, before_py)
    assert s.train.x.shape == (160, 40, 1, 1) and s.test.x.shape == (40, 40, 1, 1)
    assert s.train.x.dtype == np.float32 and s.num_classes == 10
    assert MNIST1D_ARGS["train_split"] == 0.8  # the package's split is kept
    assert set(np.unique(s.train.y)) == set(range(10))


def test_sample_count_keys_the_cache_and_a_damaged_file_is_regenerated(tmp_path: Path) -> None:
    a = load_mnist1d(num_samples=SMALL, cache_dir=tmp_path)
    load_mnist1d(num_samples=300, cache_dir=tmp_path)
    files = sorted(tmp_path.glob("mnist1d-*.npz"))
    assert len(files) == 2
    target = next(f for f in files if np.load(f)["x"].shape[0] == 160)
    target.write_bytes(b"not an npz")
    again = load_mnist1d(num_samples=SMALL, cache_dir=tmp_path)
    np.testing.assert_array_equal(a.train.x, again.train.x)
    assert (
        hashlib.sha256(target.read_bytes()).hexdigest() != hashlib.sha256(b"not an npz").hexdigest()
    )


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_samples"):
        load_mnist1d(num_samples=5, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="samples"):
        load_dataset("digits", samples=100)
    s = load_dataset("mnist1d", root=str(tmp_path), samples=SMALL)
    assert len(s.train) == 160
