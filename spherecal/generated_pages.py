"""The one command shape of a docs page with generated blocks.

``spherecal.config_docs`` (the config key tables of ``docs/deployment.md``) and
``spherecal.baselines_docs`` (the result tables of ``docs/baselines.md``) each render
their page from a source the tests also read; both are run the same way — rewrite the
page in place, or ``--check`` that it is current (exit 1 and say which command renews it
when it is not) — so that shape lives here once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["page_main"]


def page_main(
    argv: Sequence[str] | None,
    *,
    module: str,
    description: str,
    doc: Path,
    render: Callable[[str, Path], str],
) -> int:
    """Parse ``--check`` and ``--doc`` (default ``doc``), render the page's current
    text with ``render(text, page_path)``, then write it when it changed or, with
    ``--check``, return 1 when it would change (0 otherwise)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    parser.add_argument("--doc", type=Path, default=doc, help="the page to update")
    args = parser.parse_args(argv)
    current = args.doc.read_text()
    wanted = render(current, args.doc)
    if args.check:
        if wanted != current:
            print(f"{args.doc} is stale: run python -m {module}", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        args.doc.write_text(wanted)
        print(f"updated {args.doc}")
    return 0
