"""``spherecal participant --config FILE``: join a federation as one site (dials out
to the coordinator; docs/deployment.md). Also what :mod:`spherecal.daemon` runs in a
simulation's participant processes.

Heavy imports (torch, the gRPC client) happen in :func:`run`, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spherecal.cli.coordinator import enable_faulthandler

__all__ = ["HELP", "NAME", "register", "run"]

NAME = "participant"
HELP = "run a participant (dials out to a coordinator) from a TOML config"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Join a federation: dial out to the coordinator, train locally, compute "
            "statistics and take part in secure aggregation until the coordinator says "
            "done; then save the final models in [participant] out_dir. Exit status 0 "
            "completed or degraded, 1 federation failed, 2 bad input, refused by the "
            "coordinator, or this site refused the federation's plan (it tells the "
            "coordinator first), 3 gave up reconnecting."
        ),
    )
    p.add_argument("--config", type=Path, required=True, help="participant TOML file")
    p.add_argument("--coordinator", default=None, help="override [participant] coordinator")
    from spherecal.logs import add_log_format_option

    add_log_format_option(p, "[participant] log_format")
    p.add_argument(
        "--init",
        action="store_true",
        help="enrol a site without TLS: create its Ed25519 identity key at [participant] "
        "identity_key (default state_dir/identity.key) if it has none, print its path and "
        "exit; an existing key is never replaced. Under mutual TLS it makes no key (the "
        "key comes with `spherecal certs request`) and checks the existing one against "
        "[tls] cert",
    )
    p.add_argument(
        "--halt-before",
        action="append",
        default=None,
        metavar="STAGE[@WHEN]",
        help=argparse.SUPPRESS,  # fault injection for tests / simulate --drop
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from spherecal.config import load_participant_config
    from spherecal.participant.faults import parse_halt
    from spherecal.participant.main import run_participant

    enable_faulthandler()
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

    warnings = check_participant(settings, str(args.config))
    from spherecal.logs import closing_line, line_writer, log_records

    fmt = args.log_format or settings.log_format
    pid = settings.participant_id
    log_records(pid, fmt)
    say = line_writer(pid, fmt)
    for warning in warnings:  # a certificate that ends soon
        say(warning)
    end = run_participant(settings, log=say)
    closing_line(pid, fmt, end.ending or PARTICIPANT_EXITS.get(end.code, "ended"), end.code)
    return end.code


#: What a participant's exit status says (docs/cli.md), unless the run names how it
#: ended (``ParticipantEnd.ending``: "refused by the coordinator", "this site refused
#: the federation's plan: …").
PARTICIPANT_EXITS = {
    0: "federation completed or degraded",
    1: "federation failed",
    2: "refused",
    3: "gave up reconnecting",
}
