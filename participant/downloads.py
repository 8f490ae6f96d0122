"""Download a published tensor (global model, calibrated head) with its checks.

The header must be the one the instruction announced (dtype, shape, SHA-256), the
payload finite and exactly that long; anything else is a ``DATA_LOSS`` transport
error. A small cache keyed by name and digest spares re-downloading the model a
participant already holds (the same final model feeds statistics and evaluation).
"""

from __future__ import annotations

import grpc
import numpy as np
import numpy.typing as npt

from spherecal.participant.transport import Transport, TransportError
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import TensorAssembler, TensorFormatError

__all__ = ["Cache", "download"]

Cache = dict[str, tuple[bytes, npt.NDArray[np.float64]]]


def download(
    transport: Transport,
    caller: pb.Caller,
    cache: Cache,
    ref: pb.TensorRef,
    shape: tuple[int, ...],
) -> npt.NDArray[np.float64]:
    """The float64 array ``ref`` names, of exactly ``shape`` (read-only)."""
    cached = cache.get(ref.name)
    if cached is not None and cached[0] == bytes(ref.header.sha256):
        return cached[1]
    stream = transport.download_tensor(pb.DownloadRequest(caller=caller, name=ref.name))
    first = next(stream, None)
    if first is None or first.WhichOneof("part") != "header":
        raise TransportError(grpc.StatusCode.DATA_LOSS, f"{ref.name}: no tensor header")
    if first.header.SerializeToString() != ref.header.SerializeToString():
        raise TransportError(
            grpc.StatusCode.DATA_LOSS, f"{ref.name}: header differs from the announced one"
        )
    try:
        assembler = TensorAssembler(
            first.header,
            dtype=pb.FLOAT64,
            shape=shape,
            max_bytes=8 * int(np.prod(shape)),
            finite=True,
        )
        for chunk in stream:
            assembler.add(chunk.data)
        array = np.asarray(assembler.finish(), dtype=np.float64)
    except TensorFormatError as exc:
        raise TransportError(grpc.StatusCode.DATA_LOSS, f"{ref.name}: {exc}") from None
    array.setflags(write=False)
    if len(cache) > 4:
        cache.clear()
    cache[ref.name] = (bytes(ref.header.sha256), array)
    return array
