"""No run-time import cycle anywhere in the project (issue #12, #21).

The graph is ``tests/import_graph.py``'s: every import statement (inside functions
too), every ``importlib.import_module`` with a literal name — the back-edge
``simulate/launch.py`` once hid as a string — and the package ``__init__`` each import
runs. Imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import COMPONENTS, graph, modules


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``g`` as a path ``[a, b, …, a]``, or ``None``."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(g, white)
    for start in sorted(g):
        if colour[start] != white:
            continue
        path = [start]
        colour[start] = grey
        iters = [iter(sorted(g[start]))]
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
                iters.append(iter(sorted(g[nxt])))
    return None


def test_the_project_has_no_import_cycle() -> None:
    known = modules()
    assert "spherecal.experiment.report" in known and "spherecal.simulate.drops" in known
    cycle = find_cycle(graph(known))
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    # the checker itself must be able to fail: a lazy import inside a function, an
    # importlib call and a package __init__ all count; TYPE_CHECKING imports do not
    pkg = tmp_path / "spherecal"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from spherecal.sub import d\n")
    (pkg / "a.py").write_text("from spherecal.b import f\n")
    (pkg / "b.py").write_text(
        "def f():\n    from . import a\n    return a\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from spherecal import c\n"
    )
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('spherecal.sub.d')\n")
    (pkg / "sub" / "d.py").write_text("def g():\n    import spherecal.c\n")
    g = graph(modules(tmp_path))
    assert g["spherecal.b"] == {"spherecal.a"}  # the TYPE_CHECKING import is not an edge
    assert g["spherecal.c"] == {"spherecal.sub", "spherecal.sub.d"}  # importlib + __init__
    assert find_cycle(g) is not None
    g["spherecal.b"] = set()
    assert find_cycle(g) == ["spherecal.c", "spherecal.sub", "spherecal.sub.d", "spherecal.c"]
    g["spherecal.sub.d"] = set()
    assert find_cycle(g) is None


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_is_found_in_the_namespace(component: str) -> None:
    assert any(name.startswith(f"spherecal.{component}.") for name in modules())
