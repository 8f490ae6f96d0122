"""The optional native masking kernel: loaded once, or ``None`` where it is absent.

``spherecal.crypto._maskkernel`` (``crypto/_maskkernel.c`` with ``crypto/_aesctr.c``,
built by ``setup.py`` when the project is installed; it links the system libcrypto) does
in C what :mod:`spherecal.crypto.prg` and :mod:`spherecal.crypto.ring` do in numpy, with
the same bytes: the masking kernel (AES-128-CTR keystream added into ring words) and the
fixed-point encoding (range check, exact magic-number rounding). Why (issue #24): in numpy
each mask is an OpenSSL call writing a tile and a numpy add reading it back, which caps
masking near 0.79 of the bare keystream; the encoding is six numpy passes per tile.

The kernel has four AES-128-CTR *engines*, all giving OpenSSL's AES-CTR bytes:

* ``vaes512``: its own CTR on 512-bit VAES registers (four blocks per instruction,
  AVX-512 adds), the keystream added into the target straight from the AES state; where
  the CPU has VAES, AVX-512F and AVX-512BW. On a processor that executes 512-bit VAES at
  full width (the 2-core development machine of 2026-11-26 does) it makes twice the
  keystream of ``vaes`` and about twice OpenSSL's AES-GCM, the fastest AES path of
  OpenSSL (``docs/performance.md``);
* ``vaes``: the same on 256-bit VAES registers (AVX2 adds); where the CPU has VAES and
  AVX2;
* ``aesni``: the same on 128-bit AES-NI registers; where the CPU has AES-NI;
* ``openssl``: OpenSSL's EVP AES-128-CTR writing into an L1 buffer and an AVX2 add loop
  (the kernel's first version); everywhere, and for any call whose counter would carry
  out of its low 32-bit word (never in the v2 keystream).

The widest the CPU runs is chosen when the kernel loads. ``SPHERECAL_NATIVE_ENGINE``
(``vaes512``, ``vaes``, ``aesni``, ``openssl`` or ``auto``) forces one for a process (a
name this CPU lacks is refused: :class:`ValueError` at import); :func:`use_engine` does it
for a block (tests, ``bench/secagg.py``).

Both callers look :data:`KERNEL` up at call time, so it is the one switch: ``None`` when
the extension was not built (no compiler, Python or OpenSSL headers at install), fails
to load (no libcrypto 3), or ``SPHERECAL_NATIVE_MASKING=0`` is set in the environment;
tests set it to ``None`` to run the numpy path.

The second extension, ``spherecal.crypto._fastcodec`` (``crypto/_fastcodec.c``), runs
the canonical encoding's hot paths: the O(n) steps every party of a SecAgg+ job runs on
the roster — decoding and checking participant-id lists
(:meth:`spherecal.crypto._codec.Reader.texts`, :func:`spherecal.crypto._fields.sorted_unique`,
:meth:`spherecal.crypto.spec.JobSpec.validate`), hashing the Harary cycle's order keys
(:mod:`spherecal.crypto.graph`), encoding the survivor set a consistency signature covers —
and the context encoding of every KDF, commitment and signature
(:func:`spherecal.crypto._codec.encode_context`), with the same results as the Python code
that defines them. :data:`CODEC` is it, or ``None`` where it is absent or
``SPHERECAL_NATIVE_CODEC=0`` is set; its callers look it up at call time too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = [
    "CODEC",
    "CODEC_ENV",
    "ENGINE_ENV",
    "ENV",
    "KERNEL",
    "available",
    "describe",
    "engine",
    "engines",
    "own_engine",
    "startup_message",
    "use_engine",
]

ENV = "SPHERECAL_NATIVE_MASKING"
"""Set to ``0`` to run the numpy paths even where the native kernel is built."""
ENGINE_ENV = "SPHERECAL_NATIVE_ENGINE"
"""Set to ``vaes512``, ``vaes``, ``aesni``, ``openssl`` or ``auto`` to choose the kernel's
AES engine."""
CODEC_ENV = "SPHERECAL_NATIVE_CODEC"
"""Set to ``0`` to run the canonical encoding's Python code only (no ``_fastcodec``)."""


def _load() -> ModuleType | None:
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        from spherecal.crypto import _maskkernel
    except ImportError:  # not built here, or its libcrypto is missing
        return None
    wanted = os.environ.get(ENGINE_ENV)
    if wanted:
        try:
            _maskkernel.set_engine(wanted)
        except ValueError as exc:
            raise ValueError(
                f"{ENGINE_ENV}={wanted!r}: this CPU runs {_maskkernel.engines()}"
            ) from exc
    return _maskkernel


KERNEL: ModuleType | None = _load()


def _load_fastcodec() -> ModuleType | None:
    if os.environ.get(CODEC_ENV, "1") == "0":
        return None
    try:
        from spherecal.crypto import _fastcodec
    except ImportError:  # not built here, or its libcrypto is missing
        return None
    return _fastcodec


CODEC: ModuleType | None = _load_fastcodec()


def available() -> bool:
    """Whether the native kernel is loaded (and not switched off)."""
    return KERNEL is not None


def engines() -> tuple[str, ...]:
    """The kernel's AES engines this CPU runs, widest first (none without the kernel)."""
    return () if KERNEL is None else tuple(KERNEL.engines())


def engine() -> str | None:
    """The engine the kernel uses now, or ``None`` without the kernel."""
    return None if KERNEL is None else str(KERNEL.engine())


def own_engine() -> bool:
    """Whether the kernel runs its own AES (``vaes512``, ``vaes``, ``aesni``), not
    OpenSSL's EVP path (derived from the engine name, so a new engine needs no edit here)."""
    return engine() not in (None, "openssl")


_BUILD_HINT = (
    "built at install where a C compiler and the OpenSSL 3 and Python headers are present; "
    "in a checkout: python setup.py build_ext --inplace"
)


def _not_built() -> bool:
    """Whether an extension is absent without its variable having switched it off."""
    return any(
        module is None and os.environ.get(env, "1") != "0"
        for module, env in ((KERNEL, ENV), (CODEC, CODEC_ENV))
    )


def describe() -> str:
    """One line for a service process's start-up log: which native code runs here.

    Why: a site installed without a compiler runs the numpy and Python paths — the same
    bytes, but its masking and a large SecAgg+ job's roster work slower (issue #24) —
    and nothing else would tell its operator."""
    if KERNEL is not None:
        masking = f"masking kernel on {engine()}"
    elif os.environ.get(ENV, "1") == "0":
        masking = f"masking kernel off ({ENV}=0; numpy path)"
    else:
        masking = "masking kernel not built (numpy path: same bytes, slower)"
    if CODEC is not None:
        codec = "encoding hot paths in C"
    elif os.environ.get(CODEC_ENV, "1") == "0":
        codec = f"encoding hot paths off ({CODEC_ENV}=0; Python)"
    else:
        codec = "encoding hot paths not built (Python: same bytes, slower)"
    hint = f"; {_BUILD_HINT}" if _not_built() else ""
    return f"native code: {masking}; {codec}{hint}"


def startup_message() -> str:
    """:func:`describe` marked for the service processes' log writer
    (:mod:`spherecal.logs`): a ``WARNING:`` where an extension was not built (the slow
    path, not chosen), plain (INFO) where one was switched off on purpose, ``DEBUG:``
    where both run — a healthy start stays quiet."""
    line = describe()
    if KERNEL is not None and CODEC is not None:
        return f"DEBUG: {line}"
    return f"WARNING: {line}" if _not_built() else line


@contextmanager
def use_engine(name: str) -> Iterator[None]:
    """Run the block on engine ``name`` (:class:`ValueError` where this CPU lacks it or
    the kernel is absent), then restore the previous one."""
    if KERNEL is None:
        raise ValueError("the native masking kernel is not loaded here")
    previous = KERNEL.set_engine(name)
    try:
        yield
    finally:
        KERNEL.set_engine(previous)
