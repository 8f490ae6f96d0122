"""The dependency rule of docs/design.md §2, checked against every run-time import
(``tests/import_graph.py``: imports inside functions, ``importlib`` calls with a literal
name, the packages an import initialises):

- every import of ours goes through the ``spherecal`` namespace (never a bare
  ``import crypto``, which could be someone else's package of that name);
- a component imports only components in lower layers, and ``spherefed`` reaches
  ``crypto`` only from ``spherefed/privacy/``;
- inside ``coordinator/`` the rooms are ordered too: ``evaluation_schedule`` <
  ``settings``/``errors`` < ``state`` < ``driver`` < ``server`` < ``main``.

If this fails, either the import or the documented rule is wrong — fix one, and keep
the doc true."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import ROOT, edges, modules, top_level_imports

LAYER = {"proto": 0, "crypto": 0, "spherefed": 1, "participant": 2, "coordinator": 2}
ROOT_LAYER = 3  # spherecal itself: the composition root
ROOM = {
    "evaluation_schedule": 0,
    "settings": 1,
    "errors": 1,
    "summary_schema": 1,
    "state": 2,
    "driver": 3,
    "server": 4,
    "main": 5,
}


def component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYER else "spherecal"


def room(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "coordinator":
        return parts[2]
    return None


def violations(root: Path = ROOT) -> list[str]:
    known = modules(root)
    bad = list(top_level_imports(known, root))
    for edge in edges(known):
        where = f"{edge.path.relative_to(root).as_posix()}:{edge.line}"
        mine, theirs = component(edge.source), component(edge.target)
        if mine != theirs:
            layer = LAYER.get(mine, ROOT_LAYER)
            other = LAYER.get(theirs, ROOT_LAYER)
            if other >= layer:
                bad.append(f"{where} imports {edge.target} (layer {other} >= {layer})")
            elif mine == "spherefed" and not edge.source.startswith("spherecal.spherefed.privacy"):
                bad.append(f"{where} imports {edge.target} outside spherefed/privacy/")
            continue
        a, b = room(edge.source), room(edge.target)
        if a in ROOM and b in ROOM and a != b and ROOM[b] >= ROOM[a]:
            bad.append(f"{where}: coordinator.{a} imports {edge.target} (room {b} is not below)")
    return sorted(set(bad))


def test_every_import_follows_the_layers() -> None:
    assert violations() == []


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    ns = tmp_path / "spherecal"
    for package in [*LAYER, "spherefed/privacy", "coordinator/state", "coordinator/server"]:
        (ns / package).mkdir(parents=True)
    for folder in [p for p in ns.rglob("*") if p.is_dir()]:
        (folder / "__init__.py").write_text("")
    (ns / "__init__.py").write_text("")
    (ns / "crypto" / "bad.py").write_text("def f():\n    import spherecal.spherefed.stats\n")
    (ns / "spherefed" / "stats.py").write_text("")
    (ns / "spherefed" / "fl.py").write_text("from spherecal.crypto.bad import f\n")
    (ns / "spherefed" / "privacy" / "plan.py").write_text("from spherecal.crypto import bad\n")
    (ns / "participant" / "x.py").write_text(
        "import importlib\nimportlib.import_module('spherecal.coordinator.state')\n"
    )
    (ns / "participant" / "y.py").write_text("import crypto\n")
    (ns / "coordinator" / "state" / "store.py").write_text(
        "from spherecal.coordinator.server import grpc\n"
    )
    (ns / "coordinator" / "server" / "grpc.py").write_text("")
    assert violations(tmp_path) == [
        "spherecal/coordinator/state/store.py:1: coordinator.state imports "
        "spherecal.coordinator.server (room server is not below)",
        "spherecal/coordinator/state/store.py:1: coordinator.state imports "
        "spherecal.coordinator.server.grpc (room server is not below)",
        "spherecal/crypto/bad.py:2 imports spherecal.spherefed (layer 1 >= 0)",
        "spherecal/crypto/bad.py:2 imports spherecal.spherefed.stats (layer 1 >= 0)",
        "spherecal/participant/x.py:2 imports spherecal.coordinator (layer 2 >= 2)",
        "spherecal/participant/x.py:2 imports spherecal.coordinator.state (layer 2 >= 2)",
        "spherecal/participant/y.py:1 imports crypto",
        "spherecal/spherefed/fl.py:1 imports spherecal.crypto outside spherefed/privacy/",
        "spherecal/spherefed/fl.py:1 imports spherecal.crypto.bad outside spherefed/privacy/",
    ]
