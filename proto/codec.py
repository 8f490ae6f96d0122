"""Tensors on the wire: dtype + shape + raw little-endian bytes, never pickle.

Why not ``torch.save``/pickle: a pickle is a program, and the coordinator and the
participants do not trust each other's bytes. A header (dtype from a closed list,
shape, SHA-256) followed by raw chunks can only ever decode to a numeric array of
the announced size — and the receiver decides up front how large that may be, so a
hostile header cannot make it allocate unbounded memory.

The model a federation trains (``spherecal.spherefed.network.ModelSpec``) crosses the wire in
the ``Plan`` and is written next to the saved models as ``model_spec.json``; both
conversions live here too (as plain fields: ``proto`` is the lowest layer and imports
none of ours) (:func:`model_spec_to_proto`, :func:`model_spec_from_proto`,
:func:`model_spec_to_json`, :func:`model_spec_from_json`), so a new field is added in
one place.

Streaming: :func:`iter_chunks` slices an array's bytes into chunks of a few MB (views,
no copies) and :class:`TensorAssembler` writes incoming chunks straight into one
preallocated array, hashing as it goes: O(tensor) memory, never O(tensor × copies).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, TypedDict

import numpy as np
import numpy.typing as npt

from spherecal.proto import spherecal_pb2 as pb

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "TensorAssembler",
    "TensorFormatError",
    "decode_tensor",
    "dtype_of",
    "encode_tensor",
    "header_for",
    "header_nbytes",
    "iter_chunks",
    "ModelSpecFields",
    "ModelSpecLike",
    "model_spec_from_json",
    "model_spec_from_proto",
    "model_spec_to_json",
    "model_spec_to_proto",
    "numpy_dtype",
]

DEFAULT_CHUNK_BYTES = 2 << 20  # 2 MiB: well under any gRPC message limit we set

_TO_NUMPY: dict[pb.DType, np.dtype[np.generic]] = {
    pb.FLOAT32: np.dtype("<f4"),
    pb.FLOAT64: np.dtype("<f8"),
    pb.INT64: np.dtype("<i8"),
    pb.UINT64: np.dtype("<u8"),
}
_FROM_NUMPY: dict[str, pb.DType] = {
    "f4": pb.FLOAT32,
    "f8": pb.FLOAT64,
    "i8": pb.INT64,
    "u8": pb.UINT64,
}


class TensorFormatError(ValueError):
    """A tensor header or payload that does not match what was announced or expected."""


def numpy_dtype(code: pb.DType) -> np.dtype[np.generic]:
    """The numpy dtype of a wire dtype code (refusing unknown codes)."""
    try:
        return _TO_NUMPY[code]
    except KeyError:
        raise TensorFormatError(f"unsupported tensor dtype code {code}") from None


def dtype_of(array: npt.NDArray[np.generic]) -> pb.DType:
    """The wire dtype code of a numpy array (float32/64, int64, uint64 only)."""
    key = f"{array.dtype.kind}{array.dtype.itemsize}"
    if key not in _FROM_NUMPY:
        raise TensorFormatError(f"cannot send arrays of dtype {array.dtype}")
    return _FROM_NUMPY[key]


def _le_contiguous(array: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    want = array.dtype.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=want)


def header_for(array: npt.NDArray[np.generic]) -> pb.TensorHeader:
    """Header (dtype, shape, SHA-256 of the raw bytes) describing ``array``."""
    arr = _le_contiguous(array)
    digest = hashlib.sha256(arr.data.cast("B")).digest()
    return pb.TensorHeader(dtype=dtype_of(arr), shape=list(arr.shape), sha256=digest)


def header_nbytes(header: pb.TensorHeader) -> int:
    """Bytes the raw payload of ``header`` must have."""
    return numpy_dtype(header.dtype).itemsize * math.prod(header.shape)


def encode_tensor(array: npt.NDArray[np.generic]) -> pb.Tensor:
    """A small tensor as one message."""
    arr = _le_contiguous(array)
    return pb.Tensor(header=header_for(arr), data=arr.tobytes())


def decode_tensor(
    message: pb.Tensor,
    *,
    dtype: pb.DType | None = None,
    shape: Sequence[int] | None = None,
    max_bytes: int = 64 << 20,
) -> npt.NDArray[np.generic]:
    """Decode a one-message tensor, checking dtype/shape (when given), size and hash."""
    assembler = TensorAssembler(message.header, dtype=dtype, shape=shape, max_bytes=max_bytes)
    assembler.add(message.data)
    return assembler.finish()


def iter_chunks(
    array: npt.NDArray[np.generic], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[bytes]:
    """The raw bytes of ``array`` in order, ``chunk_bytes`` at a time."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be positive")
    view = _le_contiguous(array).data.cast("B")
    for start in range(0, len(view), chunk_bytes):
        yield bytes(view[start : start + chunk_bytes])


class TensorAssembler:
    """Receive a streamed tensor into one preallocated array.

    Construct from the header (validated against the expected dtype/shape and the
    byte budget *before* allocating), :meth:`add` each chunk (refused when it would
    overflow or when ``finite`` is required and it holds NaN/Inf), then
    :meth:`finish` (refused unless complete and the SHA-256 matches).
    """

    def __init__(
        self,
        header: pb.TensorHeader,
        *,
        dtype: pb.DType | None = None,
        shape: Sequence[int] | None = None,
        max_bytes: int,
        finite: bool = False,
    ) -> None:
        np_dtype = numpy_dtype(header.dtype)
        if dtype is not None and header.dtype != dtype:
            raise TensorFormatError(
                f"expected dtype {numpy_dtype(dtype).name}, got {np_dtype.name}"
            )
        got_shape = tuple(int(s) for s in header.shape)
        if shape is not None and got_shape != tuple(shape):
            raise TensorFormatError(f"expected shape {tuple(shape)}, got {got_shape}")
        nbytes = np_dtype.itemsize * math.prod(got_shape)
        if nbytes > max_bytes:
            raise TensorFormatError(
                f"tensor of {nbytes} bytes exceeds the limit of {max_bytes} bytes"
            )
        if len(header.sha256) != 32:
            raise TensorFormatError("tensor header must carry a 32-byte SHA-256")
        self.header = header
        self.nbytes = nbytes
        self._finite = finite and np_dtype.kind == "f"
        self._array: npt.NDArray[np.generic] = np.empty(got_shape, dtype=np_dtype)
        self._flat = self._array.reshape(-1).data.cast("B")
        self._hash = hashlib.sha256()
        self._offset = 0
        self.chunks = 0

    @property
    def received(self) -> int:
        return self._offset

    def add(self, data: bytes) -> None:
        n = len(data)
        if self._offset + n > self.nbytes:
            raise TensorFormatError(
                f"payload overruns the announced {self.nbytes} bytes "
                f"(have {self._offset}, chunk of {n})"
            )
        itemsize = self._array.dtype.itemsize
        if self._finite and n:
            if self._offset % itemsize or n % itemsize:
                raise TensorFormatError("float chunks must hold whole entries")
            values = np.frombuffer(data, dtype=self._array.dtype)
            if not np.isfinite(values).all():
                raise TensorFormatError("tensor contains NaN or infinite values")
        self._flat[self._offset : self._offset + n] = data
        self._hash.update(data)
        self._offset += n
        self.chunks += 1

    def finish(self) -> npt.NDArray[np.generic]:
        if self._offset != self.nbytes:
            raise TensorFormatError(
                f"incomplete tensor: received {self._offset} of {self.nbytes} bytes"
            )
        if self._hash.digest() != self.header.sha256:
            raise TensorFormatError("tensor SHA-256 does not match its header")
        return self._array

    @property
    def sha256(self) -> bytes:
        return self._hash.digest()


# ----------------------------------------------------------------------------- ModelSpec


class ModelSpecLike(Protocol):
    """The fields of :class:`spherecal.spherefed.network.ModelSpec` (``proto`` is the lowest
    layer and does not import ``spherefed``; callers build the dataclass from
    :class:`ModelSpecFields`)."""

    @property
    def extractor(self) -> str: ...
    @property
    def head(self) -> str: ...
    @property
    def norm(self) -> str: ...
    @property
    def classifier(self) -> str: ...
    @property
    def classifier_seed(self) -> int: ...
    @property
    def init_seed(self) -> int: ...
    @property
    def num_classes(self) -> int: ...
    @property
    def in_channels(self) -> int: ...
    @property
    def image_size(self) -> int | tuple[int, int]: ...
    @property
    def feature_dim(self) -> int | None: ...


class ModelSpecFields(TypedDict):
    """Constructor arguments of ``spherecal.spherefed.network.ModelSpec``:
    ``ModelSpec(**fields)``."""

    extractor: str
    head: str
    norm: str
    classifier: str
    classifier_seed: int
    init_seed: int
    num_classes: int
    in_channels: int
    image_size: tuple[int, int]
    feature_dim: int | None


def _image_size(spec: ModelSpecLike) -> tuple[int, int]:
    size = spec.image_size
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def model_spec_to_proto(spec: ModelSpecLike) -> pb.ModelSpec:
    """``spec`` as the ``Plan``'s ``ModelSpec`` (``feature_dim`` 0 = the default)."""
    h, w = _image_size(spec)
    return pb.ModelSpec(
        extractor=spec.extractor,
        head=spec.head,
        norm=spec.norm,
        classifier=spec.classifier,
        classifier_seed=spec.classifier_seed,
        init_seed=spec.init_seed,
        num_classes=spec.num_classes,
        in_channels=spec.in_channels,
        image_height=h,
        image_width=w,
        feature_dim=spec.feature_dim or 0,
    )


def model_spec_from_proto(message: pb.ModelSpec) -> ModelSpecFields:
    """The inverse of :func:`model_spec_to_proto` (``ModelSpec(**fields)``)."""
    return ModelSpecFields(
        extractor=message.extractor,
        head=message.head,
        norm=message.norm,
        classifier=message.classifier,
        classifier_seed=int(message.classifier_seed),
        init_seed=int(message.init_seed),
        num_classes=int(message.num_classes),
        in_channels=int(message.in_channels),
        image_size=(int(message.image_height), int(message.image_width)),
        feature_dim=int(message.feature_dim) or None,
    )


_JSON_FIELDS: dict[str, type] = {
    "extractor": str,
    "head": str,
    "norm": str,
    "classifier": str,
    "classifier_seed": int,
    "init_seed": int,
    "num_classes": int,
    "in_channels": int,
}


def model_spec_to_json(spec: ModelSpecLike) -> dict[str, Any]:
    """``spec`` as the ``model_spec.json`` object (``image_size`` as ``[h, w]``)."""
    out: dict[str, Any] = {name: getattr(spec, name) for name in _JSON_FIELDS}
    out["image_size"] = list(_image_size(spec))
    out["feature_dim"] = spec.feature_dim
    return out


def model_spec_from_json(data: Mapping[str, Any]) -> ModelSpecFields:
    """The inverse of :func:`model_spec_to_json`, refusing missing or mistyped fields."""
    values: dict[str, Any] = {}
    for name, kind in _JSON_FIELDS.items():
        value = data.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"model spec: {name} must be a {kind.__name__}, got {value!r}")
        values[name] = value
    size = data.get("image_size")
    if not (
        isinstance(size, list)
        and len(size) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        raise ValueError(f"model spec: image_size must be [height, width], got {size!r}")
    feature_dim = data.get("feature_dim")
    if feature_dim is not None and (
        not isinstance(feature_dim, int) or isinstance(feature_dim, bool)
    ):
        raise ValueError(f"model spec: feature_dim must be an integer or null, got {feature_dim!r}")
    return ModelSpecFields(**values, image_size=(size[0], size[1]), feature_dim=feature_dim)  # type: ignore[typeddict-item]
