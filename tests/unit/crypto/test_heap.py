"""A participant process keeps freed heap memory (``spherecal.crypto.heap``, issue #24):
chunk-sized blocks freed and allocated again stop faulting in fresh pages, the amount is
configurable and off with ``0``, and the process says what it did at start.

The fault counts run in fresh interpreters: ``mallopt`` is process-wide and cannot be
undone, and a test process's heap history would blur the count."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from spherecal.crypto import heap

glibc_only = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the setting is glibc's mallopt"
)

# Eight blocks of a 64-bit service chunk's wire size (2 MiB + framing) live at once,
# then freed, round after round: what a participant's chunks, their protobuf copies and
# gRPC frames do. Prints the minor faults per block once the heap is warm.
_PATTERN = """
import json, resource, sys
from spherecal.crypto import heap
setting = heap.apply_from_env()
size = (2 << 20) + 100
def round_():
    blocks = [b"\\x01" * size for _ in range(8)]
    del blocks
for _ in range(3):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    round_()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": setting.applied, "per_block": faults / 80}))
"""


def _run(code: str, retain: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop(heap.ENV, None)
    if retain is not None:
        env[heap.ENV] = retain
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@glibc_only
def test_kept_freed_memory_stops_the_per_chunk_faults() -> None:
    """With the default setting a warm round faults (almost) nothing; with glibc's
    defaults (``0``, the mutation check) every block faults its pages in again."""
    kept = json.loads(_run(_PATTERN, None))
    assert kept["applied"] is True
    assert kept["per_block"] < 5  # 513 pages per block
    returned = json.loads(_run(_PATTERN, "0"))
    assert returned["applied"] is False
    assert returned["per_block"] > 100


def test_the_amount_comes_from_the_environment_and_is_checked() -> None:
    assert heap.retain_mb_from_env({}) == heap.DEFAULT_RETAIN_MB
    assert heap.retain_mb_from_env({heap.ENV: " 16 "}) == 16
    assert heap.retain_mb_from_env({heap.ENV: "0"}) == 0
    for bad in ("-1", "2048", "lots", "1.5"):
        with pytest.raises(ValueError, match=heap.ENV):
            heap.retain_mb_from_env({heap.ENV: bad})
    off = heap.apply_from_env({heap.ENV: "0"})
    assert off == heap.HeapSetting(retain_mb=0, applied=False)
    assert "=0" in off.describe()
    with pytest.raises(ValueError, match="positive"):
        heap.retain_freed_memory(0)
    text = heap.HeapSetting(retain_mb=64, applied=True).describe()
    assert "64 MiB" in text and "mmap threshold 32 MiB" in text
    assert "not applied" in heap.HeapSetting(retain_mb=8, applied=False).describe()


@glibc_only
def test_the_participant_process_says_what_it_kept_at_start() -> None:
    code = "from spherecal.participant.main import _keep_freed_heap\n_keep_freed_heap(print)\n"
    assert "keeping up to 24 MiB of freed heap memory" in _run(code, "24")
    assert "returned as glibc decides" in _run(code, "0")
