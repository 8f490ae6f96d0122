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
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from spherecal.service_cli import add_coordinator_parser, add_participant_parser

# Exit statuses of every command (docs/cli.md).
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_UNREACHABLE = 4  # the coordinator cannot be reached (``spherecal status``)
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + 2
EXIT_TERMINATED = 143  # SIGTERM: 128 + 15, as a shell reports a process it killed


class CoordinatorUnreachable(ValueError):
    """No coordinator answers at the address (UNAVAILABLE, or no answer in time):
    not bad input — it may be down or not up yet — so its own exit status."""


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` swallows it on the way out)."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


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
    (config, data, paths, certificates) is one line and exit status 2; an unreachable
    coordinator 4; Ctrl-C 130; SIGTERM one line and 143 (the coordinator installs its
    own SIGTERM handler while it runs: a clean stop with summary, exit by status)."""
    previous = None
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args))
    except CoordinatorUnreachable as exc:
        print(f"spherecal {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (ValueError, OSError, FloatingPointError, pickle.UnpicklingError) as exc:
        # OSError covers missing/unreadable files and permissions.
        print(f"spherecal {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"spherecal {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"spherecal {args.command}: terminated by SIGTERM", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


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
