"""The per-chunk Python layers around the masking kernel (issue #24), alone.

One participant of a real job (ten participants, every message through the state
machines) reaches its masked stage; then, interleaved, best of ``--passes`` by this
thread's CPU time: every ``masked_chunk(i).to_bytes()`` of its input, and the same
kernel calls (``apply_new``, the same chunk, keys, counter blocks and signs, built
beforehand) with nothing around them. ``python_us_per_chunk`` is the difference per
chunk: the participant's checks, the plan's keys and counter blocks, the chunk's framing.
Warm (nothing else runs between the calls), so a lower bound of what the layers cost
inside a job, where the server's absorption evicts them from the caches between chunks.

Prints JSON: ``python bench/secagg_chunk_layers.py --ring-bits 32 --chunk 32768``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/secagg_chunk_layers.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench._report import emit_json
from spherecal.crypto import (
    JobSpec,
    MemoryJobLedger,
    SecAggParticipant,
    SecAggServer,
    generate_identity,
    heap,
    identity_public_bytes,
    keys_needed,
    native,
    prg,
)


def _masked_participant(spec: JobSpec) -> SecAggParticipant:
    """Participant ``spec.participants[0]`` of a real job, at its masked stage, input set."""
    ids = spec.participants
    identities = {p: generate_identity() for p in ids}
    directory = {p: identity_public_bytes(k) for p, k in identities.items()}
    ledger = MemoryJobLedger()
    clients = {
        p: SecAggParticipant(
            spec, p, identities[p], {q: directory[q] for q in keys_needed(spec, p)}, ledger=ledger
        )
        for p in ids
    }
    server = SecAggServer(spec, directory)
    for p in ids:
        server.receive(clients[p].advertise_keys(), sender=p)
    server.close_stage()
    for p in sorted(server.advertised):
        server.receive(clients[p].share_keys(server.roster_for(p)), sender=p)
    server.close_stage()
    for p in sorted(server.shared):
        clients[p].receive_shares(server.bundle_for(p))
    client = clients[ids[0]]
    client.set_input(np.random.default_rng(0).uniform(-1.0, 1.0, spec.length))
    return client


def measure(*, dim: int, ring_bits: int, chunk: int, participants: int, passes: int) -> Any:
    kernel = native.KERNEL
    if kernel is None:
        raise SystemExit("the native masking kernel is not built here")
    heap.retain_freed_memory(heap.DEFAULT_RETAIN_MB)  # as a participant process does
    ids = [f"p{i:03d}" for i in range(participants)]
    spec = JobSpec.create(
        ids, threshold=participants // 2 + 1, length=dim, bound=1.0, ring_bits=ring_bits,
        chunk_size=chunk,
    )  # fmt: skip
    client = _masked_participant(spec)
    plan, encoded = client._plan, client._encoded  # the participant's own, read only
    assert encoded is not None
    keys, signs = prg._plan_bytes(plan)
    calls = []
    for index in range(spec.n_chunks):
        start, stop = spec.chunk_bounds(index)
        counters = prg._counters(plan, start * encoded.itemsize)
        calls.append((b"\0" * 40, encoded[start:stop], keys, counters, signs, encoded.itemsize))

    def layers() -> float:
        c0 = time.thread_time()
        for index in range(spec.n_chunks):
            client.masked_chunk(index).to_bytes()
        return time.thread_time() - c0

    def bare() -> float:
        c0 = time.thread_time()
        for call in calls:
            kernel.apply_new(*call)
        return time.thread_time() - c0

    full, alone = min(layers() for _ in range(2)), min(bare() for _ in range(2))
    for _ in range(passes):
        full, alone = min(full, layers()), min(alone, bare())
    n = spec.n_chunks
    return {
        "ring_bits": ring_bits,
        "chunk_entries": chunk,
        "chunks": n,
        "masks": len(plan),
        "masked_chunks_ms": round(full * 1e3, 3),
        "kernel_alone_ms": round(alone * 1e3, 3),
        "python_us_per_chunk": round((full - alone) / n * 1e6, 1),
        "kernel_us_per_chunk": round(alone / n * 1e6, 1),
        "kernel_engine": native.engine(),
        "statistic": f"best of {passes} interleaved passes, thread CPU time",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=1766400)
    parser.add_argument("--ring-bits", type=int, choices=(32, 64), default=32)
    parser.add_argument("--chunk", type=int, default=1 << 15, help="entries per chunk")
    parser.add_argument("--participants", type=int, default=10)
    parser.add_argument("--passes", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = parser.parse_args(argv)
    result = measure(
        dim=args.dim,
        ring_bits=args.ring_bits,
        chunk=args.chunk,
        participants=args.participants,
        passes=args.passes,
    )
    emit_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
