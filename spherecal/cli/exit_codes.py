"""The exit statuses of every ``spherecal`` command, and the error contract that maps
exceptions onto them (docs/cli.md, "Exit statuses" — a test keeps the two equal).

Kept apart from the parser (:mod:`.app`) so that the process entry point
:mod:`spherecal.daemon` can use it without importing every command.
"""

from __future__ import annotations

import argparse
import enum
import os
import pickle
import signal
import sys
import threading
from typing import Any

__all__ = ["CoordinatorUnreachable", "ExitCode", "Terminated", "one_line", "run_command"]


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
    used — or the coordinator refused this participant / the status view, or a
    participant refused the federation's plan (after telling the coordinator)."""
    GAVE_UP = 3
    """A participant gave up reconnecting (``give_up_s`` of continuous failure)."""
    UNREACHABLE = 4
    """The coordinator cannot be reached (``spherecal status``): UNAVAILABLE or no
    answer in time — down, not up yet, or the wrong address; not bad input."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT, as a shell reports it)."""
    PIPE_CLOSED = 141
    """The reader of standard output went away (``spherecal audit … | head``): no
    message, as a shell reports a process that SIGPIPE ended (128 + 13)."""
    TERMINATED = 143
    """SIGTERM (128 + 15): one line on stderr. A coordinator that is already serving
    installs its own handler instead (a clean stop; it exits by its final status)."""


class CoordinatorUnreachable(ValueError):
    """No coordinator answers at the address: :attr:`ExitCode.UNREACHABLE`."""


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` swallows it on the way out)."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command with the CLI's error contract: bad input (config, data,
    paths, certificates) is one line on stderr and :attr:`ExitCode.BAD_INPUT`, never a
    traceback; an unreachable coordinator :attr:`ExitCode.UNREACHABLE`; a closed
    output pipe :attr:`ExitCode.PIPE_CLOSED`, silently; Ctrl-C
    :attr:`ExitCode.INTERRUPTED`; SIGTERM one line and :attr:`ExitCode.TERMINATED`."""
    previous = None
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.run(args))
    except CoordinatorUnreachable as exc:
        print(f"spherecal {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return ExitCode.UNREACHABLE
    except BrokenPipeError:
        _discard_stdout()
        return ExitCode.PIPE_CLOSED
    except (ValueError, OSError, FloatingPointError, pickle.UnpicklingError) as exc:
        # OSError covers missing/unreadable files and permissions.
        print(f"spherecal {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        print(f"spherecal {args.command}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Terminated:
        print(f"spherecal {args.command}: terminated by SIGTERM", file=sys.stderr, flush=True)
        return ExitCode.TERMINATED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _discard_stdout() -> None:
    """Point standard output at the null device: the reader is gone, and the
    interpreter's flush at exit would otherwise fail on the same pipe and print."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (an embedding, a test's capture)
        pass


def one_line(exc: BaseException) -> str:
    """An exception as one line (an ``OSError`` as ``FILE: reason``)."""
    text = str(exc)
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    return " ".join(text.split()) or type(exc).__name__
