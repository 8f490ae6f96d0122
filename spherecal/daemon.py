"""The entry point of a coordinator or participant *process*: ``python -m
spherecal.daemon coordinator|participant --config FILE``.

The same commands as ``spherecal coordinator`` / ``spherecal participant`` (one parser
definition, :mod:`spherecal.service_cli`), without the rest of the CLI: the
simulation's fork server runs this in each forked child, and the simulation itself is
then no dependency of what it launches (no import cycle through the CLI).
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections.abc import Sequence

from spherecal.service_cli import add_coordinator_parser, add_participant_parser

# Exit statuses of every command (docs/cli.md).
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spherecal", description="Run a spherecal coordinator or participant process."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_coordinator_parser(sub)
    add_participant_parser(sub)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command with the CLI's error contract (docs/cli.md): bad input
    (config, data, paths, certificates) is one line and exit status 2; Ctrl-C is 130."""
    try:
        return int(args.func(args))
    except (ValueError, OSError, FloatingPointError, pickle.UnpicklingError) as exc:
        # OSError covers missing/unreadable files and permissions.
        print(f"spherecal {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"spherecal {args.command}: interrupted", file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    return " ".join(text.split()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    from spherecal.logs import quiet_grpc_core

    quiet_grpc_core()  # before anything imports grpc
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
