"""``spherecal simulate``: a coordinator and N participants on loopback, as
processes, threads or Ray-hosted virtual participants (:mod:`spherecal.engines`;
docs/simulate.md).

Options come from the command line over a ``--config`` TOML ``[simulate]`` table
over the defaults of :class:`~spherecal.simulate.SimulationSettings` (and its
``ReferenceConfig``), so the parser suppresses unset options (:func:`simulate_defaults`
is the one table of defaults). Errors a user can fix print one line and exit
:attr:`~spherecal.cli.exit_codes.ExitCode.BAD_INPUT`; a failed federation exits
:attr:`~spherecal.cli.exit_codes.ExitCode.FAILED` with one line saying why.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from spherecal.cli.exit_codes import ExitCode
from spherecal.cli.options import FEDERATION_OPTIONS, add_federation_options, reference_defaults

__all__ = [
    "HELP",
    "NAME",
    "register",
    "parse_step",
    "run",
    "simulate_defaults",
    "simulation_settings_from",
    "status_line",
]

NAME = "simulate"
HELP = "run a coordinator and N participants as processes on loopback"

#: Options of the engines alone (``spherecal.engines.ray`` needs the ray extra to import).
_ENGINE_DEFAULTS: dict[str, Any] = {
    "engine": "processes",
    "workers": None,
    "worker_cpus": 1.0,
    "ray_address": None,
    "coordinator_host": "127.0.0.1",
}


def simulate_defaults() -> dict[str, Any]:
    """Every ``simulate`` option's default (also every key a ``[simulate]`` table may
    hold), read from :class:`~spherecal.simulate.SimulationSettings`."""
    from spherecal.simulate.settings import SimulationSettings
    from spherecal.spherefed.reference import ReferenceConfig

    s = SimulationSettings(reference=ReferenceConfig(), out=Path())
    return {
        **reference_defaults(s.reference),
        "calibration": ",".join(s.calibration),
        "secure": s.secure_updates and s.secure_statistics,
        "secure_updates": None,
        "secure_statistics": None,
        "threshold": s.threshold,
        "separate_ffc": not s.ffc_from_ccvr,
        "drop": None,
        "corrupt_shares": None,
        "adversary": None,
        "tls": s.tls,
        "threads": s.threads,
        "timeout": s.timeout_s,
        "heartbeat_timeout": s.heartbeat_timeout_s,
        "federated_every": s.federated_every,
        "example_count_noise_sd": s.example_count_noise_sd,
        "update_bound": None,  # None: SimulationSettings' own default
        "update_resolution": None,
        "statistics_bound": None,
        "epsilon": s.epsilon,
        "delta": s.delta,
        "dp_mechanism": s.dp_mechanism,
        "dp_budget": s.dp_budget,
        "dpsgd": s.dpsgd,
        "dpsgd_sigma": s.dpsgd_noise_multiplier,
        "dpsgd_rate": s.dpsgd_sample_rate,
        "dpsgd_clip": s.dpsgd_max_grad_norm,
        "out": None,
        "launcher": s.launcher,
        **_ENGINE_DEFAULTS,
    }


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from spherecal.simulate.launch import LAUNCHERS

    d = simulate_defaults()
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Start one coordinator and N participants as separate OS processes talking "
            "real gRPC on 127.0.0.1, with the data partitioned as the reference runner "
            "does, and write OUT/results.json. Options may also come from --config FILE "
            "(a [simulate] table with the same names, dashes as underscores); command-line "
            "options win. --drop SPEC kills participants with SIGKILL at a stage: "
            "PARTICIPANT:STAGE[@WHEN], comma-separated; STAGE in train, advertise, share, "
            "masked, consistency, unmask; WHEN rN (1-based round), update, ffc, ccvr or "
            "evaluate. Exit "
            "status 0 completed or degraded (one line on stderr says why degraded), 1 "
            "failed (one line on stderr says why) or the harness could not run it."
        ),
    )
    S = argparse.SUPPRESS

    def shown(key: str) -> str:
        return f" (default {d[key]})"

    p.add_argument("--config", type=Path, default=None, help="TOML with a [simulate] table")
    p.add_argument("--out", type=Path, default=S, help="output directory (required)")
    add_federation_options(p, {o.dest: d[o.dest] for o in FEDERATION_OPTIONS}, layered=True)
    p.add_argument(
        "--secure",
        action=argparse.BooleanOptionalAction,
        default=S,
        help="secure aggregation of updates and statistics" + shown("secure"),
    )
    p.add_argument("--secure-updates", action=argparse.BooleanOptionalAction, default=S)
    p.add_argument("--secure-statistics", action=argparse.BooleanOptionalAction, default=S)
    p.add_argument("--threshold", type=int, default=S, help="Shamir threshold t (default majority)")
    p.add_argument(
        "--separate-ffc",
        action="store_true",
        default=S,
        help="run an FFC statistics job even when CCVR is on (default: FFC from CCVR)",
    )
    p.add_argument("--drop", default=S, metavar="SPEC", help="e.g. p3:share,p5:train@r2")
    p.add_argument(
        "--corrupt-shares",
        default=S,
        metavar="IDS",
        help="TEST ONLY: these participants (comma list, e.g. p3) deal shares that fail "
        "authentication in every job; the honest ones complain and the coordinator "
        "excludes them",
    )
    p.add_argument(
        "--adversary",
        default=S,
        metavar="ID:ATTACK[:N]",
        help="TEST ONLY: replace this participant's local computation by an attack "
        "(directions, relabel, replace, blast; e.g. p4:directions:300; "
        "spherecal.participant.adversary)",
    )
    p.add_argument("--tls", action="store_true", default=S, help="mutual TLS with a dev CA")
    p.add_argument(
        "--threads", type=int, default=S, help="torch threads per process" + shown("threads")
    )
    p.add_argument(
        "--timeout", type=float, default=S, help="seconds for the whole run" + shown("timeout")
    )
    p.add_argument(
        "--heartbeat-timeout", type=float, default=S, help="seconds" + shown("heartbeat_timeout")
    )
    p.add_argument("--federated-every", type=int, default=S)
    p.add_argument(
        "--example-count-noise-sd",
        type=int,
        default=S,
        metavar="SD",
        help="noise (examples) on each site's training weight, drawn once per training split, "
        "at the coordinator and every site; 0: exact counts, the reference runner's "
        "weights (a weakening each site logs)" + shown("example_count_noise_sd"),
    )
    p.add_argument(
        "--update-bound",
        type=float,
        default=S,
        help="bound on every update entry (default 0: derived from the algorithm, the "
        "dataset's largest split and [training] max_update_change)",
    )
    p.add_argument(
        "--update-resolution",
        type=_step_argument,
        default=S,
        metavar="STEP",
        help="largest fixed-point step on update entries: the 32-bit ring when the bound "
        "and n allow it, else 64 bits (default 2^-16; 0: always the 64-bit ring); a number "
        "or a power of two, e.g. 2^-16 (= 1.52587890625e-05)",
    )
    p.add_argument("--statistics-bound", type=float, default=S)
    p.add_argument(
        "--epsilon",
        type=float,
        default=S,
        help="DP: target ε per calibration release (adds noise in the ring; default off)",
    )
    p.add_argument("--delta", type=float, default=S, help="DP: δ" + shown("delta"))
    p.add_argument(
        "--dp-mechanism",
        default=S,
        choices=("skellam", "dgauss"),
        help="DP noise" + shown("dp_mechanism"),
    )
    p.add_argument(
        "--dp-budget", type=float, default=S, help="DP: total ε budget of each participant"
    )
    p.add_argument(
        "--dpsgd",
        action="store_true",
        default=S,
        help='train with distributed DP-SGD ([privacy] updates = "distributed"): each round '
        "one noisy step over all sites' data, noise shares added in the ring",
    )
    p.add_argument(
        "--dpsgd-sigma", type=float, default=S, help="distributed DP-SGD: σ" + shown("dpsgd_sigma")
    )
    p.add_argument(
        "--dpsgd-rate", type=float, default=S, help="distributed DP-SGD: q" + shown("dpsgd_rate")
    )
    p.add_argument(
        "--dpsgd-clip", type=float, default=S, help="distributed DP-SGD: C" + shown("dpsgd_clip")
    )
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=S,
        help="--engine processes: how each process starts. forkserver: forked from a "
        "helper that imported torch and the project once; exec: a fresh interpreter "
        "each (about 2 CPU-seconds of imports per process)" + shown("launcher"),
    )
    p.add_argument(
        "--engine",
        choices=("processes", "threads", "ray"),
        default=S,
        help="processes: one OS process per participant; threads: every participant a "
        "virtual participant in this process (one torch import); ray: many virtual "
        "participants per Ray worker (needs the ray extra; docs/scaling.md)" + shown("engine"),
    )
    p.add_argument(
        "--workers", type=int, default=S, help="ray: worker actors (default: one per CPU)"
    )
    p.add_argument(
        "--worker-cpus",
        type=float,
        default=S,
        help="ray: logical CPUs per worker" + shown("worker_cpus"),
    )
    p.add_argument(
        "--ray-address",
        default=S,
        metavar="ADDR",
        help="ray: join this existing cluster (default: start a local Ray instance)",
    )
    p.add_argument(
        "--coordinator-host",
        default=S,
        metavar="HOST",
        help="ray: address the participants dial and the coordinator listens on "
        "(anything but loopback needs --tls)" + shown("coordinator_host"),
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(run=run)


def _simulate_options(args: argparse.Namespace) -> dict[str, Any]:
    import tomllib

    options = simulate_defaults()
    if args.config is not None:
        with open(args.config, "rb") as fh:
            document = tomllib.load(fh)
        table = document.get("simulate")
        if not isinstance(table, dict) or set(document) != {"simulate"}:
            raise ValueError(f"{args.config}: expected exactly one [simulate] table")
        unknown = set(table) - set(options)
        if unknown:
            from spherecal.config_schema import did_you_mean

            raise ValueError(
                f"{args.config}: [simulate] unknown key(s) {sorted(unknown)}"
                f"{did_you_mean(sorted(unknown), options)}"
            )
        options.update(table)
        if "out" in table and table["out"] is not None:
            out = Path(str(table["out"]))
            options["out"] = out if out.is_absolute() else args.config.parent / out
    for key in options:
        if hasattr(args, key):
            options[key] = getattr(args, key)
    if options["out"] is None:
        raise ValueError("--out DIR is required")
    return options


def parse_step(value: Any, name: str = "") -> float:
    """A fixed-point step as written by a person: a number (``1.52587890625e-05``, ``0``)
    or a power of two (``2^-16``, ``2**-16``), from the command line or a TOML
    ``[simulate]`` value. ``ValueError`` (prefixed by ``name``) for anything else, for a
    negative, NaN or infinite step, and for a power of two beyond a float's range."""
    prefix = f"{name}: " if name else ""
    if isinstance(value, bool):
        raise ValueError(
            f"{prefix}expected a number or a power of two such as 2^-16, got {value!r}"
        )
    if isinstance(value, (int, float)):
        step = float(value)
    else:
        text = str(value).strip().replace("**", "^")
        base, caret, exponent = text.partition("^")
        try:
            if caret:
                if base.strip() != "2":
                    raise ValueError
                step = math.ldexp(1.0, int(exponent.strip()))
                if step == 0.0:
                    raise ValueError  # below the smallest float: not a step
            else:
                step = float(text)
        except (ValueError, OverflowError):
            raise ValueError(
                f"{prefix}expected a number or a power of two such as 2^-16, got {value!r}"
            ) from None
    if not (math.isfinite(step) and step >= 0):
        raise ValueError(f"{prefix}must be a non-negative finite step, got {value!r}")
    return step


def _step_argument(text: str) -> float:
    """``--update-resolution``'s type: :func:`parse_step`, its error as argparse's."""
    try:
        return parse_step(text)  # argparse names the option
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _grid(value: Any, default: tuple[float, ...]) -> tuple[float, ...]:
    """A grid option (CLI list or TOML list), or ``default`` when unset."""
    if value is None:
        return default
    return tuple(float(v) for v in value)


def _adversaries(text: Any, ids: tuple[str, ...] | list[str]) -> tuple[tuple[str, str], ...]:
    """``ID:ATTACK[:N]`` (comma list) → ((id, attack spec), …), each spec checked."""
    from spherecal.participant.adversary import parse_adversary

    if not text:
        return ()
    out = []
    for item in (p.strip() for p in str(text).split(",") if p.strip()):
        pid, _, spec = item.partition(":")
        if pid not in ids:
            raise ValueError(f"--adversary: unknown participant {pid!r}")
        parse_adversary(spec)
        out.append((pid, spec))
    return tuple(out)


def _corrupt_ids(text: Any, ids: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    if not text:
        return ()
    chosen = tuple(p.strip() for p in str(text).split(",") if p.strip())
    unknown = sorted(set(chosen) - set(ids))
    if unknown:
        raise ValueError(f"--corrupt-shares: unknown participant(s) {unknown}")
    return chosen


def simulation_settings_from(options: dict[str, Any]) -> Any:
    """The :class:`~spherecal.simulate.SimulationSettings` of merged options."""
    from dataclasses import replace

    from spherecal.simulate import SimulationSettings, parse_drops
    from spherecal.spherefed.calibrate import CCVRConfig
    from spherecal.spherefed.calibration_suite import DEFAULT_RIDGE_GRID, DEFAULT_SHRINKAGE_GRID
    from spherecal.spherefed.reference import ReferenceConfig

    o = options
    alpha_text = str(o["alpha"])
    base = ReferenceConfig()
    if o["shards"] is not None:
        scheme, alpha = "shards", base.alpha
    elif alpha_text.lower() == "iid":
        scheme, alpha = "iid", base.alpha
    else:
        try:
            alpha = float(alpha_text)
        except ValueError:
            raise ValueError(
                f"--alpha must be a positive number or 'iid', got {alpha_text!r}"
            ) from None
        if not alpha > 0:
            raise ValueError("--alpha must be > 0")
        scheme = "dirichlet"
    head = str(o["head"])
    reference = ReferenceConfig(
        dataset=str(o["dataset"]),
        data_root=o["data_root"],
        samples=None if o["samples"] is None else int(o["samples"]),
        participants=int(o["participants"]),
        partition=scheme,
        alpha=alpha,
        shards_per_client=int(o["shards"]) if o["shards"] is not None else base.shards_per_client,
        model=str(o["model"]),
        norm=str(o["norm"]),
        head=head,
        classifier=str(o["classifier"]),
        loss=str(o["loss"] or ("mse" if head == "sphere" else "ce")),
        algorithm=str(o["algorithm"]),
        prox_mu=float(o["prox_mu"]),
        fedopt_lr=float(o["fedopt_lr"]),
        rounds=int(o["rounds"]),
        local_epochs=int(o["local_epochs"]),
        batch_size=int(o["batch_size"]),
        lr=float(o["lr"]),
        sample_fraction=float(o["sample_fraction"]),
        seed=int(o["seed"]),
        ffc_ridge=float(o["ridge"]),
        ccvr=replace(
            CCVRConfig(), virtual_per_class=int(o["ccvr_virtual"]), tukey=bool(o["tukey"])
        ),
        ridge_grid=_grid(o["ridge_grid"], DEFAULT_RIDGE_GRID),
        shrinkage_grid=_grid(o["shrinkage_grid"], DEFAULT_SHRINKAGE_GRID),
    )
    secure = bool(o["secure"])
    ids = tuple(f"p{k}" for k in range(reference.participants))
    extra: dict[str, Any] = {}
    for key in ("update_bound", "statistics_bound"):
        if o[key] is not None:
            extra[key] = float(o[key])
    if o["update_resolution"] is not None:
        extra["update_resolution"] = parse_step(o["update_resolution"], "update_resolution")
    chosen = o["calibration"]  # a list from the command line, a string from TOML
    if isinstance(chosen, str):
        chosen = chosen.split(",")
    calibration = tuple(str(c).strip() for c in chosen if str(c).strip())
    settings = SimulationSettings(
        reference=reference,
        out=Path(o["out"]).resolve(),
        calibration=calibration,
        secure_updates=secure if o["secure_updates"] is None else bool(o["secure_updates"]),
        secure_statistics=secure
        if o["secure_statistics"] is None
        else bool(o["secure_statistics"]),
        drops=parse_drops(o["drop"], ids),
        corrupt_shares=_corrupt_ids(o["corrupt_shares"], ids),
        adversaries=_adversaries(o["adversary"], ids),
        threshold=None if o["threshold"] is None else int(o["threshold"]),
        ffc_from_ccvr=not bool(o["separate_ffc"]),
        threads=int(o["threads"]),
        tls=bool(o["tls"]),
        timeout_s=float(o["timeout"]),
        heartbeat_timeout_s=float(o["heartbeat_timeout"]),
        federated_every=int(o["federated_every"]),
        example_count_noise_sd=int(o["example_count_noise_sd"]),
        epsilon=None if o["epsilon"] is None else float(o["epsilon"]),
        delta=float(o["delta"]),
        dp_mechanism=str(o["dp_mechanism"]),
        dp_budget=None if o["dp_budget"] is None else float(o["dp_budget"]),
        dpsgd=bool(o["dpsgd"]),
        dpsgd_noise_multiplier=float(o["dpsgd_sigma"]),
        dpsgd_sample_rate=float(o["dpsgd_rate"]),
        dpsgd_max_grad_norm=float(o["dpsgd_clip"]),
        launcher=str(o["launcher"]),
        **extra,
    )
    settings.validate()
    return settings


def _engine_runner(options: dict[str, Any]) -> Any:
    """The run function of the chosen engine (``run_simulation``'s signature)."""
    from spherecal.simulate import run_simulation

    engine = str(options["engine"])
    ray_only = ("workers", "ray_address")
    if engine in ("processes", "threads"):
        used = [k for k in ray_only if options[k] is not None]
        if options["coordinator_host"] != "127.0.0.1":
            used.append("coordinator_host")
        if used:
            flags = ", ".join("--" + k.replace("_", "-") for k in used)
            raise ValueError(f"{flags} only apply to --engine ray")
        if engine == "threads":
            from spherecal.engines.threads import run_threads_simulation

            return run_threads_simulation
        return run_simulation
    if engine != "ray":
        raise ValueError(f"--engine must be processes, threads or ray, got {engine!r}")
    try:
        from spherecal.engines.ray import RayEngineSettings, run_ray_simulation
    except ImportError as exc:
        raise ValueError(
            f"--engine ray needs Ray ({exc}); install the extra: pip install -e '.[ray]'"
        ) from None
    chosen = RayEngineSettings(
        workers=None if options["workers"] is None else int(options["workers"]),
        worker_cpus=float(options["worker_cpus"]),
        address=options["ray_address"],
        coordinator_host=str(options["coordinator_host"]),
    )

    def run(settings: Any, progress: Any) -> Any:
        return run_ray_simulation(settings, chosen, progress)

    return run


def run(args: argparse.Namespace) -> int:
    from spherecal.proto.federation_end import SUCCESSFUL_STATUSES
    from spherecal.simulate import SimulationError

    options = _simulate_options(args)
    settings = simulation_settings_from(options)
    run = _engine_runner(options)
    from spherecal.outputs import check_output_dir

    check_output_dir(settings.out, what="--out")  # before any process starts

    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    try:
        results = run(settings, progress)
    except SimulationError as exc:
        print(f"spherecal simulate: error: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    line = status_line(results)
    if line:
        print(line, file=sys.stderr)
    print(
        json.dumps(
            {
                "status": results["status"],
                "status_reasons": results.get("status_reasons", []),
                "accuracy": results["accuracy"],
                "accuracy_covers": results.get("accuracy_covers"),
                "dropped": [
                    f"{d['participant']}@{d['stage']}/{d['job']}" for d in results["dropped"]
                ],
                "errors": results["errors"],
                "warnings": results.get("warnings", []),
                "results": str(settings.out / "results.json"),
            },
            indent=2,
        )
    )
    return ExitCode.OK if results["status"] in SUCCESSFUL_STATUSES else ExitCode.FAILED


def status_line(results: dict[str, Any]) -> str:
    """One line saying why a simulated federation is not ``completed`` ("" if it is)."""
    status = results.get("status")
    if status == "completed":
        return ""
    reasons = results.get("status_reasons") or results.get("errors") or ["no reason recorded"]
    return f"spherecal simulate: federation {status}: " + "; ".join(str(r) for r in reasons)
