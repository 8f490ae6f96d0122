"""How much the timing of each secure-aggregation message says about a participant's
example count (issue #9, "no timing leak of example counts"; statistics jobs since
issue #24's overlapped feature pass).

Runs ``spherecal simulate`` (real processes, real gRPC; Dirichlet α = 0.1 by default
so local training sets differ several-fold; FFC and CCVR as separate statistics jobs
so both are measured), then reads the coordinator's audit table: for every secure
job, each participant's offset from the job's first message of a stage —
advertisement, share answer, first masked chunk, consistency, unmask — against the
participant's local example count (read from its own log: the training split for
update, FFC and CCVR jobs, the test split for evaluation jobs). Prints JSON::

    python bench/timing_channel.py --runs 2
    python bench/timing_channel.py --participants 8 --rounds 1 --runs 6 --min-local-work-s 0 5
    python bench/timing_channel.py --measure KEPT/run0-s0 KEPT/run1-s0   # re-analyse only

``--min-local-work-s A B …`` runs every seed under each participant setting of
``[policy] min_local_work_s``, interleaved (seed 0 under A, seed 0 under B, seed 1 …)
so both see the shared machine's load alike; without it the participants keep what
``spherecal simulate`` writes (``0``: off, the overlapped feature pass on).

Two families of figures:

* ``pooled`` (and each run's ``correlation_with_example_count``): update jobs only,
  the Pearson correlation of the raw offsets of advertisement, share and first masked
  chunk with the example count, over every run's points together — the figures
  ``docs/threat_model.md`` has cited since issue #9, kept as they were.
* ``by_job_kind``: per job purpose and message, the *within-job* correlation (offsets
  and counts centred on each job's mean), its two-sided permutation p-value (counts
  shuffled among each job's sites), a bootstrap interval over jobs, the slope in ms per
  100 examples, and how many jobs and (job, site) points are behind it
  (``spherecal.timing_channel.associate``). One job has 5–10 sites: its figure alone
  is a rough sign, which each entry's ``note`` says.

Expected: advertisement and share offsets carry no example count where they leave
before the local work; the masked upload follows the local work by nature, so its
offsets track the count unless ``min_local_work_s`` holds every input to the same
delay. Measured (``docs/threat_model.md``, "Timing", 2026-11-26): with the default
``0`` an FFC or CCVR job's share answer, computed while the overlapped feature pass
runs, tracks the count too — weakly (r 0.2–0.4) but measurably; with ``5`` no
message of a statistics or evaluation job does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as `python bench/timing_channel.py`: this checkout's
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # spherecal, not another

from bench._rundir import RunDirectory, add_run_directory_option
from spherecal.timing_channel import (
    JOB_MESSAGES,
    MESSAGES,
    Job,
    associate,
    job_offsets,
    job_purposes,
    jobs_of,
    message_offsets,
)

SAMPLES = re.compile(r"trained \d+ steps on (\d+) samples")
SPLITS = re.compile(r"joined federation .*?(\d+) train / (\d+) test")
EVALUATION = "evaluate"  # the job purpose measured against the test split
READING = (
    "by_job_kind: within-job r (values) and rho (ranks) of offsets with example counts, "
    "two-sided permutation p-values; each p is for its figure alone: a setting has 20 "
    "such figures, so one p < 0.05 is expected by chance. A leak is p < 0.01 on both "
    "forms, found again with other seeds; one job of 5-10 sites is a rough sign only."
)


def sample_counts(out: Path) -> dict[str, int]:
    """Each participant's local training example count, from its own log."""
    samples: dict[str, int] = {}
    for log in sorted((out / "logs").glob("p*.log")):
        text = log.read_text()
        found = SAMPLES.search(text) or SPLITS.search(text)
        if found is not None:
            samples[log.stem] = int(found.group(1))
    return samples


def split_test_counts(out: Path) -> dict[str, int]:
    """Each participant's local test-split example count, from its join line."""
    counts: dict[str, int] = {}
    for log in sorted((out / "logs").glob("p*.log")):
        found = SPLITS.search(log.read_text())
        if found is not None:
            counts[log.stem] = int(found.group(2))
    return counts


def pairs(out: Path) -> dict[str, tuple[list[int], list[float]]]:
    """(example counts, offsets) of every measured update-job message in ``out``."""
    samples = sample_counts(out)
    db = out / "coordinator" / "state" / "state.db"
    out_pairs: dict[str, tuple[list[int], list[float]]] = {}
    for name, (stage, kind) in MESSAGES.items():
        xs: list[int] = []
        ys: list[float] = []
        for pid, values in message_offsets(db, stage, kind).items():
            if pid in samples:
                xs.extend([samples[pid]] * len(values))
                ys.extend(values)
        out_pairs[name] = (xs, ys)
    return out_pairs


def correlations(measured: dict[str, tuple[list[int], list[float]]]) -> dict[str, Any]:
    """Pearson correlation of offsets with example counts, and the largest offset."""
    return {
        "correlation_with_example_count": {
            name: float(np.corrcoef(xs, ys)[0, 1]) if len(ys) > 1 and np.std(ys) > 0 else 0.0
            for name, (xs, ys) in measured.items()
        },
        "max_offset_s": {name: float(max(ys, default=0.0)) for name, (_, ys) in measured.items()},
        "points": {name: len(ys) for name, (_, ys) in measured.items()},
    }


def kind_jobs(out: Path) -> dict[str, dict[str, list[Job]]]:
    """Per job purpose and message: each job's (example counts, offsets) in ``out``."""
    db = out / "coordinator" / "state" / "state.db"
    train, test = sample_counts(out), split_test_counts(out)
    found: dict[str, dict[str, list[Job]]] = {}
    for purpose in job_purposes(db):
        counts = test if purpose == EVALUATION else train
        found[purpose] = {
            name: jobs_of(job_offsets(db, stage, kind, purpose=purpose), counts)
            for name, (stage, kind) in JOB_MESSAGES.items()
        }
    return found


def by_job_kind(
    outs: Sequence[Path], *, permutations: int, compact: bool = False
) -> dict[str, dict[str, Any]]:
    """:func:`spherecal.timing_channel.associate` per purpose and message over every
    job of ``outs`` (``compact``: only r, p and points, for one run's entry)."""
    together: dict[str, dict[str, list[Job]]] = {}
    for out in outs:
        for purpose, messages in kind_jobs(out).items():
            for name, jobs in messages.items():
                together.setdefault(purpose, {}).setdefault(name, []).extend(jobs)
    report: dict[str, dict[str, Any]] = {}
    for purpose, messages in sorted(together.items()):
        report[purpose] = {}
        for name, jobs in messages.items():
            a = associate(jobs, permutations=permutations)
            report[purpose][name] = (
                {"r": round(a.correlation, 3), "p": round(a.p_value, 4), "points": a.points}
                if compact
                else a.to_json()
            )
    return report


def held_setting(out: Path) -> float | None:
    """``[policy] min_local_work_s`` as written in the first participant's config."""
    configs = sorted((out / "participants").glob("p*.toml"))
    if not configs:
        return None
    policy = tomllib.loads(configs[0].read_text()).get("policy", {})
    return float(policy["min_local_work_s"]) if "min_local_work_s" in policy else None


def measure(out: Path, *, permutations: int = 10_000) -> dict[str, Any]:
    """The figures of one finished simulation in ``out``."""
    return {
        **correlations(pairs(out)),
        "samples": sample_counts(out),
        "test_samples": split_test_counts(out),
        "min_local_work_s": held_setting(out),
        "by_job_kind": by_job_kind([out], permutations=permutations, compact=True),
    }


def pooled(outs: Sequence[Path]) -> dict[str, Any]:
    """The correlation over every run's (example count, offset) pairs together: 5
    participants give 5 distinct counts per run, too few for one run's figure to be
    more than a rough sign."""
    together: dict[str, tuple[list[int], list[float]]] = {n: ([], []) for n in MESSAGES}
    for out in outs:
        for name, (xs, ys) in pairs(out).items():
            together[name][0].extend(xs)
            together[name][1].extend(ys)
    return correlations(together)


def summary(outs: Sequence[Path], *, permutations: int) -> dict[str, Any]:
    """The pooled update figures and the per-kind figures of one setting's runs."""
    return {
        "runs": len(outs),
        "pooled": pooled(outs),
        "by_job_kind": by_job_kind(outs, permutations=permutations),
    }


def simulation_factory(min_local_work_s: float | None) -> Callable[..., Any]:
    """``run_simulation``'s factory: the processes of ``spherecal simulate``, each
    participant's ``[policy] min_local_work_s`` set to the value (None: as written)."""
    from spherecal.simulate import Simulation
    from spherecal.simulate.configs import write_toml

    if min_local_work_s is None:
        return Simulation
    held = float(min_local_work_s)

    class HeldTiming(Simulation):
        def participant_config(self, k: int, port: int) -> Path:
            path = super().participant_config(k, port)
            document = tomllib.loads(path.read_text())
            document.setdefault("policy", {})["min_local_work_s"] = held
            return write_toml(path, document)

    return HeldTiming


def simulate(args: argparse.Namespace, seed: int, held: float | None, out: Path) -> str:
    """One simulated federation into ``out``; its status (``completed``, …, or
    ``error: …``)."""
    from spherecal.cli.simulate import simulate_defaults, simulation_settings_from
    from spherecal.simulate import SimulationError, run_simulation

    options = simulate_defaults() | {
        "participants": args.participants,
        "rounds": args.rounds,
        "calibration": args.calibration,
        "separate_ffc": not args.ffc_from_ccvr,
        "model": args.model,
        "alpha": args.alpha,
        "secure": True,
        "seed": seed,
        "out": out,
    }
    settings = simulation_settings_from(options)
    try:
        results = run_simulation(settings, factory=simulation_factory(held))
    except SimulationError as exc:
        return f"error: {exc}"
    return str(results["status"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/timing_channel.py",
        description="Correlation of secure-aggregation message timing with example counts.",
    )
    parser.add_argument("--participants", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calibration", default="ffc,ccvr")
    parser.add_argument(
        "--ffc-from-ccvr",
        action="store_true",
        help="FFC from the CCVR sums (one statistics job) instead of its own FFC job",
    )
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--alpha", default="0.1")
    parser.add_argument("--runs", type=int, default=1, help="independent simulations (seeds)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--min-local-work-s",
        type=float,
        nargs="+",
        help="participants' [policy] min_local_work_s; several values: each seed under "
        "each, interleaved (default: as spherecal simulate writes it)",
    )
    parser.add_argument("--permutations", type=int, default=10_000)
    add_run_directory_option(parser, "--keep", kept_when="a run failed", purpose=", for --measure")
    parser.add_argument(
        "--measure", type=Path, nargs="+", help="only analyse these kept simulation outputs"
    )
    args = parser.parse_args(argv)
    if args.measure:
        done = [d for d in args.measure if (d / "results.json").exists()]
        analysed = [{"out": str(d), **measure(d, permutations=args.permutations)} for d in done]
        groups: dict[float | None, list[Path]] = {}
        for d in done:
            groups.setdefault(held_setting(d), []).append(d)
        print(
            json.dumps(
                {
                    "reading": READING,
                    "runs": analysed,
                    "pooled": pooled(done),
                    "by_setting": [
                        {"min_local_work_s": s, **summary(ds, permutations=args.permutations)}
                        for s, ds in groups.items()
                    ],
                },
                indent=2,
            )
        )
        return 0
    settings: list[float | None] = list(args.min_local_work_s or [None])
    run_dir = RunDirectory(args.keep, prefix="timing-channel-")
    with run_dir as root:
        runs: list[dict[str, Any]] = []
        outs: dict[float | None, list[Path]] = {s: [] for s in settings}
        for k in range(args.runs):
            seed = args.first_seed + k
            for held in settings:
                out = root / (f"run{k}" if held is None else f"run{k}-s{held:g}")
                load = os.getloadavg()[0]
                t0 = time.monotonic()
                status = simulate(args, seed, held, out)
                ok = status in ("completed", "degraded")
                entry: dict[str, Any] = {
                    "exit": 0 if ok else 1,
                    "status": status,
                    "seed": seed,
                    "out": str(out),
                    "wall_s": round(time.monotonic() - t0, 1),
                    "load_1min": [load, os.getloadavg()[0]],
                }
                if ok:
                    outs[held].append(out)
                    entry |= measure(out, permutations=args.permutations)
                else:
                    run_dir.keep(f"seed {seed} ended {status}")
                runs.append(entry)
                say = f"[timing_channel] seed {seed} min_local_work_s={held}: {status}"
                print(say, file=sys.stderr)
        by_setting = [  # the value the participants ran with (None: no run finished)
            {
                "min_local_work_s": held_setting(outs[held][0]) if outs[held] else held,
                **summary(outs[held], permutations=args.permutations),
            }
            for held in settings
        ]
    if run_dir.kept_path() is None:  # the outputs are gone: name none of them
        for entry in runs:
            entry.pop("out", None)
    report: dict[str, Any] = {
        "args": vars(args) | {"keep": str(args.keep) if args.keep else None},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "load_average": os.getloadavg(),
        "reading": READING,
        "example_count": {
            "update, ffc, ccvr": "training split",
            EVALUATION: "test split (calibrators with a grid, ffc_bias, lda, qda, add "
            "validation-split evaluations, measured against the same count)",
        },
        "runs": runs,
        "pooled": by_setting[0]["pooled"],
        "by_job_kind": by_setting[0]["by_job_kind"],
        "by_setting": by_setting,
    }
    print(json.dumps(report, indent=2))
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
