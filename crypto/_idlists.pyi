"""Types of the native id-list helpers (crypto/_idlists.c; optional, see setup.py)."""

from collections.abc import Sequence

from _typeshed import ReadableBuffer

def read_texts(
    buffer: ReadableBuffer, pos: int, count: int, max_len: int, /
) -> tuple[tuple[str, ...], int] | None: ...
def context_texts(ids: Sequence[str], /) -> bytes: ...
def order_digests(prefix: ReadableBuffer, ids: Sequence[str], /) -> list[bytes]: ...
