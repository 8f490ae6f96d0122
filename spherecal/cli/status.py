"""``spherecal status``: show a running federation — roster, round, stage, jobs, ε
(:mod:`spherecal.status`; docs/deployment.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["HELP", "NAME", "register", "run"]

NAME = "status"
HELP = "show a running federation: roster, round, stage, jobs, ε"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Ask a running coordinator for its status (read-only, metadata only) and print "
            "one screen. --config takes the coordinator's TOML (address, and its [tls] "
            "client_ca as the CA to trust); --address HOST:PORT names it directly. Over "
            "mutual TLS pass the operator's --cert and --key (an identity on the "
            "coordinator's [admin] allow list). Exit status 0 ok, 2 bad input or the "
            "coordinator unreachable or refusing."
        ),
    )
    p.add_argument("--config", type=Path, default=None, help="the coordinator's TOML file")
    p.add_argument("--address", default=None, help="HOST:PORT (overrides --config)")
    p.add_argument("--ca", type=Path, default=None, help="CA certificate to trust (PEM)")
    p.add_argument("--cert", type=Path, default=None, help="operator certificate (PEM)")
    p.add_argument("--key", type=Path, default=None, help="operator private key (PEM)")
    p.add_argument("--server-name", default=None, help="name to check on the server certificate")
    p.add_argument("--insecure", action="store_true", help="plaintext (loopback addresses only)")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until the federation ends or Ctrl-C",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spherecal.status import show_status

    return show_status(args)
