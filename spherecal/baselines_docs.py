"""Copy the committed result tables into ``docs/baselines.md``.

Every table the page quotes from an experiment's ``docs/baselines/<run>/table.md``
sits between ``<!-- generated: <run>/table.md#K … -->`` and ``<!-- end generated:
<run>/table.md#K -->`` markers (``K``: the K-th table of that file, from 1).
``python -m spherecal.baselines_docs`` rewrites those blocks from the files;
``--check`` exits 1 when the page is stale (``tests/unit/test_docs.py`` runs the same
check), so a rerun experiment cannot leave the page quoting its old numbers.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from spherecal.generated_pages import page_main

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
    return page_main(
        argv,
        module="spherecal.baselines_docs",
        description="Copy the committed experiment tables into docs/baselines.md.",
        doc=DOC,
        render=lambda text, page: render(text, page.parent / "baselines"),
    )


if __name__ == "__main__":
    sys.exit(main())
