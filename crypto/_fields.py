"""Framing and structural checks shared by every message type of :mod:`spherecal.crypto.messages`.

Each helper raises :class:`MalformedMessage`, so a message object that violates its
structure cannot even be constructed (see :mod:`spherecal.crypto.messages`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from spherecal.crypto import native
from spherecal.crypto._codec import MAX_ID_BYTES, Reader, Writer
from spherecal.crypto._exceptions import MalformedMessage
from spherecal.crypto.spec import MAGIC, MAX_JOB_ID_BYTES, RETIRED_VERSIONS, VERSION

__all__ = ["fixed", "header", "job", "need", "open_message", "pid", "sorted_unique"]


def header(type_code: int) -> Writer:
    return Writer().raw(MAGIC).u8(VERSION).u8(type_code)


def open_message(data: bytes | bytearray | memoryview, type_code: int, name: str) -> Reader:
    r = Reader(data)
    if r.raw(4) != MAGIC:
        raise MalformedMessage(f"{name}: bad magic (not a spherecal secagg message)")
    version = r.u8()
    if version in RETIRED_VERSIONS:
        raise MalformedMessage(
            f"{name}: secagg protocol version {version} ({RETIRED_VERSIONS[version]}) is no "
            f"longer supported; this party speaks version {VERSION}"
        )
    if version != VERSION:
        raise MalformedMessage(f"{name}: unsupported protocol version {version}")
    if r.u8() != type_code:
        raise MalformedMessage(f"{name}: bytes encode a different message type")
    return r


def need(condition: bool, what: str) -> None:
    if not condition:
        raise MalformedMessage(what)


def fixed(value: bytes, size: int, what: str) -> None:
    need(isinstance(value, bytes) and len(value) == size, f"{what} must be {size} bytes")


def job(job_id: bytes) -> None:
    need(
        isinstance(job_id, bytes) and 1 <= len(job_id) <= MAX_JOB_ID_BYTES,
        f"job_id must be 1..{MAX_JOB_ID_BYTES} bytes",
    )


def pid(value: str, what: str) -> None:
    need(
        isinstance(value, str) and 0 < len(value.encode("utf-8")) <= MAX_ID_BYTES,
        f"{what} is not a valid id",
    )


_CHECKED: dict[int, tuple[str, ...]] = {}
"""The last few id lists :func:`sorted_unique` accepted, by identity (held, so an id is
never reused while listed): the coordinator builds every roster, bundle and unmask
request of a job from the same member and survivor tuples, n messages each."""
_CHECKED_KEEP = 8


def sorted_unique(items: Sequence[str], what: str) -> None:
    """:func:`pid` on every item, then sorted and unique. Member and survivor lists are
    O(n) ids, in four messages a site reads per job, so a list of ASCII ids (the
    usual kind) is checked in one pass by the native helper
    (:data:`spherecal.crypto.native.CODEC`) where it is loaded, else in a few C-level
    passes (issue #24); a list refused there is checked item by item, for the precise
    error. A tuple object accepted a moment ago (:data:`_CHECKED`) is not checked
    again: tuples of ``str`` cannot change."""
    if _CHECKED.get(id(items)) is items:
        return
    helper = native.CODEC
    if helper is not None and helper.sorted_ids(items, MAX_ID_BYTES, False):
        _remember(items)
        return
    need(isinstance(items, tuple), f"{what} must be a tuple")
    if items and set(map(type, items)) == {str} and "".join(items).isascii():
        # ASCII: characters are bytes, so len() is the encoded length pid() bounds
        need(
            min(map(len, items)) > 0 and max(map(len, items)) <= MAX_ID_BYTES,
            f"{what} is not a valid id",
        )
    else:
        for item in items:
            pid(item, what)
    need(all(map(operator.lt, items, items[1:])), f"{what} must be sorted and unique")
    _remember(items)


def _remember(items: Sequence[str]) -> None:
    if len(items) > 64:  # short lists cost less to check than to remember
        if len(_CHECKED) >= _CHECKED_KEEP:
            _CHECKED.clear()
        _CHECKED[id(items)] = items  # type: ignore[assignment]
