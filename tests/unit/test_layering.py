"""The dependency rule of docs/design.md §2, checked against every import (including
imports inside functions): a package imports only packages in lower layers, and
``spherefed`` reaches ``crypto`` only from ``spherefed/privacy/``. If this fails, either
the import or the documented rule is wrong — fix one, and keep the doc true."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYER = {
    "proto": 0,
    "crypto": 0,
    "spherefed": 1,
    "participant": 2,
    "coordinator": 2,
    "spherecal": 3,
}


def imports_of(path: Path) -> set[str]:
    """Top-level names of our packages that the module imports (absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(LAYER)


def violations(root: Path) -> list[str]:
    bad = []
    for package, layer in LAYER.items():
        for path in sorted((root / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            rel = path.relative_to(root).as_posix()
            for other in sorted(imports_of(path) - {package}):
                if LAYER[other] >= layer:
                    bad.append(f"{rel} imports {other} (layer {LAYER[other]} >= {layer})")
                elif package == "spherefed" and not rel.startswith("spherefed/privacy/"):
                    bad.append(f"{rel} imports {other} outside spherefed/privacy/")
    return bad


def test_every_import_follows_the_layers() -> None:
    assert violations(ROOT) == []


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    for package in LAYER:
        (tmp_path / package).mkdir()
    (tmp_path / "crypto" / "bad.py").write_text("def f():\n    import spherefed.stats\n")
    (tmp_path / "spherefed" / "fl.py").write_text("from crypto.ring import encode\n")
    (tmp_path / "spherefed" / "privacy").mkdir()
    (tmp_path / "spherefed" / "privacy" / "plan.py").write_text("from crypto import dp\n")
    (tmp_path / "participant" / "x.py").write_text("import coordinator.store\n")
    assert violations(tmp_path) == [
        "crypto/bad.py imports spherefed (layer 1 >= 0)",
        "spherefed/fl.py imports crypto outside spherefed/privacy/",
        "participant/x.py imports coordinator (layer 2 >= 2)",
    ]
