"""Benchmark of the secure-aggregation protocol against the AES work it cannot avoid.

Runs one whole job in-process between real :class:`crypto.SecAggParticipant` and
:class:`crypto.SecAggServer` state machines (every message through its canonical
bytes), with ``--dropouts`` participants vanishing after key sharing, i.e. before
their masked input (the expensive case: the server must rebuild their pairwise masks).

Definitions (all measured in the same process, on the same machine, in this run):

``aes_ctr_gbps``, ``aes_gcm_gbps``
    Keystream rates of OpenSSL's AES-128-CTR and AES-128-GCM paths (``update_into`` of
    256 KiB tiles into one preallocated buffer, best of 3 passes of 64 MiB each). Both
    produce the v2 mask keystream bit for bit (:mod:`spherecal.crypto.prg`);
    ``keystream_engine`` is the faster, the one masking uses, and ``raw_aes_ctr_gbps``
    (kept under its old name) is the faster rate, the yardstick of every ratio below.
``mask_gen_over_keystream``
    ``mask_gen_gbps / raw_aes_ctr_gbps``: mask generation as a fraction of the faster
    keystream (issue #24 target: at least 0.75).
``input_over_keystream``
    A participant's float vector → upload bytes (``set_input``'s range check and
    encoding, every masked chunk and its serialisation; ``input_seconds``) divided by
    the time the faster keystream needs for the masks it must expand (issue #24 target:
    at most 1.3).
``mask_gen_over_keystream_cpu``, ``input_over_keystream_cpu``
    The same two ratios by CPU time (``time.thread_time``), the participant's and the
    keystream's (``raw_keystream_cpu_gbps``, best of 3 passes of 64 MiB): on a shared
    machine the wall clock also counts the time spent waiting for a core.
``mask_gen_gbps``
    Mask bytes a participant expands and adds into its chunks, divided by the time
    it takes to produce all its masked chunks (copying its encoded input, expanding
    ``|N(u) ∩ U2| + 1`` masks, adding them, serialising each chunk). Mean over
    uploaders. Target: at least 50% of ``raw_aes_ctr_gbps``.
``participant_mask_s``
    Mean wall time for one uploader to produce its whole masked input.
``server_unmask_s``
    Wall time of ``SecAggServer.finish()``: Shamir reconstruction, key agreement,
    removal of survivors' self masks and of the dropouts' pairwise masks, decoding.
``protocol_s``
    Wall time of the whole job in this process: key generation, signatures, share
    encryption, every encode/decode of every message, all participants' masking,
    the server's absorption and unmasking (one core; real participants run in
    parallel on their own machines, so this *over*-states the critical path).
``unavoidable_aes_s``
    Time to produce, with raw AES-CTR as above, the keystream that *any* correct
    pairwise-masking protocol with these dropouts must produce: every uploader's
    masks (one per neighbour in ``U2`` plus its self mask, ``8 x dim`` bytes each),
    plus the server's regeneration of each survivor's self mask and of each
    survivor-dropout pairwise mask. ``protocol_over_aes_ratio = protocol_s /
    unavoidable_aes_s``; target at most 3.
``upload_bytes_per_participant``
    Bytes an uploading participant sends in the whole job (all messages, canonical
    encodings, chunk framing included). ``upload_bytes_per_entry`` divides by
    ``dim``; at most ``w/8 + 0.1`` for a ``w``-bit ring.
``rings``
    Both rings (the 64-bit statistics ring and the 32-bit update ring), each measured
    the same way (``bench/secagg_job.py``): a small warm-up job, the ring's first
    full-size job — reported on its own under ``first_job``, not in the medians: it
    meets whatever the process holds from the other ring (its spare encoded-input
    buffers, its heap) — then the median of ``--repeats`` jobs (``runs``;
    ``input_over_keystream_cpu_runs`` lists every job's ratio). Per ring and per first
    job: bytes per entry, the mask and float → upload ratios (wall clock, CPU time,
    against OpenSSL's and the kernel's own keystream), ``participant_mask_s``,
    ``protocol_s``, ``minor_page_faults``, ``input_minor_faults``; per ring
    ``max_abs_error`` (every job of it) and ``error_bound``. The main ring
    (``--ring-bits``, 64 by default) runs first; its figures are also the top-level keys.
``kernel``
    The masking kernel alone, interleaved so that load on a shared machine hits both
    sides alike: per pass, one participant's whole vector (``--dim`` entries, 11 masks,
    chunk by chunk as ``masked_chunk`` does it: encoded input + masks, serialised) and
    the same number of keystream bytes from the faster engine with nothing else; the
    ratio of the best passes (contention only adds time), per ring:
    ``mask_over_keystream`` (issue #24 target: at least 0.75) and ``input_over_keystream``
    (float vector → upload bytes, encoding included; target at most 1.3);
    ``mask_major_over_keystream`` is the masks applied one after another over the whole
    chunk (the order before tile-major masking); ``mask_numpy_over_keystream`` and
    ``input_numpy_over_keystream`` are the numpy path where the native kernel
    (:mod:`spherecal.crypto.native`) runs the others (``native_kernel`` says whether it
    was loaded; without it both pairs time the numpy path). Keys ending ``_cpu`` use this thread's
    CPU time instead of the wall clock (free of the time spent waiting for a core on a
    shared machine). ``--kernel-chunk`` sets the chunk (the service's is 262,144 entries).
``scaling``
    With ``--scaling 10,100,500,1000``: SecAgg+ jobs (Harary graph, ``--scaling-dim``
    entries, 10 % of the participants dropping before their masked input) — one warm-up
    job, then ``--scaling-repeats`` rounds (default 3) of one job per n, interleaved;
    a job's ``participant_ms`` is the median over participants of the wall time inside
    each participant's own calls over the whole job (construction, every round, every
    message encoding and decoding — each participant decodes its own copy of the job
    spec and of every message addressed to it, as a site of the service does, so the
    O(n) work of a site is in its figure: ``site_costs``, from 2026-11-27), an n's the
    median over its jobs (``_runs``: per job);
    ``server_s`` is the rest of the job; ``ratio_to_first`` divides by
    the smallest n's (issue #24 target at n = 500 vs 10: at most 1.5);
    ``participant_cpu_ms`` / ``ratio_to_first_cpu`` the same by CPU time;
    ``load_average_1min`` the machine's load when the job started (a shared machine).
    ``--scaling-degree K`` holds the Harary degree at ``K`` for every n (default: each
    n's own, ``2⌈log₂ n⌉``, 8 at n = 10 and 18 at n = 500) and drops every tenth
    participant of the Harary cycle instead of a random tenth (a random tenth can leave
    some owner of a sparse graph too few live share holders): what grows with n alone,
    apart from what grows with the degree (``"degree_held"`` in the JSON).
    ``degree_model``: ``participant_cpu_ms`` fitted as fixed + degree × per neighbour +
    n × per roster member, with the per-neighbour cost the 1.5× line would need at each
    n (``bench/secagg_scaling.py: degree_model``; null with fewer n than parameters).
    ``public_key_floor``: per n, the X25519 agreements and Ed25519 verifications a
    participant makes in its own calls (counted in one job: ``2k + 1`` and about
    ``2k`` at degree ``k``), their cost at the unit times measured in the same run
    (``floor_ms``), its ratio to the smallest n's, and the degree-free work a
    participant would need for the 1.5× line to hold (``other_work_needed_ms``;
    ``bench/secagg_scaling.py: public_key_floor``).
``policy_overhead``
    The cost of the participants' privacy policy (:mod:`spherecal.crypto.policy`): every
    repeat runs the same job twice, alternating the order — once as deployed by
    default (signed survivor-set round + the default ``SecAggPolicy``'s checks) and
    once without the consistency round and with every policy rule relaxed.
    ``protocol_s_with`` / ``protocol_s_without`` are the medians,
    ``overhead_fraction = (with - without) / without`` (target below 0.10); the
    per-run pairs are listed too. On a shared machine whole-job times vary by tens
    of per cent from run to run, far more than the overhead, so the block also
    measures the overhead where it is not drowned: the consistency round and the
    policy checks do not depend on the vector length, so ``fixed_overhead_s`` is the
    median paired difference over ``SMALL_PAIRS`` jobs of ``SMALL_DIM`` entries, and
    ``fixed_overhead_fraction`` divides it by the fastest default run at ``dim``
    (contention only adds time, so the minimum is the least disturbed). All other
    keys describe the default (with) runs.
``minor_page_faults``, ``input_minor_faults``
    Minor page faults of this process during the job (``getrusage``), and of one
    uploader's float → upload calls alone (the mean over uploaders; ``RUSAGE_THREAD``):
    with glibc's defaults each masked chunk's new ``bytes`` object tends to be fresh
    memory, whose pages fault in while the kernel writes them. ``--retain-freed-mb``
    keeps freed memory for reuse instead (:mod:`spherecal.crypto.heap`); by default the
    bench does what a participant process does at start (``SPHERECAL_RETAIN_FREED_MB``,
    else 64 MiB), ``0`` keeps glibc's defaults (``retain_freed_mb``; ``retain_freed_applied``
    says whether it took effect).
``prepare_input``, ``prepare_input_ms``, ``prepare_input_cpu_ms``, ``prepare_minor_faults``
    Whether each participant calls ``SecAggParticipant.prepare_input`` right after its
    share answer, as the service does (the default; ``--no-prepare-input`` turns it
    off): the input's buffer is borrowed then, and a new one faulted in (a write per
    page), so float → upload (``input_*``) no longer pays those page faults — they are
    *moved* to a moment the participant waits, not gone, and reported apart: per job
    the mean wall and CPU ms of that call over the participants that made it (dropouts
    included) and the sum of its minor faults; per ring and per first job as the other
    figures.
``own_keystream_cpu_gbps``, ``mask_gen_over_own_keystream_cpu``, ``input_over_own_keystream_cpu``
    The kernel's own bare keystream (its current engine, ``kernel_engine``: its own
    AES-128-CTR on VAES or AES-NI where the CPU has them) by CPU time, and the two ratios
    against it instead of OpenSSL's; the kernel block reports ``own_keystream_gbps``,
    ``mask_over_own_keystream``, ``input_over_own_keystream`` likewise, and
    ``mask_evp_over_keystream``/``input_evp_over_keystream`` for the kernel on OpenSSL's
    EVP engine (its first version).
``peak_rss_mb``
    Peak resident memory of this process (includes all simulated participants'
    inputs; the server itself holds ``(1 + max_in_flight)`` vectors, see
    ``server_vector_bytes``).

Timing protocol, per ring: one small warm-up job (first-call costs of OpenSSL and
numpy), the first full-size job (``rings[...]["first_job"]``; ``protocol_s_first_run``
is the main ring's), then ``--repeats`` jobs, each a fresh job id with fresh keys;
every reported time and rate is the median over the repeats, each ratio the median of
the per-run ratios. The machine may be shared, so run on an idle machine when the
numbers matter.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/secagg.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench._report import emit_json
from bench.secagg_job import medians, one_job, ring_block, ring_summary, warm_and_cold
from bench.secagg_kernel import kernel
from bench.secagg_scaling import scaling
from spherecal.crypto import heap, native
from spherecal.crypto.policy import SecAggPolicy
from spherecal.crypto.prg import fastest_engine
from spherecal.crypto.spec import DEFAULT_CHUNK_ENTRIES, JobSpec

SMALL_DIM = 64
SMALL_PAIRS = 15
RELAXED_POLICY = SecAggPolicy(
    require_consistency_round=False,
    require_majority_threshold=False,
    min_participants=2,
    min_inputs=2,
)


def run(
    *,
    dim: int,
    participants: int,
    dropouts: int,
    threshold: int | None,
    graph: str,
    chunk_size: int,
    max_in_flight: int,
    seed: int,
    repeats: int,
    ring_bits: int = 64,
    prepare_input: bool = True,
) -> dict[str, Any]:
    """Warm-up, then ``repeats`` runs; returns medians (JSON-ready)."""
    if not 0 <= dropouts <= participants - 2:
        raise SystemExit("--dropouts must leave at least two participants")
    if repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    t = threshold
    if t is None:
        t = max(2, min(participants - dropouts, participants // 2 + 1))
    data_rng = np.random.default_rng(seed)
    ids = [f"p{i:03d}" for i in range(participants)]
    inputs = {p: data_rng.uniform(-1.0, 1.0, dim) for p in ids}
    dropped = random.Random(seed).sample(ids, dropouts)

    def make_spec(length: int, consistency: bool = True, ring: int = ring_bits) -> JobSpec:
        # a fresh job (new id, keys, masks) per run
        return JobSpec.create(
            ids,
            threshold=t,
            length=length,
            bound=1.0,
            graph=graph,
            chunk_size=chunk_size,
            consistency_check=consistency,
            ring_bits=ring,
        )

    # The ring's start: a warm-up job on a small vector (imports, OpenSSL/numpy
    # first-call costs), then its first full-size job, reported on its own
    # (``rings[...]["first_job"]``), not in the medians.
    warm = min(dim, 4 * chunk_size)
    cold = warm_and_cold(
        make_spec,
        inputs,
        dropped,
        dim=dim,
        warm_dim=warm,
        seed=seed,
        max_in_flight=max_in_flight,
        prepare_input=prepare_input,
    )
    runs: list[dict[str, Any]] = []
    bare: list[dict[str, Any]] = []

    def with_policy(r: int) -> dict[str, Any]:  # the deployed default
        return one_job(
            make_spec(dim),
            inputs,
            dropped,
            seed=seed + r,
            max_in_flight=max_in_flight,
            prepare_input=prepare_input,
        )

    def without_policy(r: int) -> dict[str, Any]:  # no consistency round, no policy rules
        return one_job(
            make_spec(dim, consistency=False),
            inputs,
            dropped,
            seed=seed + r,
            max_in_flight=max_in_flight,
            policy=RELAXED_POLICY,
            raw_gbps=1.0,  # not reported for these runs
            prepare_input=prepare_input,
        )

    for r in range(repeats):
        if r % 2 == 0:  # alternate the order so drift hits both alike
            runs.append(with_policy(r))
            bare.append(without_policy(r))
        else:
            bare.append(without_policy(r))
            runs.append(with_policy(r))
    spec = make_spec(dim)
    out = medians(runs)
    out["max_abs_error"] = max(r["max_abs_error"] for r in runs)
    out["error_bound"] = runs[0]["error_bound"]
    out["protocol_s_first_run"] = round(cold["protocol_s"], 4)
    with_s = [r["protocol_s"] for r in runs]
    without_s = [r["protocol_s"] for r in bare]
    median_with, median_without = float(np.median(with_s)), float(np.median(without_s))
    out["policy_overhead"] = {
        "protocol_s_with": round(median_with, 4),
        "protocol_s_without": round(median_without, 4),
        "overhead_s": round(median_with - median_without, 4),
        "overhead_fraction": round((median_with - median_without) / median_without, 4),
        "runs_with_s": [round(v, 4) for v in with_s],
        "runs_without_s": [round(v, 4) for v in without_s],
        "max_abs_error_without": max(r["max_abs_error"] for r in bare),
    }
    small_with: list[float] = []
    small_without: list[float] = []
    for r in range(SMALL_PAIRS):
        small = {p: v[:SMALL_DIM] for p, v in inputs.items()}
        for consistency, policy, out_list in (
            (True, None, small_with),
            (False, RELAXED_POLICY, small_without),
        )[:: 1 if r % 2 == 0 else -1]:
            run_ = one_job(
                make_spec(SMALL_DIM, consistency=consistency),
                small,
                dropped,
                seed=seed + r,
                max_in_flight=max_in_flight,
                policy=policy,
                raw_gbps=1.0,
                prepare_input=prepare_input,
            )
            out_list.append(run_["protocol_s"])
    fixed = float(np.median(np.array(small_with) - np.array(small_without)))
    out["policy_overhead"].update(
        fixed_overhead_s=round(fixed, 5),
        fixed_overhead_fraction=round(fixed / min(with_s), 5),
        small_job_dim=SMALL_DIM,
        small_job_pairs=SMALL_PAIRS,
        small_job_s_with=round(float(np.median(small_with)), 5),
        small_job_s_without=round(float(np.median(small_without)), 5),
    )
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["upload_bytes_per_entry"] = round(out["upload_bytes_per_participant"] / dim, 5)
    out["server_vector_bytes"] = (1 + max_in_flight) * spec.entry_bytes * dim
    other = 96 - ring_bits  # the other ring (32 <-> 64), by the same method
    other_cold, other_runs = ring_block(
        lambda length: make_spec(length, ring=other),
        inputs,
        dropped,
        dim=dim,
        warm_dim=warm,
        seed=seed,
        max_in_flight=max_in_flight,
        repeats=repeats,
        prepare_input=prepare_input,
    )
    out["rings"] = {
        str(bits): {
            **ring_summary(medians(jobs), dim),
            "runs": len(jobs),
            "input_over_keystream_cpu_runs": [
                round(j["input_over_keystream_cpu"], 4) for j in jobs
            ],
            "max_abs_error": max(j["max_abs_error"] for j in (first, *jobs)),
            "error_bound": first["error_bound"],
            "first_job": ring_summary(first, dim),
        }
        for bits, first, jobs in ((ring_bits, cold, runs), (other, other_cold, other_runs))
    }
    out["keystream_engine"] = fastest_engine()
    out["kernel_engine"] = native.engine()
    out.update(
        dim=dim,
        participants=participants,
        dropouts=dropouts,
        dropout_stage="masked",
        threshold=t,
        graph=graph,
        degree=spec.degree,
        consistency_check=spec.consistency_check,
        chunk_entries=chunk_size,
        scale_bits=spec.scale_bits,
        ring_bits=ring_bits,
        repeats=repeats,
        prepare_input=prepare_input,
        statistic="per ring: median over repeats after a small warm-up job and the ring's "
        "first full-size job (rings[bits].first_job)",
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.secagg",
        description=(
            "Run one secure-aggregation job in-process and compare its cost with the "
            "AES-CTR keystream work any pairwise-masking protocol must do. Prints JSON."
        ),
        epilog="Metric definitions: see this module's docstring.",
    )
    parser.add_argument(
        "--dim",
        type=int,
        default=1766400,
        help="vector length (default 1766400 = 1280^2 + 1280*100)",
    )
    parser.add_argument("--participants", type=int, default=10, help="participants (default 10)")
    parser.add_argument(
        "--dropouts",
        type=int,
        default=3,
        help="participants that vanish after sharing keys (default 3)",
    )
    parser.add_argument(
        "--threshold",
        type=int,
        default=None,
        help="Shamir threshold t (default: n//2 + 1, at most n - dropouts)",
    )
    parser.add_argument(
        "--graph",
        choices=("complete", "harary"),
        default="complete",
        help="masking graph (default complete)",
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=DEFAULT_CHUNK_ENTRIES,
        help=f"entries per streamed chunk (default {DEFAULT_CHUNK_ENTRIES})",
    )
    parser.add_argument(
        "--max-in-flight", type=int, default=2, help="server upload staging slots (default 2)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="measured runs; the JSON reports medians (default 3)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the test data and the choice of dropouts only"
    )
    parser.add_argument(
        "--ring-bits",
        type=int,
        choices=(32, 64),
        default=64,
        help="ring of the main runs (default 64, the statistics ring; one run in the other)",
    )
    parser.add_argument(
        "--scaling",
        default="",
        help="also run one SecAgg+ job per participant count, e.g. 10,100,500,1000",
    )
    parser.add_argument("--scaling-dim", type=int, default=100_000)
    parser.add_argument(
        "--scaling-repeats",
        type=int,
        default=3,
        help="rounds of the --scaling block, one job per n each (default 3)",
    )
    parser.add_argument(
        "--scaling-degree",
        type=int,
        default=None,
        metavar="K",
        help="hold the --scaling block's Harary degree at K for every n (dropouts then "
        "spaced on the cycle); default: each n's own degree, random dropouts",
    )
    parser.add_argument(
        "--skip-main",
        action="store_true",
        help="only the --kernel/--scaling blocks (no main runs)",
    )
    parser.add_argument(
        "--kernel", action="store_true", help="also the interleaved masking-kernel block"
    )
    parser.add_argument(
        "--kernel-chunk",
        type=int,
        default=DEFAULT_CHUNK_ENTRIES,
        help=f"entries per chunk in the kernel block (default {DEFAULT_CHUNK_ENTRIES}; "
        "the service's chunk is 262144)",
    )
    parser.add_argument(
        "--retain-freed-mb",
        type=int,
        default=None,
        metavar="MB",
        help="keep up to MB MiB of freed heap in this process (glibc mallopt) so masked "
        "chunks reuse memory instead of faulting in fresh pages; default: what a "
        f"participant process does at start ({heap.ENV}, else {heap.DEFAULT_RETAIN_MB}); "
        "0: glibc's defaults",
    )
    parser.add_argument(
        "--no-prepare-input",
        action="store_true",
        help="participants do not call prepare_input after their share answer (the "
        "input's buffer is then borrowed, and a new one faulted in, by set_input)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="OUT",
        help="also write the JSON result to this file",
    )
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    retain = heap.retain_mb_from_env() if args.retain_freed_mb is None else args.retain_freed_mb
    if retain < 0:
        raise SystemExit("--retain-freed-mb must be 0 or more")
    result["retain_freed_mb"] = retain
    result["retain_freed_applied"] = retain > 0 and heap.retain_freed_memory(retain)
    if args.kernel:
        result["kernel"] = {
            str(b): kernel(args.dim, ring_bits=b, chunk=args.kernel_chunk) for b in (64, 32)
        }
        result["kernel"]["keystream_engine"] = fastest_engine()
    if args.scaling:
        counts = [int(c) for c in args.scaling.split(",") if c]
        result["scaling"] = scaling(
            counts,
            dim=args.scaling_dim,
            drop_fraction=0.1,
            seed=args.seed,
            ring_bits=32,
            repeats=args.scaling_repeats,
            degree=args.scaling_degree,
        )
    if args.skip_main:
        text = json.dumps(result, indent=2, sort_keys=True)
        print(text)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(text + "\n")
        return 0
    result |= run(
        dim=args.dim,
        participants=args.participants,
        dropouts=args.dropouts,
        threshold=args.threshold,
        graph=args.graph,
        chunk_size=args.chunk_size,
        max_in_flight=args.max_in_flight,
        seed=args.seed,
        repeats=args.repeats,
        ring_bits=args.ring_bits,
        prepare_input=not args.no_prepare_input,
    )
    emit_json(result, args.json, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
