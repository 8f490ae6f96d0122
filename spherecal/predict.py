"""``spherecal predict``: classify a site's own ``.npz`` data with a saved model.

Every site gets the federation's final models in its ``out_dir`` (see
``docs/models.md``); this command loads one with :func:`spherefed.load_model`
(``weights_only=True``), classifies the images of an ``.npz`` file in batches, and
writes one CSV row per sample. With labels in the file it also prints the accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spherecal.cli.exit_codes import ExitCode

__all__ = ["load_prediction_data", "predict"]

#: Key pairs tried in order: (images, labels); labels are optional.
_KEYS = (("x", "y"), ("x_test", "y_test"))


def load_prediction_data(path: Path) -> tuple[Any, Any]:
    """(images float32 (N, C, H, W), labels int64 (N,) or None) from an ``.npz``."""

    from spherecal.spherefed.data.npz import _npz_images, _npz_labels, open_npz

    with open_npz(path) as npz:
        for image_key, label_key in _KEYS:
            if image_key in npz.files:
                try:
                    x = _npz_images(npz[image_key], image_key, path)
                    y = (
                        _npz_labels(npz[label_key], label_key, x.shape[0], path)
                        if label_key in npz.files
                        else None
                    )
                except ValueError as exc:
                    if "allow_pickle" in str(exc):
                        raise ValueError(f"{path}: object arrays are not allowed") from None
                    raise
                return x, y
        found = sorted(npz.files)
    raise ValueError(f"{path}: no 'x' or 'x_test' array (found {found})")


def predict(args: argparse.Namespace) -> int:
    """``spherecal predict`` (its parser: :mod:`spherecal.cli.predict`)."""
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.out is not None:
        from spherecal.outputs import check_output_file

        check_output_file(args.out, what="--out")
    import torch

    from spherecal.spherefed.saved import available_calibrations, load_model

    x, y = load_prediction_data(args.data)
    calibration = args.calibration or next(iter(available_calibrations(args.model_dir)), None)
    net = load_model(args.model_dir, calibration)
    spec = json.loads((args.model_dir / "model_spec.json").read_text())
    expected = (int(spec["in_channels"]), *(int(v) for v in spec["image_size"]))
    if tuple(x.shape[1:]) != expected:
        raise ValueError(
            f"{args.data}: samples of shape {tuple(x.shape[1:])} do not fit the model's "
            f"input (channels, height, width) = {expected}"
        )
    num_classes = int(spec["num_classes"])
    if y is not None and y.size and int(y.max()) >= num_classes:
        outside = int((y >= num_classes).sum())
        raise ValueError(
            f"{args.data}: {outside} of {y.size} labels are not classes of this model "
            f"(it has {num_classes}: 0..{num_classes - 1}; the largest label is {int(y.max())}); "
            "an accuracy over them would count them as wrong"
        )
    images = torch.from_numpy(x)
    predicted: list[Any] = []
    with torch.no_grad():
        for lo in range(0, images.shape[0], args.batch_size):
            predicted.append(net(images[lo : lo + args.batch_size]).argmax(dim=1))
    labels = torch.cat(predicted).numpy() if predicted else torch.zeros(0, dtype=torch.long).numpy()
    summary: dict[str, Any] = {
        "model_dir": str(args.model_dir),
        "calibration": calibration,
        "samples": int(x.shape[0]),
        "accuracy": None,
    }
    if y is not None and x.shape[0] > 0:
        summary["accuracy"] = float((labels == y).mean())
        summary["correct"] = int((labels == y).sum())
    if args.out is not None:
        import numpy as np

        columns = [np.arange(x.shape[0]), labels] + ([y] if y is not None else [])
        header = "index,predicted" + (",label" if y is not None else "")
        tmp = args.out.with_name(args.out.name + ".tmp")
        np.savetxt(
            tmp, np.column_stack(columns), fmt="%d", delimiter=",", header=header, comments=""
        )
        tmp.replace(args.out)
        summary["out"] = str(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    print(json.dumps(summary, indent=2))
    return ExitCode.OK
