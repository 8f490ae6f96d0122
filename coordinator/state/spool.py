"""Plaintext uploads spooled to disk and summed in a fixed order.

Used only when secure aggregation is off. Why spool instead of summing as chunks
arrive: floating-point addition is not associative, and the reference runner sums
``Σ_k n_k Δ_k`` in participant order. Summing in *arrival* order would make a
plaintext federation depend on network timing in its last bits — and, over many
rounds, in its accuracies. Spooling each upload to a file and summing the files in
roster order reproduces the reference exactly while keeping memory at O(vector)
(one accumulator plus one chunk), at the cost of O(participants × vector) disk.

Each upload is validated as it streams (size, finiteness, SHA-256) and only becomes
visible once complete; a broken or refused upload leaves nothing behind. A write
the file system refuses (disk full, I/O error, read-only) is a storage fault
(:mod:`~spherecal.coordinator.state.storage_faults`): reported to the store, which
stops the coordinator, and raised as :class:`StorageFailed` to the uploader.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.errors import StorageFailed
from spherecal.coordinator.state.storage_faults import storage_failure
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import TensorFormatError, numpy_dtype

__all__ = ["Spool", "SpoolWriter", "ordered_sum"]

Report = Callable[[StorageFailed], StorageFailed]


@contextmanager
def _writing(path: Path, report: Report | None) -> Iterator[None]:
    """A file-system write whose storage fault is reported and raised as one."""
    try:
        yield
    except OSError as exc:
        fault = storage_failure(path, exc)
        if fault is None:
            raise
        raise (report(fault) if report is not None else fault) from exc


class SpoolWriter:
    """One upload in progress: chunks are checked and appended to a temporary file."""

    def __init__(
        self,
        path: Path,
        header: pb.TensorHeader,
        *,
        expected_shape: tuple[int, ...],
        report: Report | None = None,
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
        self._report = report
        with _writing(self._tmp, report):
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
        with _writing(self._tmp, self._report):
            self._file.write(data)
        self._hash.update(data)
        self.received += n
        self.chunks += 1

    def finish(self) -> str:
        try:
            with _writing(self._tmp, self._report):
                self._file.close()
        except StorageFailed:
            self.abort()
            raise
        if self.received != self.nbytes:
            self.abort()
            raise TensorFormatError(f"incomplete upload: {self.received} of {self.nbytes} bytes")
        if self._hash.digest() != self.header.sha256:
            self.abort()
            raise TensorFormatError("upload SHA-256 does not match its header")
        with _writing(self.path, self._report):
            os.replace(self._tmp, self.path)
        return self._hash.hexdigest()

    def abort(self) -> None:
        if not self._file.closed:
            with contextlib.suppress(OSError):  # a full disk cannot flush: drop it
                self._file.close()
        self._tmp.unlink(missing_ok=True)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


class Spool:
    """A directory of per-task upload files."""

    def __init__(self, root: Path, *, report: Report | None = None) -> None:
        self.root = root
        self.report = report
        """Where a storage fault is reported (the store's ``report_failure``)."""
        self.root.mkdir(parents=True, exist_ok=True)

    def writer(
        self, task_id: str, participant: str, header: pb.TensorHeader, shape: tuple[int, ...]
    ) -> SpoolWriter:
        folder = self.root / task_id
        with _writing(folder, self.report):
            folder.mkdir(parents=True, exist_ok=True)
        safe = hashlib.sha256(participant.encode()).hexdigest()[:24]
        return SpoolWriter(folder / f"{safe}.f64", header, expected_shape=shape, report=self.report)

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
