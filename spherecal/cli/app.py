"""The ``spherecal`` parser and entry point: every command module registered on one
parser, and only the chosen command's options built.

Each command module (:data:`COMMANDS`) has ``NAME``, ``HELP``, ``register(subparsers)``
and ``run(args)``, and imports nothing heavy at module level. Building a command's
options may need heavy modules (the dataset and model names for ``choices`` live
beside torch code), so :func:`main` builds them for the command being run only:
``spherecal --help`` lists every command from its ``HELP`` line without importing
torch, numpy or gRPC (a test checks which modules it loads).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from spherecal.cli import (
    audit,
    certs,
    coordinator,
    experiment,
    participant,
    predict,
    reference,
    report,
    simulate,
    status,
)
from spherecal.cli.exit_codes import run_command

__all__ = ["COMMANDS", "build_parser", "main"]

#: The commands, in the order ``spherecal --help`` lists them.
COMMANDS: tuple[ModuleType, ...] = (
    reference,
    simulate,
    coordinator,
    participant,
    certs,
    experiment,
    audit,
    report,
    status,
    predict,
)

#: ``build_parser(only=NONE)``: every command as a one-line stub (``spherecal --help``).
NONE = ""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command's options (``only=None``), or with those of the
    command named ``only`` and a one-line stub for each other command."""
    parser = argparse.ArgumentParser(
        prog="spherecal",
        description="Privacy-hardened federated calibration (SphereFed + FFC/CCVR).",
    )
    from spherecal import __version__

    parser.add_argument("--version", action="version", version=f"spherecal {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        if only is None or only == command.NAME:
            command.register(sub)
        else:
            sub.add_parser(command.NAME, help=command.HELP)
    return parser


def _chosen(argv: Sequence[str]) -> str:
    """The command ``argv`` names (its first word that is not an option), or
    :data:`NONE`: top-level options take no value, so the first such word is it."""
    names = {command.NAME for command in COMMANDS}
    for word in argv:
        if not word.startswith("-"):
            return word if word in names else NONE
    return NONE


def main(argv: Sequence[str] | None = None) -> int:
    """``spherecal ARGS``: parse, run the command, return its exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen(words)
    if chosen != NONE:  # `spherecal --help` loads no module but the CLI's
        from spherecal.logs import quiet_grpc_core

        quiet_grpc_core(chosen)  # before anything imports grpc
    args = build_parser(only=chosen).parse_args(words)
    return run_command(args)
