"""Tensor codec: dtype + shape + raw bytes, validated before allocating."""

from __future__ import annotations

import numpy as np
import pytest

from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import (
    TensorAssembler,
    TensorFormatError,
    decode_tensor,
    encode_tensor,
    header_for,
    header_nbytes,
    iter_chunks,
)


@pytest.mark.parametrize("dtype", ["<f4", "<f8", "<i8", "<u8", ">f8"])
def test_round_trip_preserves_values_shape_and_dtype(dtype: str) -> None:
    array = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    if array.dtype.kind == "u":
        array = np.abs(array)
    message = pb.Tensor.FromString(encode_tensor(array).SerializeToString())
    out = decode_tensor(message)
    np.testing.assert_array_equal(out, array)
    assert out.shape == (2, 3, 4)
    assert out.dtype == np.dtype(dtype).newbyteorder("<")


def test_streamed_chunks_reassemble_into_one_preallocated_array() -> None:
    array = np.random.default_rng(0).standard_normal(10_001)
    header = header_for(array)
    assembler = TensorAssembler(header, dtype=pb.FLOAT64, shape=(10_001,), max_bytes=1 << 20)
    for chunk in iter_chunks(array, 4096):
        assert len(chunk) <= 4096
        assembler.add(chunk)
    np.testing.assert_array_equal(assembler.finish(), array)
    assert assembler.chunks == -(-array.nbytes // 4096)
    assert header_nbytes(header) == array.nbytes


def test_refuses_unknown_dtype_and_unsupported_arrays() -> None:
    header = pb.TensorHeader(dtype=pb.DTYPE_UNSPECIFIED, shape=[3], sha256=b"\0" * 32)
    with pytest.raises(TensorFormatError, match="unsupported"):
        TensorAssembler(header, max_bytes=100)
    with pytest.raises(TensorFormatError, match="cannot send"):
        header_for(np.zeros(3, dtype=np.complex64))


def test_refuses_wrong_dtype_shape_and_size_before_allocating() -> None:
    header = header_for(np.zeros(4))
    with pytest.raises(TensorFormatError, match="dtype"):
        TensorAssembler(header, dtype=pb.FLOAT32, max_bytes=1 << 20)
    with pytest.raises(TensorFormatError, match="shape"):
        TensorAssembler(header, shape=(5,), max_bytes=1 << 20)
    huge = pb.TensorHeader(dtype=pb.FLOAT64, shape=[1 << 40], sha256=b"\0" * 32)
    with pytest.raises(TensorFormatError, match="exceeds"):
        TensorAssembler(huge, max_bytes=1 << 30)  # would be 8 TiB: refused, not allocated


def test_refuses_overrun_truncation_and_hash_mismatch() -> None:
    array = np.arange(8, dtype=np.float64)
    header = header_for(array)
    assembler = TensorAssembler(header, max_bytes=1 << 20)
    with pytest.raises(TensorFormatError, match="overruns"):
        assembler.add(array.tobytes() + b"\0" * 8)
    assembler = TensorAssembler(header, max_bytes=1 << 20)
    assembler.add(array.tobytes()[:32])
    with pytest.raises(TensorFormatError, match="incomplete"):
        assembler.finish()
    tampered = array.copy()
    tampered[3] = 99
    assembler = TensorAssembler(header, max_bytes=1 << 20)
    assembler.add(tampered.tobytes())
    with pytest.raises(TensorFormatError, match="SHA-256"):
        assembler.finish()


def test_finite_check_refuses_nan_and_inf() -> None:
    array = np.array([1.0, np.nan, 2.0])
    assembler = TensorAssembler(header_for(array), max_bytes=1 << 20, finite=True)
    with pytest.raises(TensorFormatError, match="NaN"):
        assembler.add(array.tobytes())
