"""One measured secure-aggregation job, the keystream yardsticks, and one ring's block
of jobs (``bench/secagg.py``'s main block).

Why a module of its own: ``bench/secagg.py`` runs the same measurement in both rings
(the 64-bit statistics ring and the 32-bit update ring) with the same method — a small
warm-up job, the ring's first full-size (cold) job reported on its own, then the median
of ``--repeats`` jobs — and this is that method. The keys are described in
``bench/secagg.py``'s docstring.
"""

from __future__ import annotations

import math
import random
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from spherecal.crypto import native
from spherecal.crypto.policy import SecAggPolicy
from spherecal.crypto.prg import (
    kernel_keystream_seconds,
    keystream_rate_gbps,
    raw_keystream_seconds,
)
from spherecal.crypto.simulation import run_protocol
from spherecal.crypto.spec import JobSpec

__all__ = [
    "RAW_PASS_BYTES",
    "RING_KEYS",
    "engine_rates",
    "medians",
    "one_job",
    "own_rate_cpu_gbps",
    "raw_rate_cpu_gbps",
    "ring_block",
    "ring_summary",
    "warm_and_cold",
]

RAW_PASS_BYTES = 64 << 20
RING_KEYS = (
    "mask_gen_over_keystream",
    "input_over_keystream",
    "mask_gen_over_keystream_cpu",
    "input_over_keystream_cpu",
    "mask_gen_over_own_keystream_cpu",
    "input_over_own_keystream_cpu",
    "participant_mask_s",
    "protocol_s",
    "input_minor_faults",
    "minor_page_faults",
    "prepare_input_cpu_ms",
    "prepare_input_ms",
    "prepare_minor_faults",
)
"""The figures ``rings`` repeats per ring (and per ring's first job)."""


def engine_rates() -> dict[str, float]:
    """Best-of-3 keystream rates of both engines in GB/s (1e9 bytes), interleaved."""
    best: dict[str, float] = {}
    for _ in range(3):
        for engine in ("ctr", "gcm"):
            rate = keystream_rate_gbps(engine, total_bytes=RAW_PASS_BYTES, passes=1)
            best[engine] = max(best.get(engine, 0.0), rate)
    return best


def _cpu_rate_gbps(produce: Callable[[int], float], passes: int) -> float:
    """Best-of-``passes`` rate of ``produce(RAW_PASS_BYTES)`` by this thread's CPU time."""
    best = math.inf
    for _ in range(passes):
        c0 = time.thread_time()
        produce(RAW_PASS_BYTES)
        best = min(best, time.thread_time() - c0)
    return RAW_PASS_BYTES / best / 1e9


def raw_rate_cpu_gbps(passes: int = 3) -> float:
    """Best-of-``passes`` rate of the faster keystream engine by this thread's CPU time."""
    return _cpu_rate_gbps(raw_keystream_seconds, passes)


def own_rate_cpu_gbps(passes: int = 3) -> float | None:
    """Best-of-``passes`` rate of the native kernel's bare keystream (its current engine)
    by this thread's CPU time; ``None`` without the kernel."""
    if native.KERNEL is None:
        return None
    return _cpu_rate_gbps(kernel_keystream_seconds, passes)


def one_job(
    spec: JobSpec,
    inputs: dict[str, np.ndarray],
    dropped: list[str],
    *,
    seed: int,
    max_in_flight: int,
    policy: SecAggPolicy | None = None,
    raw_gbps: float | None = None,
    prepare_input: bool = True,
) -> dict[str, Any]:
    """One whole job in this process, and its figures. The keystream yardsticks are
    measured right before it unless ``raw_gbps`` is given (then the ratios are not
    meaningful: runs whose only figure is ``protocol_s``).

    ``prepare_input`` (the default, as the service does it): every participant calls
    ``prepare_input`` right after its share answer, and that call is timed apart
    (``prepare_input_ms``/``_cpu_ms``: the mean over the participants that made it,
    dropouts included; ``prepare_minor_faults``: their sum) — its page faults are moved
    out of float → upload to a moment the participant waits, not hidden."""
    rates = engine_rates() if raw_gbps is None else {}
    raw_cpu = raw_rate_cpu_gbps() if raw_gbps is None else 1.0
    own_cpu = own_rate_cpu_gbps() if raw_gbps is None else None
    raw_gbps = max(rates.values()) if raw_gbps is None else raw_gbps
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    report = run_protocol(
        spec,
        inputs,
        drop=dict.fromkeys(dropped, "masked"),
        rng=random.Random(seed),
        max_in_flight=max_in_flight,
        policy=policy,
        prepare_input=prepare_input,
    )
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    result = report.result
    graph_ = spec.masking_graph
    u2 = set(result.contributors) | set(result.dropouts)
    u3 = set(result.contributors)
    vector_bytes = spec.entry_bytes * spec.length

    masks_per_uploader = {p: len(graph_.neighbours(p) & u2) + 1 for p in report.mask_seconds}
    mask_gbps = [
        masks_per_uploader[p] * vector_bytes / s / 1e9 for p, s in report.mask_seconds.items()
    ]
    server_masks = len(u3) + sum(len(graph_.neighbours(v) & u3) for v in result.dropouts)
    unavoidable_bytes = (sum(masks_per_uploader.values()) + server_masks) * vector_bytes
    unavoidable_s = raw_keystream_seconds(unavoidable_bytes, 1 << 20)

    expected = np.sum([inputs[p] for p in sorted(u3)], axis=0)
    upload = max(report.upload_bytes[p] for p in report.mask_seconds)
    input_ratio = [
        report.input_seconds[p] / (masks_per_uploader[p] * vector_bytes / (raw_gbps * 1e9))
        for p in report.input_seconds
    ]
    # The same two ratios by CPU time (the keystream's too): on a shared machine the wall
    # clock also counts the time spent waiting for a core.
    mask_cpu_gbps = [
        masks_per_uploader[p] * vector_bytes / s / 1e9 for p, s in report.mask_cpu_seconds.items()
    ]
    input_cpu_ratio = [
        report.input_cpu_seconds[p] / (masks_per_uploader[p] * vector_bytes / (raw_cpu * 1e9))
        for p in report.input_cpu_seconds
    ]
    own = {}
    if own_cpu is not None:  # the same two ratios against the kernel's own bare keystream
        own = {
            "own_keystream_cpu_gbps": own_cpu,
            "mask_gen_over_own_keystream_cpu": float(np.mean(mask_cpu_gbps)) / own_cpu,
            "input_over_own_keystream_cpu": float(np.mean(input_cpu_ratio)) * own_cpu / raw_cpu,
        }
    prepared = {}
    if report.prepare_seconds:
        prepared = {
            "prepare_input_ms": 1e3 * float(np.mean(list(report.prepare_seconds.values()))),
            "prepare_input_cpu_ms": 1e3
            * float(np.mean(list(report.prepare_cpu_seconds.values()))),
            "prepare_minor_faults": int(sum(report.prepare_minor_faults.values())),
        }
    return {
        **own,
        **prepared,
        **({"aes_ctr_gbps": rates["ctr"], "aes_gcm_gbps": rates["gcm"]} if rates else {}),
        "raw_aes_ctr_gbps": raw_gbps,
        "mask_gen_over_keystream": float(np.mean(mask_gbps)) / raw_gbps,
        "raw_keystream_cpu_gbps": raw_cpu,
        "mask_gen_over_keystream_cpu": float(np.mean(mask_cpu_gbps)) / raw_cpu,
        "input_over_keystream_cpu": float(np.mean(input_cpu_ratio)),
        "input_s": float(np.mean(list(report.input_seconds.values()))),
        "input_over_keystream": float(np.mean(input_ratio)),
        "participant_s": float(np.mean(list(report.participant_seconds.values()))),
        "mask_gen_gbps": float(np.mean(mask_gbps)),
        "participant_mask_s": float(np.mean(list(report.mask_seconds.values()))),
        "server_unmask_s": report.server_unmask_seconds,
        "protocol_s": report.protocol_seconds,
        "unavoidable_aes_s": unavoidable_s,
        "protocol_over_aes_ratio": report.protocol_seconds / unavoidable_s,
        "upload_bytes_per_participant": upload,
        "mask_gen_over_raw": float(np.mean(mask_gbps)) / raw_gbps,
        "participant_mask_s_max": max(report.mask_seconds.values()),
        "unavoidable_aes_bytes": unavoidable_bytes,
        "max_abs_error": float(np.max(np.abs(result.values - expected))),
        "error_bound": len(u3) * math.ldexp(1.0, -spec.scale_bits),
        "survivors": len(u3),
        "minor_page_faults": faults,
        "input_minor_faults": int(np.mean(list(report.input_minor_faults.values()))),
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median over ``runs`` (ints stay ints, floats to 4 places)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        median = float(np.median(values))
        out[key] = int(median) if isinstance(values[0], int) else round(median, 4)
    return out


def ring_summary(job: dict[str, Any], dim: int) -> dict[str, Any]:
    """The :data:`RING_KEYS` of one job (or of the medians of several), and its bytes per
    entry."""
    summary = {key: job[key] for key in RING_KEYS if key in job}
    summary["upload_bytes_per_entry"] = round(job["upload_bytes_per_participant"] / dim, 5)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()}


def warm_and_cold(
    make_spec: Callable[[int], JobSpec],
    inputs: dict[str, np.ndarray],
    dropped: list[str],
    *,
    dim: int,
    warm_dim: int,
    seed: int,
    max_in_flight: int,
    prepare_input: bool = True,
) -> dict[str, Any]:
    """A ring's start: a small warm-up job (``warm_dim`` entries: first-call costs), then
    its first full-size job, returned — cold: it meets whatever this process's heap and
    spare buffers hold from other rings and sizes. ``make_spec(length)`` makes a fresh
    job of the ring."""
    one_job(
        make_spec(warm_dim),
        {p: v[:warm_dim] for p, v in inputs.items()},
        dropped,
        seed=seed,
        max_in_flight=max_in_flight,
        prepare_input=prepare_input,
    )
    return one_job(
        make_spec(dim),
        inputs,
        dropped,
        seed=seed,
        max_in_flight=max_in_flight,
        prepare_input=prepare_input,
    )


def ring_block(
    make_spec: Callable[[int], JobSpec],
    inputs: dict[str, np.ndarray],
    dropped: list[str],
    *,
    dim: int,
    warm_dim: int,
    seed: int,
    max_in_flight: int,
    repeats: int,
    prepare_input: bool = True,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One ring's measurement: :func:`warm_and_cold`, then ``repeats`` jobs. Returns the
    cold job and the measured ones."""
    cold = warm_and_cold(
        make_spec,
        inputs,
        dropped,
        dim=dim,
        warm_dim=warm_dim,
        seed=seed,
        max_in_flight=max_in_flight,
        prepare_input=prepare_input,
    )
    runs = [
        one_job(
            make_spec(dim),
            inputs,
            dropped,
            seed=seed + r,
            max_in_flight=max_in_flight,
            prepare_input=prepare_input,
        )
        for r in range(repeats)
    ]
    return cold, runs
