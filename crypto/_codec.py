"""Canonical, length-prefixed binary encoding shared by messages, signatures and KDFs.

Why a hand-rolled format instead of pickle/JSON/protobuf: the same bytes are
signed, hashed into commitments and fed to HKDF as context, so the encoding must be
*injective* (two different field tuples never encode to the same bytes) and
*canonical* (a decoder accepts exactly one encoding per value, so re-encoding a
decoded message gives the original bytes back). Fixed-width big-endian integers and
u32-length-prefixed byte strings give both, and the reader rejects anything
truncated, oversized or trailing. pickle is never used: it executes code on load.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence

from spherecal.crypto import native
from spherecal.crypto._exceptions import MalformedMessage

MAX_BYTES = 1 << 31  # one field; chunk payloads are far smaller in practice
MAX_ITEMS = 1 << 20  # entries in one list (participants, shares, ...)
MAX_ID_BYTES = 255
_U32_FROM = struct.Struct(">I").unpack_from


class Writer:
    """Append-only builder of a canonical encoding."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, value: int) -> Writer:
        self._parts.append(struct.pack(">B", value))
        return self

    def u32(self, value: int) -> Writer:
        self._parts.append(struct.pack(">I", value))
        return self

    def u64(self, value: int) -> Writer:
        self._parts.append(struct.pack(">Q", value))
        return self

    def boolean(self, value: bool) -> Writer:
        return self.u8(1 if value else 0)

    def f64(self, value: float) -> Writer:
        if not math.isfinite(value):
            raise MalformedMessage("refusing to encode a non-finite float")
        self._parts.append(struct.pack(">d", value))
        return self

    def raw(self, data: bytes) -> Writer:
        """Fixed-length field: the reader must know the length."""
        self._parts.append(bytes(data))
        return self

    def blob(self, data: bytes | bytearray | memoryview) -> Writer:
        length = len(data) if not isinstance(data, memoryview) else data.nbytes
        if length > MAX_BYTES:
            raise MalformedMessage(f"field of {length} bytes exceeds {MAX_BYTES}")
        self._parts.append(struct.pack(">I", length))
        self._parts.append(bytes(data))
        return self

    def text(self, value: str) -> Writer:
        return self.blob(value.encode("utf-8"))

    def texts(self, values: Iterable[str]) -> Writer:
        """``u32(count)`` then each as :meth:`text` (one loop without per-item calls:
        survivor lists are O(n) ids). The native helper
        (:data:`spherecal.crypto.native.CODEC`) writes a tuple or list of ``str`` in one
        call: the coordinator writes U1, U2 and the survivor and dropout sets into a
        message for every participant, O(n²) ids per job (issue #24)."""
        helper = native.CODEC
        if helper is not None and isinstance(values, (tuple, list)):
            encoded: bytes | None = helper.write_texts(values)
            if encoded is not None:
                self._parts.append(encoded)
                return self
        items = [value.encode("utf-8") for value in values]
        parts = self._parts
        parts.append(struct.pack(">I", len(items)))
        for data in items:
            parts.append(struct.pack(">I", len(data)))
            parts.append(data)
        return self

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Strict cursor over an encoding; every defect raises :class:`MalformedMessage`."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = memoryview(data).cast("B")
        self._pos = 0

    def _take(self, n: int) -> memoryview:
        if n < 0 or self._pos + n > len(self._data):
            raise MalformedMessage("truncated message")
        view = self._data[self._pos : self._pos + n]
        self._pos += n
        return view

    def u8(self) -> int:
        return int(self._take(1)[0])

    def u32(self) -> int:
        value: int = struct.unpack(">I", self._take(4))[0]
        return value

    def u64(self) -> int:
        value: int = struct.unpack(">Q", self._take(8))[0]
        return value

    def boolean(self) -> bool:
        value = self.u8()
        if value not in (0, 1):
            raise MalformedMessage("boolean field is neither 0 nor 1")
        return value == 1

    def f64(self) -> float:
        value: float = struct.unpack(">d", self._take(8))[0]
        if not math.isfinite(value):
            raise MalformedMessage("non-finite float field")
        return value

    def raw(self, n: int) -> bytes:
        return bytes(self._take(n))

    def blob(self, *, max_len: int = MAX_BYTES, exact: int | None = None) -> bytes:
        length = self.u32()
        if length > max_len:
            raise MalformedMessage(f"field of {length} bytes exceeds the limit {max_len}")
        if exact is not None and length != exact:
            raise MalformedMessage(f"field has {length} bytes, expected {exact}")
        return bytes(self._take(length))

    def blob_view(self) -> memoryview:
        """Length-prefixed field without copying (for bulk payloads)."""
        length = self.u32()
        if length > MAX_BYTES:
            raise MalformedMessage(f"field of {length} bytes exceeds the limit {MAX_BYTES}")
        return self._take(length)

    def text(self, *, max_len: int = MAX_ID_BYTES) -> str:
        data = self.blob(max_len=max_len)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedMessage("text field is not valid UTF-8") from exc

    def count(self) -> int:
        n = self.u32()
        if n > MAX_ITEMS:
            raise MalformedMessage(f"list of {n} items exceeds the limit {MAX_ITEMS}")
        return n

    def texts(self) -> tuple[str, ...]:
        """``count`` texts, each as :meth:`text` would read it (same checks, same
        errors) in one loop: survivor lists are O(n) ids. The native helper
        (:data:`spherecal.crypto.native.CODEC`) reads a well-formed list about 12× faster
        (500 ids: 106 → 9 µs; every site reads six such lists a job, issue #24); on any defect it
        returns ``None`` and the loop below raises the precise error."""
        n = self.count()
        helper = native.CODEC
        if helper is not None:
            got = helper.read_texts(self._data, self._pos, n, MAX_ID_BYTES)
            if got is not None:
                out_native: tuple[str, ...]
                out_native, self._pos = got
                return out_native
        data, pos, end = self._data, self._pos, len(self._data)
        out: list[str] = []
        for _ in range(n):
            if pos + 4 > end:
                raise MalformedMessage("truncated message")
            (length,) = _U32_FROM(data, pos)
            pos += 4
            if length > MAX_ID_BYTES:
                raise MalformedMessage(f"field of {length} bytes exceeds the limit {MAX_ID_BYTES}")
            if pos + length > end:
                raise MalformedMessage("truncated message")
            try:
                out.append(str(data[pos : pos + length], "utf-8"))
            except UnicodeDecodeError as exc:
                raise MalformedMessage("text field is not valid UTF-8") from exc
            pos += length
        self._pos = pos
        return tuple(out)

    def finish(self) -> None:
        if self._pos != len(self._data):
            raise MalformedMessage(f"{len(self._data) - self._pos} trailing bytes")


_U32 = struct.Struct(">I").pack
_TAGGED_U64 = struct.Struct(">BQ").pack
_TAGGED_LENGTH = struct.Struct(">BI").pack


def context_text(value: str) -> bytes:
    """One ``str`` part as :func:`encode_context` writes it (``u8(1) u32(len) utf8``): a
    context whose parts differ only in a last text part is ``head + context_text(last)``,
    so its common head can be hashed once (``graph.Graph``'s order, issue #24)."""
    data = value.encode("utf-8")
    return _TAGGED_LENGTH(1, len(data)) + data


def encode_context_texts(*parts: bytes | str | int, texts: Sequence[str]) -> bytes:
    """``encode_context(*parts, *texts)``, the ``texts`` (an O(n) id list: the survivor
    set a consistency signature covers) encoded by the native helper where it is
    loaded (issue #24); tested equal."""
    helper = native.CODEC
    if helper is None:
        return encode_context(*parts, *texts)
    head = encode_context(*parts)
    return _U32(len(parts) + len(texts)) + head[4:] + helper.context_texts(texts)


def encode_context(*parts: bytes | str | int) -> bytes:
    """Injective encoding of a tuple of labels/ids/ints, for signatures, KDF info and
    commitments. Each part is typed and length-prefixed, so ``("ab", "c")`` and
    ``("a", "bc")`` never collide: ``u32(count)``, then per part ``u8(0) u64(int)``,
    ``u8(1) u32(len) utf8`` or ``u8(2) u32(len) bytes`` — the :class:`Writer`
    encoding, built in one join (it runs dozens of times per participant and job:
    share commitments, channel keys, PRG contexts; issue #24), by the native helper
    (:data:`spherecal.crypto.native.CODEC`) where it is loaded and the parts are
    plain ints, ``str`` and ``bytes``."""
    helper = native.CODEC
    if helper is not None:
        encoded: bytes | None = helper.encode_context(parts)
        if encoded is not None:
            return encoded
    out = [_U32(len(parts))]
    append = out.append
    for part in parts:
        kind = type(part)
        if kind is str:
            data = part.encode("utf-8")  # type: ignore[union-attr]
            append(_TAGGED_LENGTH(1, len(data)))
            append(data)
        elif kind is bytes and len(part) <= MAX_BYTES:  # type: ignore[arg-type]
            append(_TAGGED_LENGTH(2, len(part)))  # type: ignore[arg-type]
            append(part)  # type: ignore[arg-type]
        elif kind is int:
            append(_TAGGED_U64(0, part))
        elif isinstance(part, bool):  # bool is an int; keep it out of this API
            raise TypeError("booleans are not context parts")
        elif isinstance(part, int):
            append(_TAGGED_U64(0, int(part)))
        elif isinstance(part, str):
            data = str(part).encode("utf-8")
            append(_TAGGED_LENGTH(1, len(data)))
            append(data)
        else:
            data = bytes(part)
            if len(data) > MAX_BYTES:
                raise MalformedMessage(f"field of {len(data)} bytes exceeds {MAX_BYTES}")
            append(_TAGGED_LENGTH(2, len(data)))
            append(data)
    return b"".join(out)
