"""``spherecal predict``: classify an ``.npz`` file with a saved (calibrated) model
(:mod:`spherecal.predict`; docs/models.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["HELP", "NAME", "register", "run"]

NAME = "predict"
HELP = "classify an .npz file with a saved (calibrated) model"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Load the model saved in --model-dir (model_spec.json + model_<calibration>.pt, "
            "or model_none.pt + head_<calibration>.pt for a closed-form head, as every "
            "site receives at the end of a federation), classify the images in "
            "--data (an .npz with 'x' [and 'y'], or 'x_test' [and 'y_test']; same layout "
            "and scaling as the training data, see docs/data.md) and write index,predicted"
            "[,label] rows to --out. Prints a JSON summary, with the accuracy when the file "
            "has labels. Exit status 0 ok, 2 bad input."
        ),
    )
    p.add_argument("--model-dir", type=Path, required=True, help="directory of a saved model")
    p.add_argument("--data", type=Path, required=True, help=".npz file to classify")
    p.add_argument(
        "--calibration",
        choices=("none", "ffc", "ccvr", "ffc_bias", "lda", "qda"),
        default=None,
        help=(
            "which saved classifier (default: ffc if saved, else ccvr, else none); "
            "ffc_bias, lda, qda: a closed-form head (head_<name>.pt) on the features of "
            "model_none.pt"
        ),
    )
    p.add_argument("--out", type=Path, default=None, help="CSV of predictions (default: none)")
    p.add_argument("--batch-size", type=int, default=512)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spherecal.predict import predict

    return predict(args)
