"""No import cycle anywhere in the project (issue #12).

Every ``import`` statement of every module — including those inside functions,
which is how ``experiment`` ↔ ``experiment_report`` used to hide theirs — is an
edge of the project's import graph; the graph must be acyclic. Imports under
``if TYPE_CHECKING:`` are left out: they never run and exist precisely to name a
type without depending on its module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("proto", "crypto", "spherefed", "participant", "coordinator", "spherecal")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the project modules it imports (a ``from pkg import sub`` of a
    submodule points at the submodule, otherwise at ``pkg``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = name.split(".")
                    base = base[: len(base) - node.level + (1 if is_package else 0)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [
                    f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
                    for alias in node.names
                ]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, …, a]``, or ``None``."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    for start in sorted(graph):
        if colour[start] != white:
            continue
        path = [start]
        colour[start] = grey
        iters = [iter(sorted(graph[start]))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                colour[path.pop()] = black
                iters.pop()
            elif colour[nxt] == grey:
                return [*path[path.index(nxt) :], nxt]
            elif colour[nxt] == white:
                colour[nxt] = grey
                path.append(nxt)
                iters.append(iter(sorted(graph[nxt])))
    return None


def test_the_project_has_no_import_cycle() -> None:
    modules = _modules()
    assert "spherecal.experiment.report" in modules and "spherecal.simulate.drops" in modules
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    # the checker itself must be able to fail: a lazy import inside a function counts
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text(
        "def f():\n    from . import a\n    return a\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
    )
    (pkg / "c.py").write_text("import pkg.b\n")
    global ROOT
    saved = ROOT
    ROOT = tmp_path
    try:
        modules = {_module_name(p): p for p in sorted(pkg.rglob("*.py"))}
        graph = import_graph(modules)
    finally:
        ROOT = saved
    assert graph["pkg.b"] == {"pkg.a"}  # the TYPE_CHECKING import is not an edge
    assert find_cycle(graph) in (["pkg.a", "pkg.b", "pkg.a"], ["pkg.b", "pkg.a", "pkg.b"])
    graph["pkg.b"] = set()
    assert find_cycle(graph) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_found(package: str) -> None:
    assert any(name.split(".")[0] == package for name in _modules())
