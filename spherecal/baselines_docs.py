"""Copy the committed result tables into ``docs/baselines.md``.

Every table the page quotes from an experiment's ``docs/baselines/<run>/table.md``
sits between ``<!-- generated: <run>/table.md#K … -->`` and ``<!-- end generated:
<run>/table.md#K -->`` markers (``K``: the K-th table of that file, from 1).
``python -m spherecal.baselines_docs`` rewrites those blocks from the files;
``--check`` exits 1 when the page is stale (``tests/unit/test_docs.py`` runs the same
check), so a rerun experiment cannot leave the page quoting its old numbers.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DOC", "RESULTS", "main", "render", "tables_of"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "baselines.md"
RESULTS = DOC.parent / "baselines"
_BLOCK = re.compile(
    r"<!-- generated: (?P<src>[\w./-]+)#(?P<k>\d+) \(python -m spherecal\.baselines_docs\) -->\n"
    r".*?<!-- end generated: (?P=src)#(?P=k) -->",
    re.DOTALL,
)


def tables_of(text: str) -> list[str]:
    """The markdown tables of ``text`` (runs of lines starting with ``|``), in order,
    each with its trailing newline."""
    found: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append("\n".join(current) + "\n")
            current = []
    if current:
        found.append("\n".join(current) + "\n")
    return found


def render(text: str, results: Path = RESULTS) -> str:
    """``text`` with every generated block replaced by the table it names."""

    def block(match: re.Match[str]) -> str:
        src, k = match["src"], int(match["k"])
        tables = tables_of((results / src).read_text())
        if not 1 <= k <= len(tables):
            raise ValueError(f"{src} has {len(tables)} table(s), not a #{k}")
        return (
            f"<!-- generated: {src}#{k} (python -m spherecal.baselines_docs) -->\n"
            f"{tables[k - 1]}<!-- end generated: {src}#{k} -->"
        )

    return _BLOCK.sub(block, text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spherecal.baselines_docs",
        description="Copy the committed experiment tables into docs/baselines.md.",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page to update")
    args = parser.parse_args(argv)
    current = args.doc.read_text()
    wanted = render(current, args.doc.parent / "baselines")
    if args.check:
        if wanted != current:
            print(f"{args.doc} is stale: run python -m spherecal.baselines_docs", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        args.doc.write_text(wanted)
        print(f"updated {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
