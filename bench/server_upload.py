"""The coordinator's time per masked upload (issue #24, item 3: fewer passes).

What it times: ``CoordinatorService.upload_masked`` — the real service core with
its SQLite store, audit log, secure job and ``crypto.SecAggServer`` (the harness of
``tests/unit/coordinator/service_harness.py``) — for every participant of a secure
update round, on pre-built masked chunks (so only the server's own work is timed,
not the participant's masking or gRPC's framing). Also, on its own, the staging of
one upload into the sum (``crypto.staging.StagedSum``: validate, add, complete).

Each federation gives ``participants`` uploads; ``--federations`` repeats it. The
model is ``mobilenetv2`` on 8×8 digits (2,224,386 update entries; the FFC size of
issue #24 is 1,766,400), 2 MiB chunks, 64- or 32-bit ring.

    python bench/server_upload.py --federations 2 --participants 4 --json OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spherecal import crypto  # noqa: E402
from spherecal.coordinator.settings import ModelSettings  # noqa: E402
from spherecal.coordinator.state.registry import Peer  # noqa: E402
from spherecal.crypto.staging import StagedSum  # noqa: E402
from spherecal.proto import spherecal_pb2 as pb  # noqa: E402
from tests.unit.coordinator.service_harness import Harness, settings_for  # noqa: E402

CHUNK = 1 << 18


def _submit(
    h: Harness, pid: str, job: crypto.JobSpec, stage: pb.SecAggStage, message: bytes
) -> None:
    h.service.submit_secagg(
        pb.SecAggSubmission(caller=h.caller(pid), job_id=job.job_id, stage=stage, message=message),
        Peer(),
    )


def federation(tmp: Path, *, participants: int, resolution: float) -> dict[str, Any]:
    """One secure update round up to its masked stage; every upload timed."""
    base = settings_for(tmp, secure=True, n=participants)
    settings = replace(
        base,
        model=ModelSettings(extractor="mobilenetv2"),
        secagg=replace(base.secagg, chunk_entries=CHUNK, update_resolution=resolution),
        server=replace(base.server, max_chunk_bytes=8 * CHUNK + 4096),
    )
    h = Harness(settings).start()
    try:
        ids = list(settings.participants)
        for pid in ids:
            h.join(pid)
        train = {p: h.poll(p, {"train"}, timeout=120) for p in ids}
        job = crypto.JobSpec.from_bytes(train[ids[0]].train.secure.spec)
        directory = {
            e.participant_id: e.identity_public_key for e in train[ids[0]].train.secure.directory
        }
        rng = np.random.default_rng(0)
        clients = {}
        for pid in ids:
            c = crypto.SecAggParticipant(job, pid, h.keys[pid], directory)
            c.set_input(rng.uniform(-1, 1, size=job.length))
            _submit(h, pid, job, pb.ADVERTISE, c.advertise_keys().to_bytes())
            clients[pid] = c
        for pid, c in clients.items():
            step = h.poll(pid, {"secagg"}, timeout=120).secagg
            roster = crypto.KeyRoster.from_bytes(step.message)
            _submit(h, pid, job, pb.SHARE, c.share_keys(roster).to_bytes())
        uploads: dict[str, list[pb.MaskedUpload]] = {}
        for pid, c in clients.items():
            step = h.poll(pid, {"secagg"}, timeout=120).secagg
            c.receive_shares(crypto.ShareBundle.from_bytes(step.message))
            chunks = [ch.to_bytes() for ch in c.masked_chunks()]
            uploads[pid] = [
                pb.MaskedUpload(caller=h.caller(pid), job_id=job.job_id, chunk=chunks[0])
            ] + [pb.MaskedUpload(chunk=ch) for ch in chunks[1:]]
        seconds = []
        for pid in ids:
            t0 = time.perf_counter()
            receipt = h.service.upload_masked(iter(uploads[pid]), Peer())
            seconds.append(time.perf_counter() - t0)
            assert receipt.chunks == job.n_chunks
        return {
            "entries": job.length,
            "ring_bits": job.ring_bits,
            "upload_bytes": sum(len(m.chunk) for m in uploads[ids[0]]),
            "upload_s": seconds,
        }
    finally:
        h.close()


def staging(length: int, ring_bits: int, repeats: int) -> list[float]:
    """``StagedSum`` alone: one whole upload in 2 MiB chunks into the sum."""
    spec = crypto.JobSpec.create(
        participants=[f"p{k}" for k in range(repeats)],
        threshold=max(2, repeats // 2 + 1),
        length=length,
        bound=1.0,
        chunk_size=CHUNK,
        ring_bits=ring_bits,
    )
    rng = np.random.default_rng(1)
    words = rng.integers(0, 2**63, size=length, dtype=np.uint64).astype(spec.dtype)
    chunks = [words[a:b].tobytes() for a, b in (spec.chunk_bounds(i) for i in range(spec.n_chunks))]
    staged = StagedSum(spec, max_in_flight=2)
    out = []
    for k in range(repeats):
        t0 = time.perf_counter()
        for index, data in enumerate(chunks):
            staged.add_chunk(f"p{k}", index, data)
        out.append(time.perf_counter() - t0)
    expected = (words.astype(np.uint64) * np.uint64(repeats)).astype(spec.dtype)
    assert np.array_equal(staged.total, expected)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--federations", type=int, default=2)
    parser.add_argument("--participants", type=int, default=4)
    parser.add_argument("--staging-repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"settings": vars(args) | {"json": str(args.json)}}
    for name, resolution in (("ring64", 0.0), ("ring32", 2.0**-10)):
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for f in range(args.federations):
                runs.append(
                    federation(
                        Path(tmp) / f"f{f}", participants=args.participants, resolution=resolution
                    )
                )
        times = [s for r in runs for s in r["upload_s"]]
        stage = staging(runs[0]["entries"], runs[0]["ring_bits"], args.staging_repeats)
        report[name] = {
            "entries": runs[0]["entries"],
            "ring_bits": runs[0]["ring_bits"],
            "upload_bytes": runs[0]["upload_bytes"],
            "uploads_timed": len(times),
            "service_upload_ms_median": 1e3 * statistics.median(times),
            "service_upload_ms_min": 1e3 * min(times),
            "service_upload_gbps_median": runs[0]["upload_bytes"] / statistics.median(times) / 1e9,
            "staging_upload_ms_median": 1e3 * statistics.median(stage),
            "staging_upload_ms_min": 1e3 * min(stage),
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
