"""The masking kernel alone against the bare keystream (``bench/secagg.py --kernel``).

Why a block of its own: inside a whole simulated job the masking shares the process with
the server's absorption and other participants' allocations, so its ratio to the
keystream also measures the heap's history; here one vector is masked chunk by chunk
between passes of the bare keystream, interleaved, best of ``passes`` (contention only
adds time). The keys it reports are described in ``bench/secagg.py``'s docstring
(``kernel``).
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import numpy as np

from spherecal.crypto import native
from spherecal.crypto.prg import raw_keystream_seconds
from spherecal.crypto.spec import DEFAULT_CHUNK_ENTRIES

__all__ = ["kernel"]


def kernel(
    dim: int, *, ring_bits: int, masks: int = 11, passes: int = 7, chunk: int | None = None
) -> dict[str, Any]:
    """Interleaved best-of-``passes``: masking one vector vs the bare keystream.

    Per pass, in turn: the bare keystream (the same bytes, faster engine, nothing else);
    the masks applied mask-major by the numpy path (each mask over the whole chunk, then
    the next: the order before issue #24's tile-major change); the masks applied by the
    numpy path, tile-major (:meth:`MaskExpander.apply_plan` with ``native=False``); the
    same with the native kernel where it is loaded; and the float vector → upload bytes
    as ``SecAggParticipant`` does it (encoding into a fresh array, then every chunk masked
    straight into its framed ``MaskedChunk`` encoding), by the numpy path and by the
    default one. Each is timed by wall clock and by this thread's CPU time: on a shared
    machine the wall clock also counts the time this process waits for a core, the CPU
    time does not (cache and memory-bandwidth contention still count in both).
    """
    from spherecal.crypto.messages import MaskedChunk
    from spherecal.crypto.prg import MaskExpander, MaskSeed, kernel_keystream_seconds
    from spherecal.crypto.ring import encode, ring_dtype

    dtype = ring_dtype(ring_bits)
    chunk = DEFAULT_CHUNK_ENTRIES if chunk is None else chunk
    x = np.random.default_rng(0).uniform(-1.0, 1.0, dim)
    seeds = [MaskSeed(key=bytes([i]) * 16, nonce=bytes([i]) * 12) for i in range(masks)]
    plan = [(seed, 1 if i % 2 else -1) for i, seed in enumerate(seeds)]
    total_bytes = masks * dim * dtype.itemsize
    names = (
        "keystream",
        "keystream_own",
        "mask_major",
        "mask_numpy",
        "mask_evp",
        "mask",
        "input_numpy",
        "input_evp",
        "input",
    )
    best = {(key, clock): math.inf for key in names for clock in ("wall", "cpu")}
    kernel_module = native.KERNEL

    def record(key: str, wall: float, cpu: float) -> None:
        best[key, "wall"] = min(best[key, "wall"], wall)
        best[key, "cpu"] = min(best[key, "cpu"], cpu)

    def framed(expander: MaskExpander, source: Any, index: int, start: int) -> bytes:
        return MaskedChunk.framed(
            b"job-0", "site-0", index, source.nbytes,
            lambda prefix: expander.masked_bytes(prefix, plan, start, source),
        ).to_bytes()  # fmt: skip

    own = native.engine()  # the kernel's engine (its own AES where the CPU has AES-NI)
    for _ in range(passes):
        t0, c0 = time.perf_counter(), time.thread_time()
        raw_keystream_seconds(total_bytes)
        record("keystream", time.perf_counter() - t0, time.thread_time() - c0)
        if kernel_module is not None:
            t0, c0 = time.perf_counter(), time.thread_time()
            kernel_keystream_seconds(total_bytes)
            record("keystream_own", time.perf_counter() - t0, time.thread_time() - c0)
        for key in names[2:]:
            numpy_path = key in ("mask_major", "mask_numpy", "input_numpy")
            native.KERNEL = None if numpy_path else kernel_module
            evp = key.endswith("_evp") and kernel_module is not None
            with native.use_engine("openssl") if evp else contextlib.nullcontext():
                encoded = encode(x, scale_bits=20, bound=1.0, ring_bits=ring_bits)
                expander = MaskExpander(
                    min(chunk, dim),
                    dtype,
                    engine="ctr" if evp else None,  # the kernel's first version: OpenSSL's CTR
                    native=not numpy_path and None,
                )
                work = np.empty(min(chunk, dim), dtype=dtype)
                t0, c0 = time.perf_counter(), time.thread_time()
                if key.startswith("input"):
                    encoded = encode(x, scale_bits=20, bound=1.0, ring_bits=ring_bits)
                for index, start in enumerate(range(0, dim, chunk)):
                    out = work[: min(chunk, dim - start)]
                    source = encoded[start : start + chunk]
                    if key == "mask_major":
                        for i, (seed, sign) in enumerate(plan):
                            expander.apply(out, seed, start, sign, source=None if i else source)
                    elif key.startswith("mask"):
                        expander.apply_plan(out, plan, start, source=source)
                    else:
                        framed(expander, source, index, start)
                record(key, time.perf_counter() - t0, time.thread_time() - c0)
            native.KERNEL = kernel_module
    result: dict[str, Any] = {
        "ring_bits": ring_bits,
        "masks": masks,
        "chunk_entries": chunk,
        "passes": passes,
        "native_kernel": kernel_module is not None,
        "kernel_engine": own,
    }
    for clock in ("wall", "cpu"):
        ks = best["keystream", clock]
        suffix = "" if clock == "wall" else "_cpu"
        result |= {
            f"keystream_gbps{suffix}": round(total_bytes / ks / 1e9, 3),
            f"mask_gbps{suffix}": round(total_bytes / best["mask", clock] / 1e9, 3),
            f"mask_over_keystream{suffix}": round(ks / best["mask", clock], 4),
            f"mask_numpy_over_keystream{suffix}": round(ks / best["mask_numpy", clock], 4),
            f"mask_major_over_keystream{suffix}": round(ks / best["mask_major", clock], 4),
            f"input_over_keystream{suffix}": round(best["input", clock] / ks, 4),
            f"input_numpy_over_keystream{suffix}": round(best["input_numpy", clock] / ks, 4),
        }
        if kernel_module is None:
            continue
        own_ks = best["keystream_own", clock]
        result |= {
            f"mask_evp_over_keystream{suffix}": round(ks / best["mask_evp", clock], 4),
            f"input_evp_over_keystream{suffix}": round(best["input_evp", clock] / ks, 4),
            f"own_keystream_gbps{suffix}": round(total_bytes / own_ks / 1e9, 3),
            f"mask_over_own_keystream{suffix}": round(own_ks / best["mask", clock], 4),
            f"input_over_own_keystream{suffix}": round(best["input", clock] / own_ks, 4),
        }
    return result
