"""``spherecal experiment``: every method of the papers side by side
(:mod:`spherecal.experiment`; docs/baselines.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spherecal.argtypes import DefaultsHelpFormatter, alpha_or_iid, positive_float
from spherecal.argtypes import positive_int as _positive_int
from spherecal.cli.exit_codes import ExitCode
from spherecal.cli.options import add_federation_options

if TYPE_CHECKING:
    from spherecal.experiment.grid import ExperimentSettings
    from spherecal.experiment.privacy import PrivacySettings

__all__ = ["HELP", "NAME", "privacy_settings_from_args", "register", "run", "settings_from_args"]

NAME = "experiment"
HELP = "compare every method of the papers (baselines, rival fixes, ablations)"


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    from spherecal.experiment.grid import ENGINES, HOSTINGS, QUICK_LR_GRID, QUICK_OVERRIDES, TABLES
    from spherecal.experiment.grid import ExperimentSettings as Settings
    from spherecal.spherefed.algorithms.methods import DEFAULT_LR_GRID
    from spherecal.spherefed.data import SyntheticConfig

    d = Settings()
    s = SyntheticConfig()
    p = subparsers.add_parser(
        NAME,
        help=HELP,
        description=(
            "Train every method of the chosen table on every partition column, seed and "
            "learning rate (tuned on the validation split), calibrate each with CCVR and "
            "FFC, and write DIR/table.md (mean ± std, best per column in bold), "
            "DIR/results.json and PNG plots. Finished runs are stored in DIR/cells/ and "
            "skipped when the command is run again (resumable)."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "--table",
        required=True,
        choices=(*TABLES, "privacy"),
        help="privacy: DP-SGD (local, distributed, central) at record-level ε and every DP "
        "calibrator at ε per release (mnist1d by default; docs/baselines/privacy/)",
    )
    add_federation_options(
        p,
        {"dataset": None, "data_root": d.data_root, "samples": d.samples},
        overrides={"dataset": {"help": f"dataset (default {d.dataset}; privacy: mnist1d)"}},
    )
    p.add_argument(
        "--alpha",
        type=alpha_or_iid,
        nargs="+",
        default=None,
        help="Dirichlet α columns and/or 'iid' (default: 0.1 0.5 iid; none if only "
        "--shards is given)",
    )
    p.add_argument("--shards", type=_positive_int, nargs="+", default=[], help="shard columns")
    p.add_argument(
        "--seeds", type=_positive_int, default=None, help=f"seeds 0..N-1 (default {d.seeds})"
    )
    p.add_argument(
        "--lr-grid",
        type=positive_float,
        nargs="+",
        default=None,
        help="the learning-rate grid every method is tuned over (default "
        f"{' '.join(f'{x:g}' for x in DEFAULT_LR_GRID)}; with --quick "
        f"{' '.join(f'{x:g}' for x in QUICK_LR_GRID)})",
    )
    p.add_argument("--methods", nargs="+", default=None, help="only these methods (keys)")
    add_federation_options(
        p,
        {
            "participants": d.participants,
            "rounds": None,  # the table's (or --quick's) rounds unless given
            "local_epochs": d.local_epochs,
            "batch_size": d.batch_size,
            "model": d.model,
            "fedopt_lr": d.fedopt_lr,
        },
        overrides={
            "rounds": {
                "help": f"federated rounds (default {d.rounds}; with --quick "
                f"{QUICK_OVERRIDES['rounds']})"
            }
        },
    )
    p.add_argument("--synthetic-classes", type=_positive_int, default=s.num_classes)
    p.add_argument("--synthetic-dim", type=_positive_int, default=s.dim)
    p.add_argument("--synthetic-per-class", type=_positive_int, default=s.train_per_class)
    p.add_argument("--synthetic-noise", type=float, default=s.noise)
    p.add_argument(
        "--feature-shift",
        type=float,
        default=s.feature_shift,
        help="synthetic: norm of each participant's private feature offset",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1 seed, 15 rounds, 3-point lr grid (unless given explicitly)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default=d.engine,
        help="inprocess: the reference runner in one process; service: every cell a real "
        "federation (a coordinator process and the participants on loopback, secure "
        "aggregation on; see --hosting); methods the service cannot run are listed as "
        "skipped",
    )
    p.add_argument(
        "--hosting",
        choices=HOSTINGS,
        default=d.hosting,
        help="--engine service: where each cell's participants run — threads: virtual "
        "participants in the cell's process (own identity key and gRPC connection each); "
        "processes: one OS process each. Same numbers; cells are reused across both",
    )
    p.add_argument(
        "--secure-sum",
        action="store_true",
        help="inprocess engine: sum the calibration statistics through the real "
        "secure-aggregation protocol at the service's fixed-point scale (pairwise masks, "
        "Shamir shares; only the network is missing) instead of in float64",
    )
    p.add_argument("--workers", type=_positive_int, default=1, help="parallel cell processes")
    p.add_argument(
        "--ray",
        action="store_true",
        help="run the cells as Ray tasks (a local Ray instance; needs the ray extra; "
        "docs/scaling.md) instead of --workers processes; still cached in --cells",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --ray: the Ray cluster to run the cells on (implies --ray)",
    )
    p.add_argument(
        "--threads", type=_positive_int, default=1, help="torch/BLAS threads per process"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--cells",
        type=Path,
        default=None,
        help="where finished runs are stored (default OUT/cells); share it between tables "
        "to reuse their common runs",
    )
    p.add_argument(
        "--dpsgd-steps",
        type=_positive_int,
        default=None,
        help="privacy: DP-SGD steps T (default 104; with --quick 3)",
    )
    p.add_argument(
        "--local-rounds",
        type=_positive_int,
        default=None,
        help="privacy: FedAvg rounds of local DP-SGD, one epoch each (default 10; with "
        "--quick 1)",
    )
    p.add_argument(
        "--epsilons",
        type=positive_float,
        nargs="+",
        default=None,
        help="privacy: record-level ε of DP-SGD training (default 1 4 8)",
    )
    p.add_argument(
        "--release-epsilons",
        type=positive_float,
        nargs="+",
        default=None,
        help="privacy: ε per calibration release (default 1 4 16)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(run=run)
    return p


def settings_from_args(args: argparse.Namespace) -> ExperimentSettings:
    """The :class:`~spherecal.experiment.grid.ExperimentSettings` the arguments ask for."""
    from spherecal.experiment.grid import QUICK_OVERRIDES, ExperimentSettings
    from spherecal.spherefed.data import SyntheticConfig

    alphas: tuple[float | str, ...]
    if args.alpha is not None:
        alphas = tuple(args.alpha)
    elif args.shards:
        alphas = ()
    else:
        alphas = ExperimentSettings().alphas
    d = ExperimentSettings()
    quick: dict[str, Any] = QUICK_OVERRIDES if args.quick else {}
    rounds = args.rounds if args.rounds is not None else quick.get("rounds", d.rounds)
    seeds = args.seeds if args.seeds is not None else quick.get("seeds", d.seeds)
    return ExperimentSettings(
        table=args.table,
        dataset=args.dataset if args.dataset is not None else d.dataset,
        data_root=args.data_root,
        samples=args.samples,
        alphas=alphas,
        shards=tuple(args.shards),
        seeds=seeds,
        participants=args.participants,
        rounds=rounds,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        model=args.model,
        lr_grid=tuple(args.lr_grid) if args.lr_grid is not None else quick.get("lr_grid"),
        methods=None if args.methods is None else tuple(args.methods),
        fedopt_lr=args.fedopt_lr,
        synthetic=SyntheticConfig(
            num_classes=args.synthetic_classes,
            dim=args.synthetic_dim,
            train_per_class=args.synthetic_per_class,
            noise=args.synthetic_noise,
            feature_shift=args.feature_shift,
        ),
        quick=bool(args.quick),
        engine=args.engine,
        hosting=args.hosting,
        secure_sum=bool(args.secure_sum),
    )


def privacy_settings_from_args(args: argparse.Namespace) -> PrivacySettings:
    """The privacy table's settings the arguments ask for (``--alpha``: its first
    value; ``--rounds``: the calibrated FedAvg model's rounds)."""
    from dataclasses import replace

    from spherecal.experiment.privacy import QUICK_PRIVACY, PrivacySettings

    s = PrivacySettings()
    if args.quick:
        s = replace(s, **QUICK_PRIVACY)
    given: dict[str, Any] = {"participants": args.participants, "samples": args.samples}
    if args.dataset is not None:
        given["dataset"] = args.dataset
    if args.alpha:
        if isinstance(args.alpha[0], str):
            raise ValueError("--table privacy takes a Dirichlet --alpha, not iid")
        given["alpha"] = float(args.alpha[0])
    if args.seeds is not None:
        given["seeds"] = args.seeds
    if args.rounds is not None:
        given["calibration_rounds"] = args.rounds
    if args.dpsgd_steps is not None:
        given["steps"] = args.dpsgd_steps
    if args.local_rounds is not None:
        given["local_rounds"] = args.local_rounds
    if args.epsilons is not None:
        given["epsilons"] = tuple(args.epsilons)
    if args.release_epsilons is not None:
        given["release_epsilons"] = tuple(args.release_epsilons)
    return replace(s, **given)


def _privacy_command(s: PrivacySettings, out: str) -> str:
    parts = [
        "spherecal experiment --table privacy",
        f"--dataset {s.dataset}",
        *([f"--samples {s.samples}"] if s.samples is not None else []),
        f"--alpha {s.alpha:g}",
        f"--seeds {s.seeds}",
        f"--participants {s.participants}",
        f"--rounds {s.calibration_rounds}",
        f"--dpsgd-steps {s.steps}",
        f"--local-rounds {s.local_rounds}",
        "--epsilons " + " ".join(f"{e:g}" for e in s.epsilons),
        "--release-epsilons " + " ".join(f"{e:g}" for e in s.release_epsilons),
        f"--out {out}",
    ]
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    import torch

    from spherecal.experiment.cells import limit_blas
    from spherecal.experiment.report import command_line
    from spherecal.experiment.run import run_experiment

    torch.set_num_threads(args.threads)
    limit_blas(args.threads)

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[experiment] {msg}", file=sys.stderr, flush=True)

    if args.table == "privacy":
        from spherecal.experiment.privacy_report import run_privacy_table

        psettings = privacy_settings_from_args(args)
        run_privacy_table(
            psettings,
            args.out,
            workers=args.workers,
            threads=args.threads,
            command=_privacy_command(psettings, str(args.out)),
            progress=progress,
            plots=not args.no_plots,
            cells_dir=args.cells,
        )
        print((args.out / "table.md").read_text())
        return ExitCode.OK
    settings = settings_from_args(args)

    command = command_line(settings, out=str(args.out))
    report = run_experiment(
        settings,
        args.out,
        workers=args.workers,
        threads=args.threads,
        ray=bool(args.ray or args.ray_address),
        ray_address=args.ray_address,
        command=command,
        progress=progress,
        plots=not args.no_plots,
        cells_dir=args.cells,
    )
    print((args.out / "table.md").read_text())
    return ExitCode.OK if report["rows"] else ExitCode.FAILED
