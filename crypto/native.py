"""The optional native masking kernel: loaded once, or ``None`` where it is absent.

``spherecal.crypto._maskkernel`` (``crypto/_maskkernel.c``, built by ``setup.py`` when
the project is installed; it links the system libcrypto) does in C what
:mod:`spherecal.crypto.prg` and :mod:`spherecal.crypto.ring` do in numpy, with the same
bytes: the masking kernel (OpenSSL's AES-128-CTR added into ring words while the
keystream is in L1) and the fixed-point encoding (range check, exact magic-number
rounding). Why (issue #24): in numpy each mask is an OpenSSL call writing a tile and a
numpy add reading it back, which caps masking near 0.79 of the bare keystream; the
encoding is six numpy passes per tile.

Both callers look :data:`KERNEL` up at call time, so it is the one switch: ``None`` when
the extension was not built (no compiler, Python or OpenSSL headers at install), fails
to load (no libcrypto 3), or ``SPHERECAL_NATIVE_MASKING=0`` is set in the environment;
tests set it to ``None`` to run the numpy path.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["ENV", "KERNEL", "available"]

ENV = "SPHERECAL_NATIVE_MASKING"
"""Set to ``0`` to run the numpy paths even where the native kernel is built."""


def _load() -> ModuleType | None:
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        from spherecal.crypto import _maskkernel
    except ImportError:  # not built here, or its libcrypto is missing
        return None
    return _maskkernel


KERNEL: ModuleType | None = _load()


def available() -> bool:
    """Whether the native kernel is loaded (and not switched off)."""
    return KERNEL is not None
