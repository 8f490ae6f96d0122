"""What writing one journal blob costs: the coordinator's masked sum and result of a
statistics job (:mod:`spherecal.coordinator.state.journal_blobs`), durable before
their rows, each on the job's critical path (the masked stage's close, the job's end).

Per payload size, interleaved over ``--repeats`` rounds on one disk: ``JournalBlobs.write``
as the coordinator calls it (SHA-256 on a second thread beside the write and sync, for
payloads of ``CONCURRENT_DIGEST_BYTES`` and up), and the same steps one after the other
(SHA-256, then the same write, fsync, rename and folder sync) — the serial form the
blob's digest used to take. The ratio says what the overlap saves on this machine;
both depend on the disk's ``fsync`` latency (say which). Sizes: the FFC statistics
at l = 1280, C = 100 (947,841 entries, as ``bench/ffc_stage.py``) and CCVR at
l = 512, C = 100 (13,184,100 entries), 8 bytes each.

Usage::

    python bench/journal_blobs.py [--repeats 9] [--dir PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as `python bench/journal_blobs.py`: `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import emit_json
from spherecal.coordinator.state.journal_blobs import (
    CONCURRENT_DIGEST_BYTES,
    JournalBlobs,
    write_synced,
)

PAYLOADS = {
    "ffc_l1280_c100": 1280 * 1281 // 2 + 1280 * 100 + 1,
    "ccvr_l512_c100": 100 * (512 * 513 // 2) + 100 * 512 + 100,
}
"""Entries of each statistics vector (8 bytes each in the 64-bit ring)."""


def _serial_write(folder: Path, name: str, data: memoryview) -> str:
    """SHA-256, then the same durable write (``write_synced``): one after the other."""
    digest = hashlib.sha256(data).hexdigest()
    write_synced(folder / name, data)
    return digest


def measure(folder: Path, entries: int, repeats: int) -> dict[str, Any]:
    data = np.random.default_rng(entries).integers(0, 2**63, entries, dtype=np.uint64)
    payload = data.data.cast("B")
    blobs = JournalBlobs(folder)
    times: dict[str, list[float]] = {"blob_write": [], "serial": []}
    for rep in range(repeats):
        order = ("blob_write", "serial") if rep % 2 == 0 else ("serial", "blob_write")
        for how in order:
            name = f"bench.{how}-{rep}.blob"
            start = time.perf_counter()
            if how == "blob_write":
                digest = blobs.write(name, payload)
            else:
                digest = _serial_write(folder, name, payload)
            times[how].append(time.perf_counter() - start)
            assert digest == hashlib.sha256(payload).hexdigest()
            (folder / name).unlink()
    medians = {how: statistics.median(v) for how, v in times.items()}
    return {
        "bytes": payload.nbytes,
        "digest_beside_write": payload.nbytes >= CONCURRENT_DIGEST_BYTES,
        **{
            f"{how}_ms": {
                "median": round(1000 * medians[how], 2),
                "min": round(1000 * min(v), 2),
                "max": round(1000 * max(v), 2),
            }
            for how, v in times.items()
        },
        "blob_write_over_serial": round(medians["blob_write"] / medians["serial"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=9, help="rounds, the order alternating")
    p.add_argument("--dir", type=Path, default=None, help="the blobs' disk (default tmp)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        results = {label: measure(folder, n, args.repeats) for label, n in PAYLOADS.items()}
    emit_json(
        {
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or None},
            "repeats": args.repeats,
            "payloads": results,
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
