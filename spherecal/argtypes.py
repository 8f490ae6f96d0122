"""Argument types shared by the ``spherecal`` subcommands (one definition each)."""

from __future__ import annotations

import argparse
import math


def alpha_or_iid(text: str) -> float | str:
    """A Dirichlet α (a positive finite number) or the word ``iid``."""
    if text.lower() == "iid":
        return "iid"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--alpha must be a positive number or 'iid', got {text!r}"
        ) from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"--alpha must be > 0, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """A positive finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows ``(default: X)`` only where X says something.

    argparse's own formatter appends ``(default: None)`` (or ``[]``/``False``) to
    every option with help text, which contradicts help that states the real
    default itself ("seeds 0..N-1 (default 3) (default: None)"). Here an option
    whose default is ``None``, empty or a flag's ``False``, or whose help already
    names its default, shows its help as written.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            action.default in (None, [], (), False)
            or action.default is argparse.SUPPRESS
            or "default" in text
        ):
            return action.help
        return super()._get_help_string(action)


def calibration_list(text: str) -> list[str]:
    """A comma list of calibrator names (``ffc,ccvr,ffc_bias,lda,qda``), no repeats."""
    from spherecal.spherefed.calibration_suite import CALIBRATION_NAMES

    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CALIBRATION_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--calibration takes a comma list of {', '.join(CALIBRATION_NAMES)}; got {text!r}"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--calibration names a calibrator twice: {text!r}")
    return names
