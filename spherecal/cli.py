"""The ``spherecal`` command line.

Subcommands (more arrive with the service, privacy and baselines work):

- ``spherecal reference`` — the deterministic in-process reference federation
  (no network): trains, calibrates with FFC and CCVR, reports accuracies as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from spherecal.argtypes import DefaultsHelpFormatter, alpha_or_iid, calibration_list, positive_float
from spherecal.spherefed.algorithms.registry import ALGORITHM_NAMES as ALGORITHMS
from spherecal.spherefed.calibrate import CCVRConfig
from spherecal.spherefed.calibration_suite import CALIBRATION_NAMES
from spherecal.spherefed.classifier import CLASSIFIER_KINDS
from spherecal.spherefed.data import DATASET_NAMES
from spherecal.spherefed.heads import HEAD_KINDS
from spherecal.spherefed.losses import LOSS_NAMES
from spherecal.spherefed.models import EXTRACTOR_NAMES, NORM_NAMES
from spherecal.spherefed.reference import (
    SELECT_BY,
    ReferenceConfig,
    run_reference,
    run_reference_sweep,
)

#: Exit statuses of every command (docs/cli.md): 0 ok, 1 the federation failed,
#: 2 bad input (config, data, paths, certificates).


def _add_reference(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = ReferenceConfig()
    p = sub.add_parser(
        "reference",
        help="run the deterministic in-process reference federation (no network)",
        description=(
            "Train a federation in one process (FedAvg/FedProx), then calibrate the "
            "classifier with FFC and CCVR and compare with the oracle (classifier "
            "fine-tuned on all pooled real features). Progress goes to stderr; the "
            "result JSON to --json (and a summary to stdout)."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--dataset", default=d.dataset, choices=DATASET_NAMES)
    p.add_argument(
        "--data-root",
        default=None,
        help="CIFAR directory, .npz file, or the mnist1d cache directory (not needed for digits)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="mnist1d: samples generated, train + test (default 12000)",
    )
    p.add_argument("--participants", type=int, default=d.participants)
    p.add_argument(
        "--alpha",
        type=alpha_or_iid,
        default=d.alpha,
        help="Dirichlet concentration over classes (smaller = more skewed), or 'iid'",
    )
    p.add_argument(
        "--shards", type=int, default=None, help="shards per participant (FedFN-style split)"
    )
    p.add_argument("--rounds", type=int, default=d.rounds)
    p.add_argument("--local-epochs", type=int, default=d.local_epochs)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument(
        "--lr",
        type=positive_float,
        nargs="+",
        default=[d.lr],
        help="local learning rate; several values run a sweep selected on the validation split",
    )
    p.add_argument("--select-by", choices=SELECT_BY, default="none", help="sweep criterion")
    p.add_argument("--model", default=d.model, choices=EXTRACTOR_NAMES)
    p.add_argument("--norm", default=d.norm, choices=NORM_NAMES)
    p.add_argument("--head", default=d.head, choices=HEAD_KINDS)
    p.add_argument("--classifier", default=d.classifier, choices=CLASSIFIER_KINDS)
    p.add_argument(
        "--loss", default=None, choices=LOSS_NAMES, help="default: mse for sphere, ce otherwise"
    )
    p.add_argument("--algorithm", default=d.algorithm, choices=ALGORITHMS)
    p.add_argument("--prox-mu", type=float, default=d.prox_mu, help="FedProx μ")
    p.add_argument(
        "--fedopt-lr",
        type=positive_float,
        default=d.fedopt_lr,
        help="FedAdam/FedYogi server learning rate η",
    )
    p.add_argument("--sample-fraction", type=float, default=d.sample_fraction)
    p.add_argument("--ridge", type=float, default=d.ffc_ridge, help="FFC ridge λ (appendix C.1)")
    p.add_argument(
        "--calibration",
        type=calibration_list,
        default=",".join(d.calibrations),
        help="comma list of calibrators to run: " + ", ".join(CALIBRATION_NAMES),
    )
    p.add_argument(
        "--secure-sum",
        action="store_true",
        help="sum the calibration statistics with the in-process secure-aggregation protocol "
        "(real masks and shares) at the service's fixed-point scale",
    )
    p.add_argument(
        "--ridge-grid",
        type=float,
        nargs="+",
        default=list(d.ridge_grid),
        help="FFC+bias ridge candidates, chosen on the validation split",
    )
    p.add_argument(
        "--shrinkage-grid",
        type=float,
        nargs="+",
        default=list(d.shrinkage_grid),
        help="LDA/QDA shrinkage candidates in [0, 1], chosen on the validation split",
    )
    p.add_argument(
        "--ccvr-virtual", type=int, default=d.ccvr.virtual_per_class, help="virtual features/class"
    )
    p.add_argument(
        "--tukey", action="store_true", help="CCVR: ReLU + Tukey(0.5) on virtual features"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", type=Path, default=None, help="write the result JSON here")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads. 1 (the default, as in `spherecal simulate`) keeps the "
        "float results bit-identical to the service's; it is also fastest for small models",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_reference)


def _reference_config(args: argparse.Namespace) -> ReferenceConfig:
    loss = args.loss or ("mse" if args.head == "sphere" else "ce")
    if args.shards is not None:
        scheme, alpha = "shards", ReferenceConfig().alpha
    elif args.alpha == "iid":
        scheme, alpha = "iid", ReferenceConfig().alpha
    else:
        scheme, alpha = "dirichlet", float(args.alpha)
    base = ReferenceConfig()
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


def _cmd_reference(args: argparse.Namespace) -> int:
    config = _reference_config(args)
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.json is not None:  # before training: a run must not be lost to a bad path
        from spherecal.outputs import check_output_file

        check_output_file(args.json, what="--json")
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
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spherecal",
        description="Privacy-hardened federated calibration (SphereFed + FFC/CCVR).",
    )
    from spherecal import __version__

    parser.add_argument("--version", action="version", version=f"spherecal {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_reference(sub)
    from spherecal.certs_cli import add_certs_parser
    from spherecal.service_cli import add_coordinator_parser, add_participant_parser
    from spherecal.simulate_cli import add_simulate_parser

    add_coordinator_parser(sub)
    add_participant_parser(sub)
    add_simulate_parser(sub)
    add_certs_parser(sub)
    from spherecal.experiment import add_experiment_parser

    add_experiment_parser(sub)
    from spherecal.audit import add_audit_parser

    add_audit_parser(sub)
    from spherecal.predict import add_predict_parser

    add_predict_parser(sub)
    from spherecal.status_cli import add_status_parser

    add_status_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from spherecal.logs import quiet_grpc_core

    quiet_grpc_core()  # before anything imports grpc
    parser = build_parser()
    args = parser.parse_args(argv)
    from spherecal.daemon import run_command

    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
