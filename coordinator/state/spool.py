"""Plaintext uploads spooled to disk and summed in a fixed order.

Used only when secure aggregation is off. Why spool instead of summing as chunks
arrive: floating-point addition is not associative, and the reference runner sums
``Σ_k n_k Δ_k`` in participant order. Summing in *arrival* order would make a
plaintext federation depend on network timing in its last bits — and, over many
rounds, in its accuracies. Spooling each upload to a file and summing the files in
roster order reproduces the reference exactly while keeping memory at O(vector)
(one accumulator plus one chunk), at the cost of O(participants × vector) disk.

Each upload is validated as it streams (size, finiteness, SHA-256) and only becomes
visible once complete; a broken or refused upload leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import TensorFormatError, numpy_dtype

__all__ = ["Spool", "SpoolWriter", "ordered_sum"]


class SpoolWriter:
    """One upload in progress: chunks are checked and appended to a temporary file."""

    def __init__(
        self, path: Path, header: pb.TensorHeader, *, expected_shape: tuple[int, ...]
    ) -> None:
        if header.dtype != pb.FLOAT64:
            raise TensorFormatError(
                f"uploads must be float64, got {numpy_dtype(header.dtype).name}"
            )
        shape = tuple(int(s) for s in header.shape)
        if shape != expected_shape:
            raise TensorFormatError(f"expected shape {expected_shape}, got {shape}")
        if len(header.sha256) != 32:
            raise TensorFormatError("tensor header must carry a 32-byte SHA-256")
        self.path = path
        self.header = header
        self.nbytes = 8 * math.prod(shape)
        self._tmp = path.with_suffix(".part")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed in finish/abort
        self._hash = hashlib.sha256()
        self.received = 0
        self.chunks = 0

    def add(self, data: bytes) -> None:
        n = len(data)
        if self.received + n > self.nbytes:
            raise TensorFormatError(f"upload overruns the announced {self.nbytes} bytes")
        if (self.received % 8) or (n % 8):
            raise TensorFormatError("float64 chunks must hold whole entries")
        if n and not np.isfinite(np.frombuffer(data, dtype="<f8")).all():
            raise TensorFormatError("upload contains NaN or infinite values")
        self._file.write(data)
        self._hash.update(data)
        self.received += n
        self.chunks += 1

    def finish(self) -> str:
        self._file.close()
        if self.received != self.nbytes:
            self.abort()
            raise TensorFormatError(f"incomplete upload: {self.received} of {self.nbytes} bytes")
        if self._hash.digest() != self.header.sha256:
            self.abort()
            raise TensorFormatError("upload SHA-256 does not match its header")
        os.replace(self._tmp, self.path)
        return self._hash.hexdigest()

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


class Spool:
    """A directory of per-task upload files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def writer(
        self, task_id: str, participant: str, header: pb.TensorHeader, shape: tuple[int, ...]
    ) -> SpoolWriter:
        folder = self.root / task_id
        folder.mkdir(parents=True, exist_ok=True)
        safe = hashlib.sha256(participant.encode()).hexdigest()[:24]
        return SpoolWriter(folder / f"{safe}.f64", header, expected_shape=shape)

    def discard(self, task_id: str) -> None:
        shutil.rmtree(self.root / task_id, ignore_errors=True)


def ordered_sum(
    paths: Sequence[Path], length: int, *, block: int = 1 << 18
) -> npt.NDArray[np.float64]:
    """``Σ_k vector_k`` in the given order, element-wise identical to
    ``acc = 0; for v in vectors: acc += v`` but reading each file block by block."""
    acc = np.zeros(length, dtype=np.float64)
    for path in paths:
        with open(path, "rb") as fh:
            for start in range(0, length, block):
                count = min(block, length - start)
                values = np.fromfile(fh, dtype="<f8", count=count)
                if values.shape[0] != count:
                    raise ValueError(f"{path} is shorter than {length} entries")
                acc[start : start + count] += values
    return acc
