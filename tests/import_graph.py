"""The project's import graph, as Python runs it — shared by the layering and the
import-cycle tests.

Modules are found through the one import namespace: ``spherecal/`` with its linked
components (``spherecal/crypto`` → ``crypto/`` …), so every module has the name it is
imported by. An edge is anything that imports a module at run time:

- every ``import`` / ``from … import`` statement, inside functions too (a lazy import
  is still an import), except under ``if TYPE_CHECKING:`` (those never run);
- ``importlib.import_module("spherecal.…")`` with a literal name (a back-edge written
  as a string is still an edge);
- the packages a statement initialises on the way: ``import spherecal.coordinator.main``
  runs ``spherecal/coordinator/__init__.py`` first, so the importer depends on it too —
  except the importer's own ancestors, which are already initialising when it runs.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "spherecal"
# The components linked into the namespace (top-level folders of the repository).
COMPONENTS = ("proto", "crypto", "spherefed", "participant", "coordinator")


@dataclass(frozen=True)
class Edge:
    """One import of ``target`` by ``source``, at ``line`` of ``path``."""

    source: str
    target: str
    path: Path
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT, namespace: str = NAMESPACE) -> dict[str, Path]:
    """Every module under ``root/namespace`` (following the component links) → its path
    as reached through the namespace."""
    found: dict[str, Path] = {}
    # os.walk, not Path.rglob: rglob does not follow the component links before 3.13
    for folder, _, files in os.walk(root / namespace, followlinks=True):
        for file in sorted(files):
            if file.endswith(".py") and not file.endswith(("_pb2.py", "_pb2_grpc.py")):
                path = Path(folder) / file
                found[module_name(path, root)] = path
    return dict(sorted(found.items()))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_module_literal(node: ast.Call) -> str | None:
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )
    if named and node.args and isinstance(node.args[0], ast.Constant):
        value = node.args[0].value
        return value if isinstance(value, str) else None
    return None


def raw_imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """Absolute names ``name`` imports at run time, with their lines (module targets
    resolved: ``from pkg import sub`` of a submodule names the submodule)."""
    is_package = path.name == "__init__.py"
    out: list[tuple[str, int]] = []
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), str(path))]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                sub = f"{prefix}.{alias.name}"
                out.append((sub if sub in known else prefix, node.lineno))
        elif isinstance(node, ast.Call):
            literal = _import_module_literal(node)
            if literal is not None:
                out.append((literal, node.lineno))
        stack.extend(ast.iter_child_nodes(node))
    return out


def edges(known: dict[str, Path]) -> list[Edge]:
    """Every run-time import edge between the project's modules (see the module doc)."""
    found: list[Edge] = []
    for name, path in known.items():
        own_ancestors = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}
        if path.name == "__init__.py":
            own_ancestors.add(name)
        for target, line in raw_imports(name, path, known):
            parts = target.split(".")
            chain = [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
            for step in chain:
                if step in known and step != name and step not in own_ancestors:
                    found.append(Edge(name, step, path, line))
    return found


def graph(known: dict[str, Path]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {name: set() for name in known}
    for edge in edges(known):
        out[edge.source].add(edge.target)
    return out


def top_level_imports(known: dict[str, Path], root: Path = ROOT) -> list[str]:
    """Imports of our components by a bare top-level name (``import crypto``): outside
    the namespace, and so possibly someone else's package of that name."""
    bad = []
    for name, path in known.items():
        for target, line in raw_imports(name, path, known):
            if target.split(".")[0] in COMPONENTS:
                bad.append(f"{path.relative_to(root).as_posix()}:{line} imports {target}")
    return bad
