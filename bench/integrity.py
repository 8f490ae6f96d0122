"""One dishonest site vs the integrity checks, and honest runs' false alarms (issue #22).

Runs ``spherecal simulate --participants 5 --rounds 2`` (digits, real processes over
gRPC) once per row of issue #22's attack table with p4's local computation replaced
(``--adversary p4:ATTACK``, ``spherecal.participant.adversary``), and/or honest runs
over several seeds, and prints one JSON document: per run the status, its reasons,
the federated test accuracies of the shipped heads, the validation accuracies, the
integrity checks that failed, the gate's rejections, and ``spherecal audit``'s verdict.

    PYTHONPATH=. python bench/integrity.py --attacks            # the attack table
    PYTHONPATH=. python bench/integrity.py --seeds 10           # honest false alarms
    PYTHONPATH=. python bench/integrity.py --attacks --set max_examples_per_site=1000

``--set KEY=VALUE`` adds ``[federation]`` keys of the coordinator (integers, floats,
booleans or strings) to every run, to measure how a tighter bound caps an attack.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/integrity.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._rundir import RunDirectory, add_run_directory_option

ATTACKS = (
    "directions:100000",  # 10⁵ fake examples per class at the classifier directions
    "relabel:100000",  # the same plus its own features relabelled, 10⁵
    "relabel:300",  # the same at 300 per class
    "blast:100000",  # an update of ±0.9·bound per entry claiming weight 10⁵
    "blast:302",  # the same claiming p4's honest weight (302 examples)
    "replace",  # fake statistics with p4's honest count
)


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def run_one(
    out: Path, *, seed: int, adversary: str | None, extra: dict[str, Any]
) -> dict[str, Any]:
    from spherecal.audit import run_audit
    from spherecal.cli.simulate import simulate_defaults, simulation_settings_from
    from spherecal.simulate import run_simulation

    options = {
        **simulate_defaults(),
        "participants": 5,
        "rounds": 2,
        "seed": seed,
        "out": str(out),
        "adversary": f"p4:{adversary}" if adversary else None,
    }
    settings = simulation_settings_from(options)
    if extra:
        settings = replace(settings, extra_coordinator={"federation": dict(extra)})
    t0 = time.monotonic()
    results = dict[str, Any](run_simulation(settings, progress=lambda _line: None))
    wall = time.monotonic() - t0
    audit = run_audit(out, out=out / "audit.json")
    integrity = results.get("integrity") or {}
    return {
        "seed": seed,
        "adversary": adversary,
        "status": results["status"],
        "status_reasons": results["status_reasons"],
        "accuracy": results["accuracy"],
        "validation_accuracy": results.get("validation_accuracy"),
        "statistics_samples": {k: v.get("samples") for k, v in results["statistics"].items()},
        "round_weights": [r.get("weight") for r in results["per_round"]],
        "failed_checks": [c for c in integrity.get("checks", []) if not c["passed"]],
        "gate": integrity.get("gate", {}),
        "audit": "PASS" if audit["ok"] else "FAIL",
        "wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attacks", action="store_true", help="run the attack table")
    p.add_argument("--only", default=None, help="comma list of attacks (default: the table)")
    p.add_argument("--seeds", type=int, default=0, help="honest runs with seeds 0..N-1")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    add_run_directory_option(p, "--keep", kept_when="an honest run raised a false alarm")
    args = p.parse_args(argv)
    extra = {k: _value(v) for k, _, v in (s.partition("=") for s in args.set)}
    runs: list[dict[str, Any]] = []
    attacks = args.only.split(",") if args.only else list(ATTACKS) if args.attacks else []
    run_dir = RunDirectory(args.keep, prefix="spherecal-integrity-")
    with run_dir as base:
        for attack in attacks:
            out = base / f"attack-{attack.replace(':', '-')}"
            runs.append(run_one(out, seed=0, adversary=attack, extra=extra))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        for seed in range(args.seeds):
            out = base / f"honest-{seed}"
            runs.append(run_one(out, seed=seed, adversary=None, extra=extra))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            if runs[-1]["status"] != "completed" or runs[-1]["audit"] != "PASS":
                run_dir.keep(f"honest run {seed} raised a false alarm")
    honest = [r for r in runs if r["adversary"] is None]
    report = {
        "bench": "integrity",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_at_end": os.getloadavg(),
        },
        "federation": {"participants": 5, "rounds": 2, "dataset": "digits", **extra},
        "runs": runs,
        "honest_false_alarms": sum(
            1 for r in honest if r["status"] != "completed" or r["audit"] != "PASS"
        ),
        "honest_runs": len(honest),
    }
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
