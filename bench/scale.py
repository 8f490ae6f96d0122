"""How the service scales with the number of participants (``--engine ray``).

For each participant count n: one ``spherecal simulate --engine ray`` federation —
digits (IID split: 1,000 participants leave ~1 training sample each, too few for a
Dirichlet split), the small MLP, 2 rounds with secure aggregation of the updates,
then FFC through secure aggregation — with one coordinator process, measured from
outside:

``coordinator_cpu_s``   user+system CPU seconds of the coordinator process (exact:
                        ``getrusage(RUSAGE_CHILDREN)`` around its exit); also its CPU
                        when it started listening (start-up: imports, test data) and
                        when all had joined (polled ``/proc/<pid>/stat``)
``coordinator_kernel_share``  the part of that CPU spent in the kernel (``ru_stime``)
``coordinator_peak_rss_mb``  its ``VmHWM`` (``/proc/<pid>/status``, polled)
``coordinator_peak_threads`` its peak thread count (same poll)
``phases_s``            seconds from the start until: the coordinator listens, the
                        Ray workers host their participants, all have joined, the
                        last round, the FFC job and the evaluation are done
``secagg``              per secure job: graph, stage wall times; the protocol's wall
                        time (stages after advertise, which also waits for training)
                        per participant and job
``per_participant``     coordinator CPU ms and RSS kB per participant, CPU ms per
                        participant-job (2 update jobs + 1 FFC job), with and without
                        its start-up

Prints one JSON document (also to ``--json``); ``--plot PNG`` draws the cost per
participant against n. Usage::

    python bench/scale.py --participants 10,100 --json out/scale.json --plot out/scale.png
    python bench/scale.py --participants 1000 --json out/scale.json --merge --plot out/scale.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/scale.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import emit_json
from bench._rundir import RunDirectory, add_run_directory_option
from spherecal.engines.ray import RayEngineSettings, RaySimulation
from spherecal.simulate import (
    Progress,
    Simulation,
    SimulationError,
    SimulationSettings,
    run_simulation,
)
from spherecal.spherefed.reference import ReferenceConfig

PHASES = {
    "coordinator_listening": "listening on",
    "workers_started": "virtual participants on",
    "all_joined": "participants joined",
    "rounds_done": "round {rounds}/{rounds}: *updates",  # not "round 2/2: training"
    "ffc_done": "ffc job *aggregated",
    "evaluated": "federated accuracy",
}
"""Progress-line needles; ``*`` separates parts that must appear in this order."""


def _matches(needle: str, line: str) -> bool:
    at = 0
    for part in needle.split("*"):
        found = line.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return True


def _cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Monitor:
    """Polls a process's VmHWM and thread count until it exits."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        self.pid = pid
        self.peak_rss_kb = 0
        self.peak_threads = 0
        self.cpu_s = 0.0
        """Latest user+system CPU seconds (``/proc/<pid>/stat``)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True)
        self._thread.start()

    def _loop(self, every_s: float) -> None:
        path = Path(f"/proc/{self.pid}/status")
        stat = Path(f"/proc/{self.pid}/stat")
        ticks = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            try:
                text = path.read_text()
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                return
            self.cpu_s = (int(fields[11]) + int(fields[12])) / ticks
            for line in text.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_kb = max(self.peak_rss_kb, int(line.split()[1]))
                elif line.startswith("Threads:"):
                    self.peak_threads = max(self.peak_threads, int(line.split()[1]))
            self._stop.wait(every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _Measured(RaySimulation):
    """The ray simulation with the coordinator measured."""

    monitor: _Monitor | None = None
    coordinator_cpu_s: float | None = None
    coordinator_system_s: float | None = None
    """Its kernel-mode share of ``coordinator_cpu_s`` (``ru_stime``)."""
    startup_cpu_s: float = 0.0
    """Its CPU when it started listening (imports, test data)."""

    def start_coordinator(
        self, listen: str = "127.0.0.1:0", timeout: float = 120.0, *, halt: str | None = None
    ) -> int:
        port = super().start_coordinator(listen, timeout, halt=halt)
        assert self.coordinator is not None
        self.monitor = _Monitor(self.coordinator.popen.pid)
        self.startup_cpu_s = _cpu_seconds(self.coordinator.popen.pid)
        return port

    def wait_coordinator(self, timeout: float) -> int:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        code = super().wait_coordinator(timeout)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.coordinator_cpu_s = (after.ru_utime - before.ru_utime) + (
            after.ru_stime - before.ru_stime
        )
        self.coordinator_system_s = after.ru_stime - before.ru_stime
        if self.monitor is not None:
            self.monitor.stop()
        return code


def measure(n: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    settings = SimulationSettings(
        reference=ReferenceConfig(
            participants=n, model="mlp", rounds=args.rounds, partition="iid", seed=args.seed
        ),
        out=out,
        # a fresh interpreter per process: its CPU and memory are measured from here
        # (getrusage of our children, /proc/<pid>), which needs it to be our child
        launcher="exec",
        calibration=("ffc",),
        timeout_s=args.timeout,  # stage, round and join timeouts: `spherecal simulate`'s
    )
    engine = RayEngineSettings(
        workers=args.workers, worker_cpus=args.worker_cpus, address=args.ray_address
    )
    t0 = time.monotonic()
    marks: dict[str, float] = {}

    needles = {k: v.format(rounds=args.rounds) for k, v in PHASES.items()}
    holder: dict[str, _Measured] = {}

    cpu_marks: dict[str, float] = {}

    def progress(line: str) -> None:
        sim = holder.get("sim")
        if sim is not None and sim.monitor is not None:
            for phase in ("all_joined",):
                if phase not in cpu_marks and _matches(needles[phase], line):
                    cpu_marks[phase] = sim.monitor.cpu_s
        for phase, needle in needles.items():
            if phase not in marks and _matches(needle, line):
                marks[phase] = time.monotonic() - t0
        if args.verbose:
            print(line, file=sys.stderr, flush=True)

    def factory(s: SimulationSettings, p: Progress) -> Simulation:
        holder["sim"] = _Measured(s, engine, p)
        return holder["sim"]

    try:
        results = run_simulation(settings, progress, factory=factory)
    except SimulationError as exc:  # report what broke, with what was measured so far
        sim = holder.get("sim")
        monitor = sim.monitor if sim is not None else None
        return {
            "participants": n,
            "status": "error",
            "errors": [str(exc)],
            "wall_s": round(time.monotonic() - t0, 2),
            "phases_s": {phase: round(marks[phase], 2) for phase in PHASES if phase in marks},
            "coordinator_peak_rss_mb": round(monitor.peak_rss_kb / 1024, 1) if monitor else None,
            "coordinator_peak_threads": monitor.peak_threads if monitor else None,
            "out": str(out),
        }
    wall = time.monotonic() - t0
    sim = holder["sim"]
    monitor = sim.monitor
    cpu = sim.coordinator_cpu_s or 0.0
    rss_kb = monitor.peak_rss_kb if monitor else 0
    jobs = [j for j in results["jobs"] if j["status"] == "done"]
    secagg_s = sum(sum(j["stage_seconds"].values()) for j in jobs)
    # The advertise stage also waits for local training (an update job's inputs are
    # computed then); the stages after it are the protocol alone.
    protocol_s = sum(v for j in jobs for k, v in j["stage_seconds"].items() if k != "advertise")
    phases = {phase: round(marks[phase], 2) for phase in PHASES if phase in marks}
    participant_jobs = sum(len(j["participants"]) for j in jobs)
    startup_cpu = sim.startup_cpu_s
    return {
        "participants": n,
        "status": results["status"],
        "errors": results["errors"],
        "accuracy": results["accuracy"],
        "wall_s": round(wall, 2),
        "phases_s": phases,
        "round_s": [r["seconds"] for r in results["per_round"]],
        "coordinator_cpu_s": round(cpu, 2),
        "coordinator_kernel_share": (
            round(sim.coordinator_system_s / cpu, 3)
            if cpu and sim.coordinator_system_s is not None
            else None
        ),
        "coordinator_cpu_at_listening_s": round(sim.startup_cpu_s, 2),
        "coordinator_cpu_at_all_joined_s": round(cpu_marks.get("all_joined", 0.0), 2),
        "coordinator_peak_rss_mb": round(rss_kb / 1024, 1),
        "coordinator_peak_threads": monitor.peak_threads if monitor else None,
        "secagg": {
            "jobs": [
                {
                    "purpose": j["purpose"],
                    "round": j["round"],
                    "graph": j["graph"],
                    "participants": len(j["participants"]),
                    "threshold": j["threshold"],
                    "vector_length": j["vector_length"],
                    "stage_s": {k: round(v, 3) for k, v in j["stage_seconds"].items()},
                }
                for j in jobs
            ],
            "wall_s": round(secagg_s, 3),
            "protocol_wall_s": round(protocol_s, 3),
            "protocol_ms_per_participant_job": round(
                1000 * protocol_s / max(1, participant_jobs), 3
            ),
        },
        "per_participant": {
            "coordinator_cpu_ms": round(1000 * cpu / n, 3),
            "coordinator_cpu_ms_per_job": round(1000 * cpu / max(1, participant_jobs), 3),
            "coordinator_serving_cpu_ms_per_job": round(
                1000 * (cpu - startup_cpu) / max(1, participant_jobs), 3
            ),
            "coordinator_rss_kb": round(rss_kb / n, 1),
        },
        "engine": results.get("engine"),
        "out": str(out),
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "completed"]
    ns = [r["participants"] for r in ok]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(
        ns,
        [r["per_participant"]["coordinator_serving_cpu_ms_per_job"] for r in ok],
        "o-",
        label="coordinator CPU after start-up per participant-job (ms)",
    )
    ax.plot(
        ns,
        [r["secagg"]["protocol_ms_per_participant_job"] for r in ok],
        "s--",
        label="secure aggregation (share..unmask) wall per participant-job (ms)",
    )
    if ok:
        base = ok[0]["secagg"]["protocol_ms_per_participant_job"]
        n0 = ns[0]
        ax.plot(
            ns,
            [base * math.log2(n) / math.log2(n0) for n in ns],
            ":",
            color="grey",
            label="∝ log n (through the first point)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("participants n")
    ax.set_ylabel("ms")
    ax.set_title("spherecal: cost per participant vs n (2 secure rounds + FFC)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--participants", default="10,100", help="comma list (10,100,300,1000)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None, help="Ray workers (default: CPUs)")
    parser.add_argument("--worker-cpus", type=float, default=1.0)
    parser.add_argument("--ray-address", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0)
    add_run_directory_option(parser, "--out", kept_when="a run failed")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the runs already in --json for other participant counts",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.participants.split(",") if x.strip()]
    rows = []
    run_dir = RunDirectory(args.out, prefix="spherecal-scale-")
    with run_dir as base:
        for n in counts:
            row = measure(n, base / f"n{n}", args)
            rows.append(row)
            keys = ("participants", "status", "wall_s", "phases_s", "errors")
            print(json.dumps({k: row.get(k) for k in keys}), file=sys.stderr, flush=True)
            if row["status"] != "completed":
                run_dir.keep(f"the run of {n} participants ended {row['status']}")
    if run_dir.kept_path() is None:  # the runs' folders are gone: name none of them
        for row in rows:
            row.pop("out", None)
    extra: dict[str, Any] = {}
    if args.merge and args.json and args.json.exists():
        previous = json.loads(args.json.read_text())
        kept = previous["runs"]
        rows = sorted(
            [r for r in kept if r["participants"] not in counts] + rows,
            key=lambda r: int(r["participants"]),
        )
        # Runs this one replaces are kept, not lost: earlier code's numbers are the
        # "before" of whatever changed since.
        replaced = [r for r in kept if r["participants"] in counts]
        extra = {k: v for k, v in previous.items() if k not in ("runs", "machine", "settings")}
        extra["earlier_runs"] = [*previous.get("earlier_runs", []), *replaced]
    document = {
        "benchmark": "scale",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "settings": {
            "dataset": "digits",
            "partition": "iid",
            "model": "mlp",
            "rounds": args.rounds,
            "calibration": "ffc",
            "secure": True,
            "workers": args.workers,
            "worker_cpus": args.worker_cpus,
        },
        "runs": rows,
        **{k: v for k, v in extra.items() if k != "benchmark"},
    }
    emit_json(document, args.json)
    if args.plot:
        plot(rows, args.plot)
    return 0 if all(r["status"] == "completed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
