"""Generate the config key tables of ``docs/deployment.md`` from the settings dataclasses.

``python -m spherecal.config_docs`` rewrites the two generated blocks (between the
``<!-- generated: … -->`` markers) in place; ``--check`` exits 1 if they are stale
(``tests/unit/spherecal/test_config_schema.py`` runs the same check). To document a
new key, write its docstring under the dataclass field and run this.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from spherecal.config import COORDINATOR_TABLES, PARTICIPANT_TABLES
from spherecal.config_schema import markdown_table
from spherecal.generated_pages import page_main

__all__ = ["DOC", "main", "render"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"
BLOCKS = {"coordinator keys": COORDINATOR_TABLES, "participant keys": PARTICIPANT_TABLES}


def render(text: str) -> str:
    """``text`` with every generated block replaced by its current table."""
    for name, tables in BLOCKS.items():
        begin = f"<!-- generated: {name} (python -m spherecal.config_docs) -->"
        end = f"<!-- end generated: {name} -->"
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.DOTALL)
        found = pattern.search(text)
        if found is None:
            raise ValueError(f"{DOC}: no generated block {name!r}")
        block = f"{begin}\n{markdown_table(tables)}{end}"
        text = text[: found.start()] + block + text[found.end() :]
    return text


def main(argv: Sequence[str] | None = None) -> int:
    return page_main(
        argv,
        module="spherecal.config_docs",
        description="Regenerate the config key tables of docs/deployment.md.",
        doc=DOC,
        render=lambda text, _page: render(text),
    )


if __name__ == "__main__":
    sys.exit(main())
