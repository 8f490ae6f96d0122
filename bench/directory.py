"""Size of one participant's secure-job instruction and its job-setup CPU, vs n.

For each n a real ``spherecal.coordinator.driver.secure_job.SecureJob`` is built the way the
coordinator builds it (``plan_graph``: Harary above 32 participants, consistency
round on), and measured:

* ``message_bytes``: the serialized ``SecAggJob`` one participant receives (spec +
  identity-directory entries), and ``directory_entries`` in it;
* ``setup_cpu_ms``: that participant's job setup —
``spherecal.participant.secure_session.SecureSession``,
  i.e. ``DirectoryTrust.verify`` (with ``--certs``: one CA-signed certificate per entry
  it checks) plus ``crypto.SecAggParticipant`` construction (keys loaded, policy,
  graph) — process CPU, median over ``--runs`` × ``--samples`` participants;
* ``coordinator_messages_s``: CPU to build every participant's instruction once.

The same script runs on older code (where ``job_message()`` took no participant
and carried the whole directory), so "before" numbers come from running it on a
checkout of the earlier commit. Prints JSON::

    python bench/directory.py --participants 100,300,1000 --runs 3
    python bench/directory.py --participants 100,300,1000 --runs 3 --certs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal import crypto
from spherecal.certs import init_ca, issue_participant
from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.coordinator.settings import SecAggSettings
from spherecal.participant.secure_session import SecureSession
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import load_identity_key, public_key_bytes


def _identities(n: int, pki: Path | None) -> tuple[dict[str, Ed25519PrivateKey], dict[str, bytes]]:
    """(private identity keys, certificate PEM or b"") for p0000..p{n-1}."""
    ids = [f"p{k:04d}" for k in range(n)]
    if pki is None:
        return {p: crypto.generate_identity() for p in ids}, dict.fromkeys(ids, b"")
    for p in ids:
        if not (pki / f"{p}.pem").exists():
            issue_participant(pki, p)
    keys = {p: load_identity_key(pki / f"{p}.identity.key") for p in ids}
    return keys, {p: (pki / f"{p}.pem").read_bytes() for p in ids}


def _message(job: SecureJob, participant: str) -> pb.SecAggJob:
    build: Any = job.job_message
    try:
        return cast(pb.SecAggJob, build(participant))
    except TypeError:  # the code before per-participant directories
        return cast(pb.SecAggJob, build())


def measure(n: int, *, pki: Path | None, runs: int, samples: int) -> dict[str, object]:
    identities, certificates = _identities(n, pki)
    ids = sorted(identities)
    public = {p: public_key_bytes(k) for p, k in identities.items()}
    directory = [
        pb.DirectoryEntry(
            participant_id=p, identity_public_key=public[p], certificate_pem=certificates[p]
        )
        for p in ids
    ]
    trust = DirectoryTrust((pki / "ca.pem").read_bytes() if pki is not None else None)
    setup_ms: list[float] = []
    build_s: list[float] = []
    sizes: list[int] = []
    entries: list[int] = []
    spec = None
    for _ in range(runs):
        job = SecureJob(
            purpose="ffc",
            round_index=None,
            participants=ids,
            identity_keys=public,
            directory=directory,
            settings=SecAggSettings(),
            length=9_537,
            bound=10.0,
            first_stage_s=60.0,
            stage_s=60.0,
        )
        spec = job.spec
        cpu0 = time.process_time()
        messages = {p: _message(job, p) for p in ids}
        build_s.append(time.process_time() - cpu0)
        for p in ids[:: max(1, n // samples)][:samples]:
            message = pb.SecAggJob.FromString(messages[p].SerializeToString())
            sizes.append(message.ByteSize())
            entries.append(len(message.directory))
            cpu0 = time.process_time()
            SecureSession(
                message,
                participant_id=p,
                identity=identities[p],
                ledger=crypto.MemoryJobLedger(),
                trust=trust,
            )
            setup_ms.append((time.process_time() - cpu0) * 1e3)
    assert spec is not None
    return {
        "participants": n,
        "graph": spec.graph,
        "degree": spec.degree,
        "threshold": spec.threshold,
        "certificates": pki is not None,
        "message_bytes": int(statistics.median(sizes)),
        "message_bytes_max": max(sizes),
        "directory_entries": int(statistics.median(entries)),
        "setup_cpu_ms": round(statistics.median(setup_ms), 2),
        "setup_cpu_ms_max": round(max(setup_ms), 2),
        "setup_samples": len(setup_ms),
        "coordinator_messages_s": round(statistics.median(build_s), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--participants", default="100,300,1000")
    parser.add_argument("--runs", type=int, default=3, help="jobs per n")
    parser.add_argument("--samples", type=int, default=5, help="participants measured per job")
    parser.add_argument("--certs", action="store_true", help="entries carry CA-signed certificates")
    parser.add_argument("--pki", type=Path, default=None, help="reuse this CA directory")
    args = parser.parse_args()
    sizes = [int(x) for x in args.participants.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        pki = None
        if args.certs:
            pki = args.pki or Path(tmp) / "ca"
            if not (pki / "ca.pem").exists():
                init_ca(pki)
        rows = [measure(n, pki=pki, runs=args.runs, samples=args.samples) for n in sizes]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(
        json.dumps(
            {
                "machine": machine,
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
                "commit": commit,
                "runs": args.runs,
                "results": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
