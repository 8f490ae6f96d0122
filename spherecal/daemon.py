"""The entry point of a coordinator or participant *process*: ``python -m
spherecal.daemon coordinator|participant --config FILE``.

The same commands as ``spherecal coordinator`` / ``spherecal participant`` (the same
modules, :mod:`spherecal.cli.coordinator` and :mod:`spherecal.cli.participant`),
without the rest of the CLI: the simulation's fork server runs this in each forked
child, and the simulation itself is then no dependency of what it launches (no
import cycle through the CLI).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spherecal.cli import coordinator, participant
from spherecal.cli.exit_codes import run_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spherecal", description="Run a spherecal coordinator or participant process."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    coordinator.register(sub)
    participant.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from spherecal.logs import quiet_grpc_core

    words = list(sys.argv[1:] if argv is None else argv)
    quiet_grpc_core(words[0] if words else None)  # before anything imports grpc
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
