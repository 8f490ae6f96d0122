"""The one-join ``encode_context`` (issue #24) gives exactly the bytes of the
:class:`Writer` encoding it replaced: signatures, KDF contexts and commitments made
by older and newer code agree, and the encoding stays injective."""

from __future__ import annotations

import enum
import random

import pytest

from spherecal.crypto._codec import Writer, context_text, encode_context


def _writer_encoding(*parts: bytes | str | int) -> bytes:
    """The previous implementation, kept here as the independent reference."""
    w = Writer()
    w.u32(len(parts))
    for part in parts:
        if isinstance(part, bool):
            raise TypeError("booleans are not context parts")
        if isinstance(part, int):
            w.u8(0).u64(part)
        elif isinstance(part, str):
            w.u8(1).text(part)
        else:
            w.u8(2).blob(part)
    return w.getvalue()


class Kind(enum.IntEnum):
    SEED = 1
    MASK_KEY = 2


def _random_part(rng: random.Random) -> bytes | str | int | bytearray | memoryview:
    choice = rng.randrange(6)
    if choice == 0:
        return rng.randrange(0, 1 << 64)
    if choice == 1:
        return "".join(rng.choice("ab\u00e9\u4e2d-_0") for _ in range(rng.randrange(0, 20)))
    if choice == 2:
        return rng.randbytes(rng.randrange(0, 70))
    if choice == 3:
        return bytearray(rng.randbytes(rng.randrange(0, 9)))
    if choice == 4:
        return memoryview(rng.randbytes(rng.randrange(0, 9)))
    return Kind(rng.choice([1, 2]))


def test_bytes_equal_the_writer_encoding() -> None:
    rng = random.Random(24)
    for _ in range(2000):
        parts = [_random_part(rng) for _ in range(rng.randrange(0, 12))]
        assert encode_context(*parts) == _writer_encoding(*parts)  # type: ignore[arg-type]
    assert encode_context() == _writer_encoding()


def test_types_stay_apart_and_bad_parts_are_refused() -> None:
    assert encode_context("ab", "c") != encode_context("a", "bc")
    assert len({encode_context(b"1"), encode_context("1"), encode_context(1)}) == 3
    with pytest.raises(TypeError):
        encode_context(True)
    with pytest.raises(Exception):  # noqa: B017 - struct.error: not a u64
        encode_context(-1)


def test_text_lists_encode_as_count_then_each_text() -> None:
    ids = [f"p{i:04d}" for i in range(300)] + ["\u00e9t\u00e9", ""]
    reference = Writer().u32(len(ids))
    for item in ids:
        reference.text(item)
    assert Writer().texts(ids).getvalue() == reference.getvalue()


def test_text_lists_decode_as_each_text_would_with_the_same_errors() -> None:
    from spherecal.crypto._codec import Reader
    from spherecal.crypto._exceptions import MalformedMessage

    def one_by_one(data: bytes) -> tuple[str, ...] | str:
        r = Reader(data)
        try:
            return tuple(r.text() for _ in range(r.count()))
        except MalformedMessage as exc:
            return str(exc)

    def together(data: bytes) -> tuple[str, ...] | str:
        try:
            return Reader(data).texts()
        except MalformedMessage as exc:
            return str(exc)

    rng = random.Random(5)
    good = Writer().texts([f"p{i}" for i in range(40)] + ["\u00e9", ""]).getvalue()
    cases = [good, good[:-1], good[:3], good + b"x"]
    cases += [Writer().u32(1).u32(256).raw(bytes(256)).getvalue()]  # over the id limit
    cases += [Writer().u32(1).blob(b"\xff\xfe").getvalue()]  # not UTF-8
    for _ in range(300):
        blob = bytearray(good)
        blob[rng.randrange(len(blob))] = rng.randrange(256)
        cases.append(bytes(blob[: rng.randrange(len(blob) + 1)]))
    for data in cases:
        assert together(data) == one_by_one(data)


@pytest.mark.parametrize("last", ["", "p0", "site-ü", "x" * 255])
def test_a_text_tail_completes_the_head_of_a_context(last: str) -> None:
    """``context_text`` lets a caller hash a context's common head once (the masking
    graph's order): head + tail must be the whole context's bytes."""
    head = _writer_encoding(b"label", "graph-order", b"job", "")[: -len(context_text(""))]
    assert head + context_text(last) == _writer_encoding(b"label", "graph-order", b"job", last)
    assert head + context_text(last) == encode_context(b"label", "graph-order", b"job", last)
