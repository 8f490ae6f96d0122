"""CLI subcommands of the service: ``coordinator`` and ``participant`` (``simulate``
lives in :mod:`spherecal.simulate_cli`, ``certs`` in :mod:`spherecal.certs_cli`).

Registered by ``spherecal.cli.build_parser``, and by :mod:`spherecal.daemon` (the entry
point the simulation's fork server runs, which must not reach the simulation itself).
Heavy imports (torch, grpc servers) happen inside the command functions so that
``spherecal certs`` and ``--help`` stay fast. Errors a user can fix (bad config, missing
file, refused insecure address) print one line ``spherecal COMMAND: error: ...``
and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from spherecal.proto.federation_end import SUCCESSFUL_STATUSES

__all__ = ["add_coordinator_parser", "add_participant_parser"]

SubParsers = argparse._SubParsersAction


# ====================================================================== coordinator
def add_coordinator_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "coordinator",
        help="run a coordinator (gRPC server) from a TOML config",
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
        "(after a key compromise or loss; run while the coordinator is stopped)",
    )
    p.add_argument("--listen", default=None, help="override [server] listen (host:port)")
    _add_log_format(p, "[server] log_format")
    p.add_argument(
        "--check-state",
        action="store_true",
        help="print what the state directory holds (federation id, rounds completed, "
        "checkpoints, jobs, privacy ledger), check the database's integrity, and exit "
        "(exit 2 on a damaged database)",
    )
    p.add_argument(
        "--new-federation",
        action="store_true",
        help="start a new federation even though the state directory holds checkpoints or "
        "a federation marker its database does not know (they are moved to "
        "set-aside-TIME/, never deleted); without it such a start is refused",
    )
    p.set_defaults(func=_cmd_coordinator)


def _cmd_coordinator(args: argparse.Namespace) -> int:
    from spherecal.config import load_coordinator_config
    from spherecal.coordinator.main import run_coordinator

    _enable_faulthandler()
    settings, threads = load_coordinator_config(args.config)
    if args.unpin is not None:
        return _unpin(settings, args.unpin)
    if args.check_state:
        return _check_state(settings)
    if args.listen:
        settings = replace(settings, server=replace(settings.server, listen=args.listen))
    from spherecal.preflight import check_coordinator

    check_coordinator(settings, str(args.config))
    from spherecal.logs import LineFormatter, line_writer

    fmt = args.log_format or settings.server.log_format
    summary = run_coordinator(
        settings,
        threads=threads,
        new_federation=args.new_federation,
        say=line_writer("coordinator", fmt),
        log_formatter=LineFormatter("coordinator", fmt),
    )
    shown = ("status", "status_reasons", "accuracy", "accuracy_covers", "errors", "warnings")
    print(json.dumps({k: summary.get(k) for k in shown}, indent=2), flush=True)
    code = 0 if summary.get("status") in SUCCESSFUL_STATUSES else 1
    _closing_line("coordinator", fmt, f"federation {summary.get('status')}", code)
    return code


def _add_log_format(p: argparse.ArgumentParser, key: str) -> None:
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help=f"stderr log lines: text or one JSON object a line, each with an ISO-8601 UTC "
        f"timestamp and a level (default: the config's {key}, else text)",
    )


def _closing_line(component: str, fmt: str, what: str, code: int) -> None:
    """The last line on stderr: how the process ends and its exit status."""
    from spherecal.logs import format_line

    level = "INFO" if code == 0 else "ERROR"
    line = format_line(component, f"exiting: {what} (exit status {code})", fmt=fmt, level=level)
    print(line, file=sys.stderr, flush=True)


def _unpin(settings: Any, participant_id: str) -> int:
    from spherecal.coordinator.state.store import Store

    if participant_id not in settings.participants:
        raise ValueError(f"{participant_id!r} is not on the roster {list(settings.participants)}")
    db = settings.state_dir / "state.db"
    if not db.exists():
        raise FileNotFoundError(f"no coordinator state at {db}")
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
    return 0


def _check_state(settings: Any) -> int:
    from spherecal.coordinator.state.state_dir import format_report, inspect_state

    print(format_report(inspect_state(settings.state_dir)))
    return 0


def _enable_faulthandler() -> None:
    """A long-running service process that dies on a signal (SIGSEGV, SIGABRT from a
    native library) leaves Python tracebacks of every thread in its log instead of
    just an exit status; ``kill -USR1 PID`` writes them without stopping it."""
    import faulthandler

    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


# ====================================================================== participant
def add_participant_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "participant",
        help="run a participant (dials out to a coordinator) from a TOML config",
        description=(
            "Join a federation: dial out to the coordinator, train locally, compute "
            "statistics and take part in secure aggregation until the coordinator says "
            "done; then save the final models in [participant] out_dir. Exit status 0 "
            "completed or degraded, 1 federation failed, 2 bad input or refused, 3 gave up "
            "reconnecting."
        ),
    )
    p.add_argument("--config", type=Path, required=True, help="participant TOML file")
    p.add_argument("--coordinator", default=None, help="override [participant] coordinator")
    _add_log_format(p, "[participant] log_format")
    p.add_argument(
        "--init",
        action="store_true",
        help="enrol this site: create its Ed25519 identity key at [participant] "
        "identity_key (default state_dir/identity.key) if it has none, print its path and "
        "exit; an existing key is never replaced",
    )
    p.add_argument(
        "--halt-before",
        action="append",
        default=None,
        metavar="STAGE[@WHEN]",
        help=argparse.SUPPRESS,  # fault injection for tests / simulate --drop
    )
    p.set_defaults(func=_cmd_participant)


def _cmd_participant(args: argparse.Namespace) -> int:
    from spherecal.config import load_participant_config
    from spherecal.participant.faults import parse_halt
    from spherecal.participant.main import run_participant

    _enable_faulthandler()
    settings = load_participant_config(args.config)
    if args.init:
        from spherecal.participant.enrolment import enrol

        path, created = enrol(settings)
        print(f"{'created' if created else 'kept the existing'} identity key {path}")
        return 0
    if args.coordinator:
        settings = replace(settings, coordinator=args.coordinator)
    if args.halt_before:
        points = tuple(parse_halt(h) for h in args.halt_before)
        settings = replace(settings, halt_before=settings.halt_before + points)
    from spherecal.preflight import check_participant

    check_participant(settings, str(args.config))
    from spherecal.logs import LineFormatter, line_writer

    fmt = args.log_format or settings.log_format
    pid = settings.participant_id
    _log_records(LineFormatter(pid, fmt))
    code = run_participant(settings, log=line_writer(pid, fmt))
    _closing_line(pid, fmt, PARTICIPANT_EXITS.get(code, "ended"), code)
    return code


#: What a participant's exit status says (docs/cli.md).
PARTICIPANT_EXITS = {
    0: "federation completed or degraded",
    1: "federation failed",
    2: "refused by the coordinator",
    3: "gave up reconnecting",
}


def _log_records(formatter: Any) -> None:
    """``logging`` records (warnings and up) to stderr in the process's log format."""
    import logging

    root = logging.getLogger()
    if root.handlers:
        return  # embedded: the host's logging decides
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
