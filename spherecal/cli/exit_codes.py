"""The exit statuses of every ``spherecal`` command, and the error contract that maps
exceptions onto them (docs/cli.md, "Exit statuses" — a test keeps the two equal).

Kept apart from the parser (:mod:`.app`) so that the process entry point
:mod:`spherecal.daemon` can use it without importing every command.
"""

from __future__ import annotations

import argparse
import enum
import pickle
import sys

__all__ = ["ExitCode", "one_line", "run_command"]


class ExitCode(enum.IntEnum):
    """What a command's exit status means; one row each in docs/cli.md."""

    OK = 0
    """The command did what was asked (a federation completed, or ended degraded with
    its outputs written and ``status_reasons`` saying what is missing)."""
    FAILED = 1
    """The run or check failed: a federation ended ``failed``, a site could not save its
    final models, an audit check failed, an experiment produced no row."""
    BAD_INPUT = 2
    """Bad input: a config, data file, path, certificate or argument that cannot be
    used — or the coordinator refused this participant / the status view."""
    GAVE_UP = 3
    """A participant gave up reconnecting (``give_up_s`` of continuous failure)."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT, as a shell reports it)."""


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command with the CLI's error contract: bad input (config, data,
    paths, certificates) is one line on stderr and :attr:`ExitCode.BAD_INPUT`, never a
    traceback; Ctrl-C is :attr:`ExitCode.INTERRUPTED`."""
    try:
        return int(args.run(args))
    except (ValueError, OSError, FloatingPointError, pickle.UnpicklingError) as exc:
        # OSError covers missing/unreadable files and permissions.
        print(f"spherecal {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        print(f"spherecal {args.command}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


def one_line(exc: BaseException) -> str:
    """An exception as one line (an ``OSError`` as ``FILE: reason``)."""
    text = str(exc)
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    return " ".join(text.split()) or type(exc).__name__
