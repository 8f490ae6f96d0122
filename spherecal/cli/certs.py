"""``spherecal certs``: a development CA, participant certificates and
revocation for mutual TLS (the work is in :mod:`spherecal.certs`).

Errors a user can fix print one line ``spherecal certs: error: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spherecal.cli.exit_codes import ExitCode

__all__ = ["HELP", "NAME", "register", "run"]

NAME = "certs"
HELP = "a CA, certificates from the sites' requests, and the members the sites pin (mutual TLS)"
DAYS_HELP = (
    "whole days the certificates are valid from now, at least 1 (default 365; the start "
    "is set 5 minutes back, for clocks a little behind)"
)
ISSUE_DAYS_HELP = (
    "whole days the certificate is valid from now, at least 1 (default 365, or until the "
    "CA ends if that is sooner; a --days that would end after the CA is refused, naming "
    "the longest possible; the start is set 5 minutes back, for clocks a little behind)"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "A certificate authority for mutual TLS: `certs init DIR` makes ca.pem/ca.key "
            "and the coordinator's server.pem/server.key, and an empty revocation list "
            "crl.pem; at each site, `certs request NAME "
            "--dir DIR` makes the site's TLS key and Ed25519 identity key and NAME.csr, "
            "and `certs issue NAME --dir CA --csr NAME.csr` certifies it (the private keys "
            "never leave the site); `certs issue NAME --dir CA` alone makes the keys at the "
            "CA, for trials (the CA's holder then holds them); `certs revoke NAME --dir "
            "CA` adds a certificate to the CA's revocation list crl.pem (`certs crl --dir "
            "CA` writes the list anew); `certs pin NAME --identity-key "
            "FILE` prints NAME's line for the sites' [tls] peer_keys file; `certs pins "
            "FILE` reads such a file back with its fingerprint, for the sites to compare."
        ),
    )
    p.set_defaults(run=run)
    csub = p.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    init = csub.add_parser(
        "init",
        help="create a CA, a server certificate and an empty revocation list in DIR",
        description=(
            "Make ca.pem/ca.key, the coordinator's server.pem/server.key and crl.pem, the "
            "CA's revocation list (empty, valid as long as the CA): point the "
            "coordinator's [tls] crl at it from the start, and `certs revoke` takes "
            "effect without a restart."
        ),
    )
    init.add_argument("dir", type=Path)
    init.add_argument(
        "--host",
        action="append",
        default=None,
        help="server name or IP for the coordinator certificate (repeatable; default "
        "localhost and 127.0.0.1)",
    )
    init.add_argument("--days", type=int, default=365, help=DAYS_HELP)
    request = csub.add_parser(
        "request",
        help="at a site: make its keys and a certificate request NAME.csr",
        description=(
            "Make participant NAME's TLS key (NAME.key) and Ed25519 identity key "
            "(NAME.identity.key) in DIR, each kept if already there, and NAME.csr, the "
            "request to send to the CA's operator: it names both public keys and is "
            "signed by the TLS key. The private keys stay at the site, so nobody else "
            "can sign as it; the other sites pin its identity key (`certs pin`)."
        ),
    )
    request.add_argument("name")
    request.add_argument("--dir", type=Path, required=True, help="the site's key directory")
    issue = csub.add_parser("issue", help="issue participant NAME's client certificate")
    issue.add_argument("name")
    issue.add_argument("--dir", type=Path, required=True, help="the CA directory")
    issue.add_argument("--days", type=int, default=None, help=ISSUE_DAYS_HELP)
    issue.add_argument(
        "--csr",
        type=Path,
        default=None,
        help="the site's request (`certs request`): certify its keys; without it the keys "
        "are made here, and whoever holds this directory holds them",
    )
    issue.add_argument(
        "--new-identity",
        action="store_true",
        help="replace NAME.identity.key with a fresh key (after a compromise; then "
        "`spherecal coordinator --unpin NAME`)",
    )
    revoke = csub.add_parser(
        "revoke",
        help="revoke participant NAME's current certificate (adds it to DIR/crl.pem)",
        description=(
            "Add NAME's current certificate to the CA's revocation list DIR/crl.pem. A "
            "coordinator whose [tls] crl points at that file refuses the certificate "
            "from its next call on (the file is re-read when it changes)."
        ),
    )
    revoke.add_argument("name")
    revoke.add_argument("--dir", type=Path, required=True, help="the CA directory")
    revoke.add_argument(
        "--days",
        type=int,
        default=365,
        help="whole days the new CRL is valid, at least 1 (default 365); refused when the "
        "CA has expired or is not yet valid",
    )
    crl = csub.add_parser(
        "crl",
        help="write DIR/crl.pem anew, keeping its entries (an empty list if none)",
        description=(
            "Write the CA's revocation list DIR/crl.pem anew, signed now and valid for "
            "--days, keeping every certificate it revokes: an empty list for a CA made "
            "before `certs init` wrote one (so that [tls] crl can name it before "
            "anything is revoked), or a fresh lifetime for a list about to end. Its CRL "
            "number is one above the list's, or --number."
        ),
    )
    crl.add_argument("--dir", type=Path, required=True, help="the CA directory")
    crl.add_argument(
        "--number",
        type=int,
        default=None,
        help="the new list's CRL number, above the current list's (default: one above "
        "it). For a CA whose crl.pem was lost: a coordinator refuses a list numbered "
        "below the newest it applied, and its refusal names the number to give",
    )
    crl.add_argument(
        "--days",
        type=int,
        default=365,
        help="whole days the CRL is valid, at least 1 (default 365); refused when the "
        "CA has expired or is not yet valid",
    )
    pin = csub.add_parser(
        "pin",
        help="print participant NAME's line for the sites' [tls] peer_keys file",
        description=(
            "Print `NAME HEX`, the Ed25519 identity public key of participant NAME, as a "
            "line of the [tls] peer_keys file. Each site prints its own from its identity "
            "key and sends it to the other sites outside the coordinator; every site "
            "pins the same lines, so whoever holds the CA key cannot add or replace "
            "members (docs/deployment.md, 'Pinning the members')."
        ),
    )
    pin.add_argument("name")
    pin.add_argument(
        "--identity-key",
        type=Path,
        required=True,
        help="the site's identity key (NAME.identity.key, or the [participant] "
        "identity_key / state_dir/identity.key the site runs with)",
    )
    pins = csub.add_parser(
        "pins",
        help="print the members of a [tls] peer_keys file and its fingerprint",
        description=(
            "Read a [tls] peer_keys file as a site does, print each member with the "
            "first digits of its key, then the file's fingerprint: five groups of four "
            "hex digits that are the same at every site holding the same members and "
            "keys. The sites compare the fingerprint over a channel the coordinator's "
            "operator does not control (read aloud), instead of every key; the site "
            "prints it at start too."
        ),
    )
    pins.add_argument("file", type=Path, help="the [tls] peer_keys file")


def _init(args: argparse.Namespace) -> int:
    from spherecal.certs import DEFAULT_HOSTS, init_ca

    try:
        paths = init_ca(args.dir, hosts=args.host or DEFAULT_HOSTS, days=args.days)
    except FileExistsError as exc:
        raise ValueError(str(exc)) from None
    for path in paths:
        print(path)
    return ExitCode.OK


def _request(args: argparse.Namespace) -> int:
    from spherecal.certs import request_participant

    csr, key, identity = request_participant(args.dir, args.name)
    print(csr)
    print(
        f"send {csr} to the CA's operator; {key} and {identity} stay here (mode 0600)",
        file=sys.stderr,
    )
    return ExitCode.OK


def _issue(args: argparse.Namespace) -> int:
    from spherecal.certs import DEFAULT_DAYS, issue_participant

    paths = issue_participant(
        args.dir, args.name, days=args.days, new_identity=args.new_identity, csr=args.csr
    )
    for path in paths:
        print(path)
    if args.days is None:
        _ends_with_the_ca(args.dir, paths[0], DEFAULT_DAYS)
    return ExitCode.OK


def _ends_with_the_ca(directory: Path, pem: Path, default_days: int) -> None:
    """Say so on stderr when a certificate issued without ``--days`` ends with its CA a
    day or more before the default lifetime would: the operator asked for nothing, and
    the date the site must renew by is the CA's, not a year from now."""
    import datetime as dt

    from cryptography import x509

    from spherecal.certs import CLOCK_SKEW

    cert = x509.load_pem_x509_certificate(pem.read_bytes())
    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    end = cert.not_valid_after_utc
    full = cert.not_valid_before_utc + CLOCK_SKEW + dt.timedelta(days=default_days)
    if end == ca.not_valid_after_utc and full - end >= dt.timedelta(days=1):
        left = (end - dt.datetime.now(dt.UTC)) / dt.timedelta(days=1)
        print(
            f"{pem} is valid until {end:%Y-%m-%d %H:%M} UTC ({left:.1f} days), when the CA "
            f"{directory / 'ca.pem'} ends: a certificate does not outlive its CA (a new CA "
            "then: spherecal certs init NEWDIR)",
            file=sys.stderr,
        )


def _revoke(args: argparse.Namespace) -> int:
    from spherecal.certs import revoke_participant

    print(revoke_participant(args.dir, args.name, days=args.days))
    return ExitCode.OK


def _crl(args: argparse.Namespace) -> int:
    from spherecal.certs import write_crl

    print(write_crl(args.dir, days=args.days, number=args.number))
    return ExitCode.OK


def _pin(args: argparse.Namespace) -> int:
    from spherecal.crypto import identity_public_bytes
    from spherecal.participant.trust import pin_line
    from spherecal.proto.identity import load_identity_key

    path: Path = args.identity_key
    if not path.is_file():
        raise ValueError(f"--identity-key {str(path)!r}: no such file")
    print(pin_line(args.name, identity_public_bytes(load_identity_key(path))))
    return ExitCode.OK


def _pins(args: argparse.Namespace) -> int:
    from spherecal.participant.trust import load_peer_keys, pins_fingerprint

    pins = load_peer_keys(args.file)
    width = max(len(name) for name in pins)
    for name in sorted(pins):
        print(f"{name:<{width}}  {pins[name].hex()[:16]}…")
    print(f"{len(pins)} members, fingerprint {pins_fingerprint(pins)}")
    return ExitCode.OK


def run(args: argparse.Namespace) -> int:
    """The chosen action (``init``, ``request``, ``issue``, ``revoke``, ``crl``, ``pin``,
    ``pins``)."""
    actions = {
        "init": _init,
        "request": _request,
        "issue": _issue,
        "revoke": _revoke,
        "crl": _crl,
        "pin": _pin,
        "pins": _pins,
    }
    action: int = actions[args.certs_command](args)
    return action
