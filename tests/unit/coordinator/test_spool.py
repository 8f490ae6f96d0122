"""Plaintext upload spool: validated streaming, deterministic ordered sum."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spherecal.coordinator.state.spool import Spool, ordered_sum
from spherecal.proto.codec import TensorFormatError, header_for, iter_chunks


def test_ordered_sum_is_bitwise_the_sequential_sum(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(1001) * 10.0 ** rng.integers(-8, 8) for _ in range(5)]
    spool = Spool(tmp_path)
    paths = []
    for k, v in enumerate(vectors):
        writer = spool.writer("t", f"p{k}", header_for(v), (1001,))
        for chunk in iter_chunks(v, 800):
            writer.add(chunk)
        writer.finish()
        paths.append(writer.path)
    expected = np.zeros(1001)
    for v in vectors:
        expected += v
    out = ordered_sum(paths, 1001, block=64)
    assert np.array_equal(out, expected)  # bit for bit, not approximately


def test_writer_refuses_bad_uploads_and_leaves_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    v = np.ones(10)
    with pytest.raises(TensorFormatError, match="float64"):
        spool.writer("t", "p0", header_for(v.astype(np.float32)), (10,))
    with pytest.raises(TensorFormatError, match="shape"):
        spool.writer("t", "p0", header_for(v), (11,))
    writer = spool.writer("t", "p0", header_for(v), (10,))
    bad = v.copy()
    bad[2] = np.inf
    with pytest.raises(TensorFormatError, match="NaN or infinite"):
        writer.add(bad.tobytes())
    writer.abort()
    writer = spool.writer("t", "p0", header_for(v), (10,))
    writer.add(v[:6].tobytes())  # a stream that ended early (e.g. a late cancel)
    with pytest.raises(TensorFormatError, match="incomplete upload: 48 of 80 bytes"):
        writer.finish()
    writer = spool.writer("t", "p0", header_for(v), (10,))
    writer.add((v * 2).tobytes())
    with pytest.raises(TensorFormatError, match="SHA-256"):
        writer.finish()
    assert list((tmp_path / "t").iterdir()) == []
