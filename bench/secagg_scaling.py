"""SecAgg+ per-participant cost as n grows (``bench/secagg.py --scaling``).

Why a block of its own: issue #24 asks how a participant's work grows from n = 10 to
1000 on the Harary graph (degree ``2⌈log₂ n⌉``); each n runs whole jobs in-process, one
warm-up job first, then rounds of one job per n interleaved so that load on a shared
machine hits every n alike. The keys it reports are described in ``bench/secagg.py``'s
docstring (``scaling``).
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np

from spherecal.crypto.simulation import run_protocol
from spherecal.crypto.spec import JobSpec, default_degree

__all__ = ["scaling"]


def _scaling_job(
    n: int,
    *,
    dim: int,
    drop_fraction: float,
    seed: int,
    ring_bits: int,
    degree: int | None = None,
) -> tuple[JobSpec, int, int, Any, float]:
    """One SecAgg+ job of ``n`` participants: (spec, threshold, dropouts, report, load).

    ``degree``: the Harary degree for this n (default :func:`default_degree`); when
    given, the dropouts are spaced evenly along the Harary cycle (every
    ``1/drop_fraction``-th participant) rather than drawn, so that no owner loses more
    of its share holders than the drawn tenth would on average."""
    ids = [f"p{i:04d}" for i in range(n)]
    rng = np.random.default_rng(seed)
    inputs = {p: rng.uniform(-1.0, 1.0, dim) for p in ids}
    k = default_degree(n, 2) if degree is None else min(degree, n - 1)
    t = max(2, (k + 1) // 2 + 1)  # strict majority of the k + 1 share holders
    spec = JobSpec.create(
        ids, threshold=t, length=dim, bound=1.0, graph="harary", degree=k, ring_bits=ring_bits
    )
    count = int(drop_fraction * n)
    if degree is None:
        dropped = random.Random(seed).sample(ids, count)
    else:
        cycle = spec.masking_graph.cycle
        dropped = [cycle[round(i * n / count)] for i in range(count)] if count else []
    load = os.getloadavg()[0]
    report = run_protocol(
        spec,
        inputs,
        drop=dict.fromkeys(dropped, "masked"),
        rng=random.Random(seed),
        site_costs=True,  # each decodes its own spec and messages, as a site does
    )
    return spec, t, len(dropped), report, load


def scaling(
    counts: list[int],
    *,
    dim: int,
    drop_fraction: float,
    seed: int,
    ring_bits: int,
    repeats: int = 3,
    degree: int | None = None,
) -> dict[str, Any]:
    """SecAgg+ jobs (Harary graph) per participant count; per-participant cost.

    One warm-up job first (first-call costs of OpenSSL, libsodium and numpy would
    otherwise fall on the smallest n, the ratios' denominator), then ``repeats`` rounds,
    each one job per n in order, so that a change of the machine's load during the
    block touches every n alike. Each job's figure is the median over its
    participants; each n's, the median over its jobs. ``degree`` holds the Harary
    degree for every n (:func:`_scaling_job`)."""
    _scaling_job(10, dim=1_000, drop_fraction=drop_fraction, seed=seed, ring_bits=ring_bits)
    jobs: dict[int, list[tuple[JobSpec, int, int, Any, float]]] = {n: [] for n in counts}
    for _ in range(repeats):
        for n in counts:
            jobs[n].append(
                _scaling_job(
                    n,
                    dim=dim,
                    drop_fraction=drop_fraction,
                    seed=seed,
                    ring_bits=ring_bits,
                    degree=degree,
                )
            )

    def per_job(report: Any, cpu: bool) -> float:
        values = report.participant_cpu_seconds if cpu else report.participant_seconds
        return float(np.median(list(values.values())))

    rows: dict[str, Any] = {}
    first = counts[0]
    for n in counts:
        spec, t, dropouts, _, _ = jobs[n][0]
        wall = [per_job(job[3], False) for job in jobs[n]]
        cpu = [per_job(job[3], True) for job in jobs[n]]
        first_wall = [per_job(job[3], False) for job in jobs[first]]
        first_cpu = [per_job(job[3], True) for job in jobs[first]]
        reports = [job[3] for job in jobs[n]]
        rows[str(n)] = {
            "participant_ms": round(float(np.median(wall)) * 1e3, 3),
            "participant_ms_max": round(
                max(max(r.participant_seconds.values()) for r in reports) * 1e3, 3
            ),
            "ratio_to_first": round(float(np.median(wall) / np.median(first_wall)), 3),
            "participant_cpu_ms": round(float(np.median(cpu)) * 1e3, 3),
            "ratio_to_first_cpu": round(float(np.median(cpu) / np.median(first_cpu)), 3),
            "participant_cpu_ms_runs": [round(c * 1e3, 3) for c in cpu],
            "ratio_to_first_cpu_runs": [
                round(c / f, 3) for c, f in zip(cpu, first_cpu, strict=True)
            ],
            "server_s": round(
                float(
                    np.median(
                        [r.protocol_seconds - sum(r.participant_seconds.values()) for r in reports]
                    )
                ),
                4,
            ),
            "protocol_s": round(float(np.median([r.protocol_seconds for r in reports])), 4),
            "protocol_ms_per_participant": round(
                float(np.median([r.protocol_seconds for r in reports])) / n * 1e3, 3
            ),
            "degree": spec.degree,
            "threshold": t,
            "dropouts": dropouts,
            "survivors": len(reports[0].result.contributors),
            "load_average_1min": [round(job[4], 2) for job in jobs[n]],
        }
    return {
        "dim": dim,
        "graph": "harary",
        "ring_bits": ring_bits,
        "drop_fraction": drop_fraction,
        "repeats": repeats,
        "site_costs": True,
        "degree_held": degree,
        "per_n": rows,
        "statistic": "after one warm-up job, `repeats` rounds of one job per n; a job's "
        "figure is the median over its participants, an n's the median over its jobs; "
        "participant_ms by wall clock, participant_cpu_ms by this thread's CPU time; "
        "each participant decodes its own copy of the spec and of its messages (site_costs)",
    }
