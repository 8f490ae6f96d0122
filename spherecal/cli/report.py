"""``spherecal report RUN_DIR``: a picture of one run — training loss and accuracy per
round, calibration before/after, each site's contribution — as one self-contained HTML
page (:mod:`spherecal.run_report`; docs/simulate.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spherecal.cli.exit_codes import ExitCode

__all__ = ["HELP", "NAME", "register", "run"]

NAME = "report"
HELP = "draw a run (loss, accuracy, calibration, sites) as a self-contained HTML page"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Read a run's results.json (a spherecal simulate --out DIR) or summary.json (a "
            "coordinator's out_dir) and write one HTML page with inline SVG charts: "
            "training loss and federated accuracy per round, accuracy before and after "
            "each calibration method, and each site's rounds and uploaded bytes. The page "
            "runs no script and fetches nothing. Exit status 0 written, 2 the directory "
            "holds no run or the page cannot be written."
        ),
    )
    p.add_argument("run_dir", type=Path, help="simulate output directory or coordinator out_dir")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the page (default RUN_DIR/report.html)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spherecal.outputs import OutputPathError, check_output_file
    from spherecal.run_report import ReportError, write_run_report

    try:
        if args.out is not None:
            check_output_file(args.out, what="report")
        written = write_run_report(args.run_dir, args.out)
    except (ReportError, OutputPathError, OSError) as exc:
        print(f"spherecal report: error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print(f"wrote {written}")
    return ExitCode.OK
