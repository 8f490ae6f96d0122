"""``spherecal reference``: the deterministic in-process reference federation (no
network) — trains, calibrates, compares with the oracle, reports JSON
(docs/reference.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spherecal.argtypes import DefaultsHelpFormatter
from spherecal.cli.exit_codes import ExitCode
from spherecal.cli.options import add_federation_options, reference_defaults

__all__ = ["HELP", "NAME", "reference_config", "register", "run"]

NAME = "reference"
HELP = "run the deterministic in-process reference federation (no network)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from spherecal.spherefed.reference import SELECT_BY, ReferenceConfig

    d = ReferenceConfig()
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Train a federation in one process (FedAvg/FedProx), then calibrate the "
            "classifier with FFC and CCVR and compare with the oracle (classifier "
            "fine-tuned on all pooled real features). Progress goes to stderr; the "
            "result JSON to --json (and a summary to stdout)."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    defaults = reference_defaults(d)
    add_federation_options(
        p,
        defaults,
        overrides={
            "lr": {
                "nargs": "+",
                "help": "local learning rate; several values run a sweep selected on the "
                "validation split",
            }
        },
    )
    p.set_defaults(lr=[d.lr])
    p.add_argument("--select-by", choices=SELECT_BY, default="none", help="sweep criterion")
    p.add_argument(
        "--secure-sum",
        action="store_true",
        help="sum the calibration statistics with the in-process secure-aggregation protocol "
        "(real masks and shares) at the service's fixed-point scale",
    )
    p.add_argument("--json", type=Path, default=None, help="write the result JSON here")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads. 1 (the default, as in `spherecal simulate`) keeps the "
        "float results bit-identical to the service's; it is also fastest for small models",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(run=run)


def reference_config(args: argparse.Namespace) -> Any:
    """The :class:`~spherecal.spherefed.reference.ReferenceConfig` the arguments ask for."""
    from dataclasses import replace

    from spherecal.spherefed.calibrate import CCVRConfig
    from spherecal.spherefed.reference import ReferenceConfig

    base = ReferenceConfig()
    loss = args.loss or ("mse" if args.head == "sphere" else "ce")
    if args.shards is not None:
        scheme, alpha = "shards", base.alpha
    elif args.alpha == "iid":
        scheme, alpha = "iid", base.alpha
    else:
        scheme, alpha = "dirichlet", float(args.alpha)
    return ReferenceConfig(
        dataset=args.dataset,
        data_root=args.data_root,
        samples=args.samples,
        participants=args.participants,
        partition=scheme,
        alpha=alpha,
        shards_per_client=args.shards if args.shards is not None else base.shards_per_client,
        model=args.model,
        norm=args.norm,
        head=args.head,
        classifier=args.classifier,
        loss=loss,
        algorithm=args.algorithm,
        prox_mu=args.prox_mu,
        fedopt_lr=args.fedopt_lr,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        lr=args.lr[0],
        sample_fraction=args.sample_fraction,
        seed=args.seed,
        ffc_ridge=args.ridge,
        calibrations=tuple(args.calibration),
        secure_sum=bool(args.secure_sum),
        ridge_grid=tuple(args.ridge_grid),
        shrinkage_grid=tuple(args.shrinkage_grid),
        ccvr=replace(CCVRConfig(), virtual_per_class=args.ccvr_virtual, tukey=args.tukey),
    )


def run(args: argparse.Namespace) -> int:
    config = reference_config(args)
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.json is not None:  # before training: a run must not be lost to a bad path
        from spherecal.outputs import check_output_file

        check_output_file(args.json, what="--json")
    import torch

    from spherecal.spherefed.reference import run_reference, run_reference_sweep

    torch.set_num_threads(args.threads)

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[reference] {msg}", file=sys.stderr, flush=True)

    result: dict[str, Any]
    if len(args.lr) > 1:
        result = run_reference_sweep(config, args.lr, select_by=args.select_by, progress=progress)
    else:
        result = run_reference(config, progress=progress)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        progress(f"wrote {args.json}")
    print(json.dumps({"accuracy": result["accuracy"], "settings": result["settings"]}, indent=2))
    return ExitCode.OK
