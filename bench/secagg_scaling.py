"""SecAgg+ per-participant cost as n grows (``bench/secagg.py --scaling``).

Why a block of its own: issue #24 asks how a participant's work grows from n = 10 to
1000 on the Harary graph (degree ``2⌈log₂ n⌉``); each n runs whole jobs in-process, one
warm-up job first, then rounds of one job per n interleaved so that load on a shared
machine hits every n alike. The keys it reports are described in ``bench/secagg.py``'s
docstring (``scaling``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import nacl.bindings
import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from spherecal.crypto import keys as crypto_keys
from spherecal.crypto import participant as crypto_participant
from spherecal.crypto.participant import SecAggParticipant
from spherecal.crypto.simulation import run_protocol
from spherecal.crypto.spec import JobSpec, default_degree

__all__ = ["public_key_floor", "scaling"]

# The participant's calls in which a site spends its share of a job (its constructor
# decodes the spec); counted by :func:`_counting_public_key_work`.
_PARTICIPANT_CALLS = (
    "__init__",
    "advertise_keys",
    "share_keys",
    "receive_shares",
    "prepare_input",
    "set_input",
    "masked_chunk",
    "consistency_signature",
    "unmask",
)


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
        "degree_model": degree_model(rows),
        "public_key_floor": public_key_floor(
            counts, drop_fraction=drop_fraction, seed=seed, ring_bits=ring_bits, degree=degree
        ),
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


def degree_model(rows: dict[str, Any], *, target: float = 1.5) -> dict[str, Any] | None:
    """A participant's CPU per job read as ``F + k·a + n·b`` — a fixed part, one per
    Harary neighbour ``k`` and one per roster member ``n`` (the id lists a site reads) —
    fitted by least squares over the n measured, and what issue #24's line "n = 500 no
    more than ``target`` × n = 10" asks of ``a``.

    Why: the degree grows with n (``2⌈log₂ n⌉``), and each neighbour costs a site
    public-key work (two X25519 agreements, its signatures verified) that no encoding
    speeds up; the O(n) part is what is left after moving the lists to C. With the
    fit, ``F + k₂a + n₂b ≤ target·(F + k₁a + n₁b)`` needs ``a ≤ ((target − 1)·F +
    (target·n₁ − n₂)·b) / (k₂ − target·k₁)``: ``per_neighbour_ms_allowed`` (negative:
    out of reach even at no per-neighbour cost), next to the measured ``a``, and
    ``ratio_without_neighbours``, each n's ratio with ``a = 0``. A held degree
    (``--scaling-degree``) fits ``F + n·b`` only, and nothing is asked of ``a``. None
    with fewer points than the model has parameters."""
    first = next(iter(rows.values()))
    k1, n1 = int(first["degree"]), int(next(iter(rows)))
    ns = np.array([int(n) for n in rows], dtype=np.float64)
    degrees = np.array([int(r["degree"]) for r in rows.values()], dtype=np.float64)
    cost = np.array([float(r["participant_cpu_ms"]) for r in rows.values()], dtype=np.float64)
    varies = len(set(degrees.tolist())) > 1
    columns = [np.ones_like(ns), *([degrees] if varies else []), ns]
    if len(rows) < len(columns):
        return None
    coef, *_ = np.linalg.lstsq(np.stack(columns, axis=1), cost, rcond=None)
    fixed, per_member = float(coef[0]), float(coef[-1])
    per_neighbour = float(coef[1]) if varies else None
    allowed: dict[str, float | None] = {}
    without: dict[str, float] = {}
    for n, k2 in zip(list(rows)[1:], degrees[1:], strict=True):
        n2 = int(n)
        without[n] = round((fixed + n2 * per_member) / (fixed + n1 * per_member), 3)
        room = k2 - target * k1
        if not varies or room <= 0:
            allowed[n] = None
            continue
        allowed[n] = round(((target - 1) * fixed + (target * n1 - n2) * per_member) / room, 4)
    return {
        "fixed_ms": round(fixed, 4),
        "per_neighbour_ms": None if per_neighbour is None else round(per_neighbour, 4),
        "per_member_us": round(per_member * 1e3, 3),
        "target_ratio": target,
        "per_neighbour_ms_allowed": allowed,
        "ratio_without_neighbours": without,
        "statistic": "least squares of participant_cpu_ms = fixed_ms + degree × "
        "per_neighbour_ms + n × per_member_us / 1000 over the n measured (no degree term "
        "when it is held); per_neighbour_ms_allowed[n]: the largest per-neighbour cost "
        "with which n's cost stays within target_ratio × the first n's (negative: out of "
        "reach even at zero; null: any, or the degree is held); "
        "ratio_without_neighbours[n]: n's ratio to the first at zero per-neighbour cost",
    }


@contextlib.contextmanager
def _counting_public_key_work(
    counts: dict[int, collections.Counter[str]],
) -> Iterator[None]:
    """Count, per participant object, the X25519 agreements and Ed25519 verifications
    made inside its own calls (:data:`_PARTICIPANT_CALLS`), not the server's.

    The verification is counted at libsodium's entry point (every path of
    :func:`spherecal.crypto.keys.verify` ends there), the agreement at the name the
    participant module calls (:func:`spherecal.crypto.keys.agree`)."""
    current: list[int] = []

    def inside(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(self: SecAggParticipant, *args: Any, **kwargs: Any) -> Any:
            current.append(id(self))
            try:
                return method(self, *args, **kwargs)
            finally:
                current.pop()

        return call

    def counted(kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if current:
                counts.setdefault(current[-1], collections.Counter())[kind] += 1
            return function(*args, **kwargs)

        return call

    originals = {name: getattr(SecAggParticipant, name) for name in _PARTICIPANT_CALLS}
    sign_open, agree = nacl.bindings.crypto_sign_open, crypto_participant.agree
    try:
        for name, method in originals.items():
            setattr(SecAggParticipant, name, inside(method))
        nacl.bindings.crypto_sign_open = counted("verifications", sign_open)
        crypto_participant.agree = counted("agreements", agree)
        yield
    finally:
        for name, method in originals.items():
            setattr(SecAggParticipant, name, method)
        nacl.bindings.crypto_sign_open = sign_open
        crypto_participant.agree = agree


def _best_us(call: Callable[[], object], *, calls: int = 200, passes: int = 5) -> float:
    """Best of ``passes`` mean times of ``calls`` calls, in microseconds."""
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def public_key_floor(
    counts: list[int],
    *,
    drop_fraction: float,
    seed: int,
    ring_bits: int,
    degree: int | None = None,
    target: float = 1.5,
) -> dict[str, Any]:
    """What a participant's public-key operations alone cost per job, per n, and what
    issue #24's line "n = 500 no more than ``target`` × n = 10" asks of the rest.

    Why: each Harary neighbour costs a site two X25519 agreements (the channel key for
    its shares, the masking key for its pairwise mask) and about two Ed25519
    verifications (its key advertisement, its consistency signature), none of which
    any encoding speeds up, and the degree grows with n (``2⌈log₂ n⌉``). The counts
    come from one job per n (the same seed and drops as the timed jobs, a short vector:
    the count does not depend on its length), counted inside each participant's own
    calls (:func:`_counting_public_key_work`); the unit costs are timed here, best of
    five passes (a verification on a 128-byte payload: a survivor set at large n is a
    few kilobytes longer, so the floor is a lower bound). ``floor_ratio[n]`` is n's
    floor over the first n's; with ``W`` ms of work that grows with neither n nor
    the degree, the ratio is ``(W + floor_n) / (W + floor_first)``, within ``target``
    only if ``W ≥ (floor_n − target·floor_first) / (target − 1)``:
    ``other_work_needed_ms[n]`` (0 when the floor alone is within it) — the line is
    met by that much *slower* degree-free work, never by faster public-key work."""
    identity = crypto_keys.generate_identity()
    public = identity.public_key()
    payload = os.urandom(128)
    signature = crypto_keys.sign(identity, payload)
    private = X25519PrivateKey.generate()
    peer = X25519PrivateKey.generate().public_key().public_bytes_raw()
    verification_us = _best_us(
        lambda: crypto_keys.verify(public, signature, payload, what="timing")
    )
    agreement_us = _best_us(lambda: crypto_keys.agree(private, peer))
    per_n: dict[str, dict[str, float | int]] = {}
    for n in counts:
        counted: dict[int, collections.Counter[str]] = {}
        with _counting_public_key_work(counted):
            spec, *_ = _scaling_job(
                n,
                dim=256,
                drop_fraction=drop_fraction,
                seed=seed,
                ring_bits=ring_bits,
                degree=degree,
            )
        agreements = float(np.median([c["agreements"] for c in counted.values()]))
        verifications = float(np.median([c["verifications"] for c in counted.values()]))
        per_n[str(n)] = {
            "degree": spec.degree,
            "participants_counted": len(counted),
            "agreements": agreements,
            "verifications": verifications,
            "floor_ms": round(
                (agreements * agreement_us + verifications * verification_us) / 1e3, 4
            ),
        }
    first, *later = per_n.items()
    floor = first[1]["floor_ms"]
    ratio = {n: round(row["floor_ms"] / floor, 3) for n, row in later}
    needed = {
        n: round(max(0.0, (row["floor_ms"] - target * floor) / (target - 1)), 4)
        for n, row in later
    }
    return {
        "agreement_us": round(agreement_us, 2),
        "verification_us": round(verification_us, 2),
        "per_n": per_n,
        "floor_ratio": ratio,
        "target_ratio": target,
        "other_work_needed_ms": needed,
        "statistic": "per n, the median over participants of the X25519 agreements and "
        "Ed25519 verifications made inside its own calls in one job (same seed and drops "
        "as the timed jobs, 256 entries), times each operation's best-of-5 mean time "
        "(verification on a 128-byte payload: a lower bound); floor_ratio[n]: n's floor "
        "over the first n's; other_work_needed_ms[n]: the work growing with neither n nor "
        "the degree that a participant would need for n's ratio to the first to stay "
        "within target_ratio",
    }
