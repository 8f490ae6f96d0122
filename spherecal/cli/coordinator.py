"""``spherecal coordinator --config FILE``: run a coordinator (the gRPC server) from a
TOML config (docs/deployment.md). Also what :mod:`spherecal.daemon` runs in a
simulation's coordinator process.

Heavy imports (torch, the gRPC server) happen in :func:`run`, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from spherecal.cli.exit_codes import ExitCode

__all__ = ["HELP", "NAME", "STOPPED", "enable_faulthandler", "ending", "register", "run"]

NAME = "coordinator"
HELP = "run a coordinator (gRPC server) from a TOML config"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Run the federation described by a coordinator TOML file: serve gRPC, run the "
            "rounds, the secure-aggregation jobs and the calibration, write summary.json "
            "and the final models. Progress goes to stderr. Exit status 0 completed or "
            "degraded (summary.json's status_reasons say what is missing), 1 failed. See "
            "docs/deployment.md."
        ),
    )
    p.add_argument("--config", type=Path, required=True, help="coordinator TOML file")
    p.add_argument(
        "--unpin",
        metavar="ID",
        default=None,
        help="forget participant ID's pinned identity key in the state database and exit "
        "(after a key compromise or loss; run while the coordinator is stopped; refused "
        "for a federation that has ended, whose state is read-only)",
    )
    p.add_argument("--listen", default=None, help="override [server] listen (host:port)")
    from spherecal.logs import add_log_format_option, add_log_level_option

    add_log_format_option(p, "[server] log_format")
    add_log_level_option(p, "[server] log_level")
    p.add_argument(
        "--check-state",
        action="store_true",
        help="print what the state directory holds (federation id, rounds completed, "
        "checkpoints, jobs, privacy ledger), check the database's integrity, and exit "
        "(exit 2 on a damaged database, or none: no federation ran with this state_dir)",
    )
    p.add_argument(
        "--new-federation",
        action="store_true",
        help="start a new federation even though the state directory holds a federation "
        "that ended, or checkpoints or a federation marker its database does not know "
        "(they are moved to set-aside-TIME/, never deleted; an ended federation's result "
        "files in out_dir too); without it an ended federation is only reported and such "
        "files refuse the start",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from spherecal.config import load_coordinator_config
    from spherecal.coordinator.main import run_coordinator
    from spherecal.proto.federation_end import SUCCESSFUL_STATUSES

    enable_faulthandler()
    settings, threads = load_coordinator_config(args.config)
    if args.unpin is not None:
        return _unpin(settings, args.unpin)
    if args.check_state:
        return _check_state(settings)
    if args.listen:
        settings = replace(settings, server=replace(settings.server, listen=args.listen))
    from spherecal.preflight import check_coordinator

    warnings = check_coordinator(settings, str(args.config))
    from spherecal.logs import LineFormatter, closing_line, grpc_info_is_ours, line_writer

    fmt = args.log_format or settings.server.log_format
    debug = (args.log_level or settings.server.log_level) == "debug"
    say = line_writer("coordinator", fmt, debug=debug)
    for warning in warnings:  # a server certificate that ends soon
        say(warning)
    summary = run_coordinator(
        settings,
        threads=threads,
        new_federation=args.new_federation,
        say=say,
        log_formatter=LineFormatter("coordinator", fmt),
        grpc_core_info=not grpc_info_is_ours(),
    )
    shown = ("status", "status_reasons", "accuracy", "accuracy_covers", "errors", "warnings")
    print(json.dumps({k: summary.get(k) for k in shown}, indent=2), flush=True)
    code = ExitCode.OK if summary.get("status") in SUCCESSFUL_STATUSES else ExitCode.FAILED
    what, level = ending(summary)
    closing_line("coordinator", fmt, what, int(code), level=level)
    return code


#: The reason a stopped (not ended) federation's summary gives
#: (``spherecal.coordinator.driver.board``, ``spherecal.coordinator.main``).
STOPPED = "stopped: "


def ending(summary: Any) -> tuple[str, str | None]:
    """The closing line's WHAT, and its level where it is not the exit status's.

    A coordinator stopped mid-federation (SIGTERM, Ctrl-C, a failed write to its state)
    writes ``summary.json`` with status ``stopped`` and a ``stopped: …`` reason, and its
    database records ``stopped``: the same command resumes the federation. Its last line
    said ``ERROR … exiting: federation failed`` (as its summary said ``failed``, until
    2026-11-27), which an operator doing a routine restart reads as the federation's
    end."""
    status = summary.get("status")
    reasons = summary.get("status_reasons") or []
    stopped = next((r for r in reasons if isinstance(r, str) and r.startswith(STOPPED)), None)
    if status == "stopped":
        why = (stopped or "stopped: not ended").removeprefix(STOPPED)
        return (
            f"federation stopped, not ended ({why}): the same command with the same "
            "state_dir resumes it",
            "WARNING",
        )
    return f"federation {status}", None


def _unpin(settings: Any, participant_id: str) -> int:
    """Forget a member's pinned identity key, in a federation that has not ended.

    An ended federation's database is read-only to the coordinator (a restart reports
    it and changes nothing: ``coordinator.state.lifecycle``); until 2026-11-27
    ``--unpin`` wrote into it all the same, for a pin no join can use — a member that
    joins is told the federation has ended. Refused (exit 2), naming why and what to
    do: a new federation (``--new-federation``) pins every key afresh."""
    from spherecal.coordinator.state.lifecycle import finished_federation
    from spherecal.coordinator.state.store import Store
    from spherecal.spherefed.state_lock import StateDirLock

    if participant_id not in settings.participants:
        raise ValueError(f"{participant_id!r} is not on the roster {list(settings.participants)}")
    db = settings.state_dir / "state.db"
    if not db.exists():
        raise FileNotFoundError(f"no coordinator state at {db}")
    finished = finished_federation(settings.state_dir)
    if finished is not None:
        raise ValueError(
            f"--unpin {participant_id}: federation {finished.federation_id} in "
            f"{settings.state_dir} already ended {finished.status}, and an ended "
            "federation's state is read-only (nothing changed): no join can use the pin; "
            "a new federation (`spherecal coordinator --config FILE --new-federation`, "
            "which sets the ended one aside) pins each site's key at its first join"
        )
    # The coordinator must be stopped: it holds its pins in memory, so an unpin under
    # a running one would be lost, or half-applied at its next restart.
    with StateDirLock(settings.state_dir, role="coordinator --unpin"):
        store = Store(db)
        try:
            changed = store.unpin(participant_id)
        finally:
            store.close()
    if changed:
        print(
            f"unpinned the identity key of {participant_id} in {db}; its next join pins "
            "the key it presents (with mTLS: the key bound in its certificate)"
        )
    else:
        print(f"{participant_id} has no pinned identity key in {db}; nothing to do")
    return ExitCode.OK


def _check_state(settings: Any) -> int:
    from spherecal.coordinator.state.state_dir import format_report, inspect_state

    print(format_report(inspect_state(settings.state_dir)))
    return ExitCode.OK


def enable_faulthandler() -> None:
    """A long-running service process that dies on a signal (SIGSEGV, SIGABRT from a
    native library) leaves Python tracebacks of every thread in its log instead of
    just an exit status; ``kill -USR1 PID`` writes them without stopping it."""
    import faulthandler

    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
