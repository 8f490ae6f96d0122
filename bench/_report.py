"""How a bench script hands over its JSON: printed, and written where ``--json`` says."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["emit_json"]


def emit_json(document: object, path: Path | None, *, sort_keys: bool = False) -> str:
    """Print ``document`` as indented JSON and write it to ``path`` (its folder made)
    when one is given; returns the text."""
    text = json.dumps(document, indent=2, sort_keys=sort_keys)
    print(text)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return text
