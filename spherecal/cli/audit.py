"""``spherecal audit PATH``: the privacy report of a coordinator database or a
simulate output directory (:mod:`spherecal.audit`; docs/privacy.md); ``spherecal
audit --site STATE_DIR``: one site's own audit from its release ledger alone
(:mod:`spherecal.site_audit`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spherecal.cli.exit_codes import ExitCode

__all__ = ["HELP", "NAME", "register", "run"]

NAME = "audit"
HELP = "privacy report of a coordinator database or a simulate output dir"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Read a coordinator's state.db (or a spherecal simulate --out DIR), print the "
            "privacy report and write audit.json — into the simulate DIR, or for a "
            "database into the current directory, never into the coordinator's state "
            "directory; --out FILE chooses — (and, with --html FILE, a one-page report "
            "a privacy officer can read). Exit status 0 when every check passes, 1 when "
            "one fails, 2 when the path cannot be read or written."
        ),
    )
    p.add_argument(
        "path",
        type=Path,
        nargs="?",
        default=None,
        help="coordinator database or simulate output directory",
    )
    p.add_argument(
        "--site",
        type=Path,
        default=None,
        metavar="STATE_DIR",
        help="audit one site from its own release ledger only (spherecal.site_audit)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write audit.json (default: DIR/audit.json for a simulate output "
        "DIR, else ./audit.json)",
    )
    p.add_argument(
        "--empirical", action="store_true", help="also run the canary audit (a few seconds)"
    )
    p.add_argument("--trials", type=int, default=2000, help="canary releases per world")
    p.add_argument("--json", action="store_true", help="print audit.json instead of the report")
    p.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write a self-contained one-page HTML report for a privacy officer",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import sqlite3

    from spherecal.audit import AuditError, run_audit
    from spherecal.outputs import check_output_file

    if args.site is not None and args.path is not None:
        print(
            f"spherecal audit: error: give PATH ({args.path}) or --site STATE_DIR "
            f"({args.site}), not both",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT
    # output paths before any work (one line: OutputPathError is a ValueError)
    if args.html is not None:
        check_output_file(args.html, what="--html")
    if args.out is not None and args.site is None:
        check_output_file(args.out, what="--out")
    elif args.site is None and args.path is not None:
        from spherecal.audit import default_output, locate

        try:  # the default place too, before any work
            check_output_file(default_output(*locate(args.path)), what="audit.json")
        except AuditError as exc:
            print(f"spherecal audit: error: {exc}", file=sys.stderr)
            return ExitCode.BAD_INPUT
    if args.site is not None:  # the site's own audit (spherecal.site_audit)
        from spherecal.site_audit import run_site_audit

        status, text = run_site_audit(args.site, html_path=args.html, as_json=args.json)
        print(text, file=sys.stderr if status == 2 else sys.stdout)
        return (ExitCode.OK, ExitCode.FAILED, ExitCode.BAD_INPUT)[status]
    if args.path is None:
        print("spherecal audit: error: give a PATH or --site STATE_DIR", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        report = run_audit(
            args.path, out=args.out, empirical=args.empirical, trials=args.trials, html=args.html
        )
    except (AuditError, sqlite3.DatabaseError, OSError) as exc:
        print(f"spherecal audit: error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "payloads"}, indent=2))
    else:
        from spherecal.audit_report import format_report

        print(format_report(report))
    return ExitCode.OK if report["ok"] else ExitCode.FAILED
