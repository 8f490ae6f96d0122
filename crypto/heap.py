"""Keep freed heap memory in a participant process (glibc ``mallopt``), so that masking
does not fault in fresh pages for every chunk.

Why (issue #24): every masked chunk is a new ``bytes`` object as large as the chunk
(2 MiB at the service's 262,144 64-bit entries), and on its way out it is copied into a
protobuf message and a gRPC frame of the same size. With glibc's defaults the freed
blocks are given back to the system once more than a few MiB lie free at the top of
the heap (its dynamic trim threshold is twice the largest block freed so far), so the
next chunk's writes fault the same pages in again: about 3 µs a page on the development
machine, 500 faults per 2 MiB chunk, 3,400–3,900 per job in ``bench/secagg.py`` —
a third to a half of the masking's CPU time. Raising the trim and mmap thresholds keeps
freed blocks in the heap, so in steady state a chunk reuses the pages the previous one
left (measured: 0 faults per chunk, from 508, alternating eight 2 MiB blocks).

What it costs: the process may keep up to ``retain_mb`` MiB of freed memory at the top
of each malloc arena (glibc's trim threshold) instead of returning it, and blocks below
``min(retain_mb, 32)`` MiB come from the heap, not from their own mappings (glibc
serves larger ones from ``mmap`` and returns them on ``free`` whatever is set here).
Freed memory that stays in the process keeps its old contents until reused, as any
freed heap block below glibc's thresholds already does; secrets are not left there by
this package (encoded inputs are zeroed on :func:`spherecal.crypto.ring.give_back`,
masked chunks hold only masked words).

The participant process applies :func:`apply_from_env` at start and logs what it did;
``SPHERECAL_RETAIN_FREED_MB`` sets the amount (default :data:`DEFAULT_RETAIN_MB`, ``0``
leaves glibc's defaults). ``bench/secagg.py --retain-freed-mb`` measures with and without.
Elsewhere than glibc (musl, macOS) nothing is changed and the result says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_RETAIN_MB",
    "ENV",
    "MAX_MMAP_THRESHOLD_MB",
    "HeapSetting",
    "apply_from_env",
    "retain_freed_memory",
    "retain_mb_from_env",
]

ENV = "SPHERECAL_RETAIN_FREED_MB"
"""MiB of freed heap a participant process keeps (``0``: glibc's defaults)."""
DEFAULT_RETAIN_MB = 64
"""Room for a few chunks in flight (each chunk, its protobuf copy and its gRPC frame)
at the service's chunk, with the encoded input's buffers kept apart by ``ring``."""
MAX_MMAP_THRESHOLD_MB = 32
"""glibc refuses an mmap threshold above ``HEAP_MAX_SIZE / 2`` (32 MiB on 64-bit)."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@dataclass(frozen=True)
class HeapSetting:
    """What :func:`apply_from_env` did, for the process's start-up log."""

    retain_mb: int
    """MiB asked for (``0``: nothing changed)."""
    applied: bool
    """Whether glibc took the setting (False where the C library is not glibc)."""

    def describe(self) -> str:
        if self.retain_mb == 0:
            return f"freed heap memory is returned as glibc decides ({ENV}=0)"
        if not self.applied:
            return (
                f"{ENV}={self.retain_mb}: not applied (the C library is not glibc); "
                "masked chunks may fault in fresh pages"
            )
        return (
            f"keeping up to {self.retain_mb} MiB of freed heap memory for reuse (glibc trim "
            f"threshold {self.retain_mb} MiB, mmap threshold "
            f"{min(self.retain_mb, MAX_MMAP_THRESHOLD_MB)} MiB), so masked chunks do not "
            f"fault in fresh pages; {ENV}=0 turns this off"
        )


def retain_freed_memory(retain_mb: int) -> bool:
    """Make glibc keep up to ``retain_mb`` MiB of freed memory per arena and serve blocks
    below ``min(retain_mb, 32)`` MiB from the heap (``mallopt(M_TRIM_THRESHOLD)``,
    ``mallopt(M_MMAP_THRESHOLD)``; setting either ends glibc's dynamic thresholds).
    Process-wide, for every thread. False where the C library is not glibc."""
    if retain_mb <= 0:
        raise ValueError(f"retain_mb must be positive, got {retain_mb}")
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    mmap_mb = min(retain_mb, MAX_MMAP_THRESHOLD_MB)
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_mb << 20)) and bool(
        mallopt(_M_TRIM_THRESHOLD, min(retain_mb, 2047) << 20)
    )


def retain_mb_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``SPHERECAL_RETAIN_FREED_MB`` as a whole number of MiB (default
    :data:`DEFAULT_RETAIN_MB`); :class:`ValueError` naming the variable otherwise."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return DEFAULT_RETAIN_MB
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 2047:
        raise ValueError(f"{ENV} must be a whole number of MiB in 0..2047, got {raw!r}")
    return value


def apply_from_env(environ: Mapping[str, str] | None = None) -> HeapSetting:
    """Apply ``SPHERECAL_RETAIN_FREED_MB`` (or the default) to this process."""
    retain_mb = retain_mb_from_env(environ)
    applied = retain_mb > 0 and retain_freed_memory(retain_mb)
    return HeapSetting(retain_mb=retain_mb, applied=applied)
