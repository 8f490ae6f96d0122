"""What syncing the coordinator's commits costs: one secure job's journal traffic
through the real store, with ``durability = "power-loss"`` (each batch a caller
waits for is committed with ``synchronous=FULL``) and ``"process-crash"``
(``NORMAL`` throughout, synced only at checkpoints), in one run.

Per job, as :mod:`spherecal.coordinator.driver.secure_job` writes it: the job row
(before its instruction leaves), each participant's message of the four message
stages (advertise, share, consistency, unmask) from its own thread (each waited for
before the sender hears "OK", as gRPC worker threads do), an audit row per message
and per masked chunk (fire-and-forget), each stage's close, the masked sum's close
and the result (their blobs fsynced as always) and the job's end. It prints JSON:
per mode, wall time per job (median, min, max over ``--jobs``), commits and synced
commits per job, and the ratio of the modes' medians over ``--repeats`` runs each
(their order alternating, each on a fresh database). The figures depend on the disk
(``fdatasync`` latency): say which.

Usage::

    python bench/store_durability.py [--participants 10] [--jobs 20] [--repeats 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as `python bench/store_durability.py`: `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import emit_json
from spherecal.coordinator.state.job_journal import JobJournal
from spherecal.coordinator.state.store import DURABILITY, Store

STAGES = (0, 1, 3, 4)  # advertise, share, consistency, unmask: participant messages
CHUNKS = 4  # masked chunks per participant, audited


def _job(store: Store, journal: JobJournal, k: int, participants: int, entries: int) -> None:
    job_id = f"{k:016x}"
    journal.created(
        job_id=job_id,
        slot=f"bench:{k}",
        purpose="ccvr",
        round_index=None,
        job=os.urandom(256 * participants),
        first_stage_s=30.0,
    )
    for stage in STAGES:

        def send(pid: str, stage: int = stage) -> None:
            data = os.urandom(200)
            journal.message(job_id, stage, pid, data)
            store.audit(
                sender=pid, job=job_id, stage=str(stage), kind="msg", nbytes=200, sha256="0" * 64
            )

        threads = [threading.Thread(target=send, args=(f"p{i}",)) for i in range(participants)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        journal.closed(job_id, stage)
        if stage == 1:  # the masked stage: chunks audited, then its close with the sum
            for i in range(participants):
                for c in range(CHUNKS):
                    store.audit(
                        sender=f"p{i}",
                        job=job_id,
                        stage="masked",
                        kind=f"MaskedChunk[{c}]",
                        nbytes=1 << 16,
                        sha256="0" * 64,
                    )
            journal.masked_closed(
                job_id, [f"p{i}" for i in range(participants)], np.zeros(entries, np.uint64)
            )
    journal.finished(
        job_id,
        "done",
        contributors=tuple(f"p{i}" for i in range(participants)),
        values=np.zeros(entries),
    )


def measure(
    durability: str, root: Path, participants: int, jobs: int, entries: int
) -> dict[str, Any]:
    store = Store(root / durability / "state.db", durability=durability)
    journal = JobJournal(store)
    try:
        _job(store, journal, 10**6, participants, entries)  # warm-up, not counted
        commits, synced = store.commits, store.synced_commits
        times = []
        for k in range(jobs):
            t0 = time.perf_counter()
            _job(store, journal, k, participants, entries)
            times.append(time.perf_counter() - t0)
        return {
            "durability": durability,
            "job_s_median": round(statistics.median(times), 4),
            "job_s_min": round(min(times), 4),
            "job_s_max": round(max(times), 4),
            "commits_per_job": round((store.commits - commits) / jobs, 1),
            "synced_commits_per_job": round((store.synced_commits - synced) / jobs, 1),
        }
    finally:
        store.close()


DELAY_ENV = "SPHERECAL_FSYNC_DELAY_US"


def _rerun_on_a_slow_disk(delay_ms: float) -> None:
    """Run this script again with ``tests/fsync_snapshot.c`` preloaded, every sync
    ``delay_ms`` slower (the shim only sleeps: no folder is watched)."""
    from tests.power_loss import build_shim

    folder = Path(tempfile.mkdtemp(prefix="fsync-shim-"))
    env = {
        **os.environ,
        "LD_PRELOAD": str(build_shim(folder)),
        DELAY_ENV: str(round(delay_ms * 1000)),
    }
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--participants", type=int, default=10)
    p.add_argument("--jobs", type=int, default=20)
    p.add_argument("--repeats", type=int, default=4, help="runs of each mode, order alternating")
    p.add_argument("--entries", type=int, default=1 << 16, help="sum/result vector length")
    p.add_argument("--dir", type=Path, default=None, help="state folder's disk (default tmp)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--fsync-delay-ms",
        type=float,
        default=0.0,
        help="make every fsync/fdatasync this much slower (a slow disk; needs a C compiler)",
    )
    a = p.parse_args()
    if a.fsync_delay_ms > 0 and DELAY_ENV not in os.environ:
        _rerun_on_a_slow_disk(a.fsync_delay_ms)  # does not return
    runs = []
    for rep in range(a.repeats):  # alternating order: neither mode always runs first
        order = DURABILITY if rep % 2 == 0 else DURABILITY[::-1]
        for d in order:
            with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
                runs.append(
                    {"repeat": rep, **measure(d, Path(tmp), a.participants, a.jobs, a.entries)}
                )
    by = {
        d: statistics.median(r["job_s_median"] for r in runs if r["durability"] == d)
        for d in DURABILITY
    }
    document = {
        "bench": "store_durability",
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "fsync_delay_ms_added": float(os.environ.get(DELAY_ENV, 0)) / 1000,
        "participants": a.participants,
        "jobs": a.jobs,
        "runs": runs,
        "job_s_median_of_repeats": {d: round(v, 4) for d, v in by.items()},
        "power_loss_over_process_crash": round(by["power-loss"] / by["process-crash"], 2),
    }
    emit_json(document, a.json)


if __name__ == "__main__":
    main()
