"""Types of the native masking kernel (crypto/_maskkernel.c, crypto/_aesctr.c; optional,
see setup.py)."""

from _typeshed import ReadableBuffer, WriteableBuffer

KS_BYTES: int

def apply(
    target: WriteableBuffer,
    source: ReadableBuffer | None,
    keys: bytes,
    counters: bytes,
    signs: bytes,
    word_bytes: int,
    /,
) -> None: ...
def apply_new(
    prefix: bytes,
    source: ReadableBuffer,
    keys: bytes,
    counters: bytes,
    signs: bytes,
    word_bytes: int,
    /,
) -> bytes: ...
def encode(
    out: WriteableBuffer,
    values: ReadableBuffer,
    scale: float,
    bound: float,
    scratch: bool = False,
    /,
) -> bool: ...
def engines() -> tuple[str, ...]: ...
def engine() -> str: ...
def set_engine(name: str, /) -> str: ...
def keystream(out: WriteableBuffer, key: bytes, counter: bytes, /) -> None: ...
