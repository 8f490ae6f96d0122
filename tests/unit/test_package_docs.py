"""Every package's docstring lists its modules (and subpackages), so a reader who
opens ``__init__.py`` sees the whole room; a module added without a line there, or a
line left behind for a module that is gone, fails here."""

from __future__ import annotations

import ast
import re

import pytest

from tests.import_graph import modules

#: Every package, ``spherecal`` itself included: its composition-root modules (the
#: audit, certs, preflight, …) were the only ones no docstring listed.
PACKAGES = sorted(name for name, path in modules().items() if path.name == "__init__.py")


def _children(package: str) -> set[str]:
    depth = package.count(".") + 1
    return {name.split(".")[depth] for name in modules() if name.startswith(package + ".")}


def _named(doc: str) -> set[str]:
    """Module names the docstring mentions: ````name````, ``:mod:`.name```` or the last
    part of ``:mod:`~spherecal.pkg.name```` (the styles the packages use)."""
    plain = set(re.findall(r"``(\w+)``", doc))
    refs = {ref.rsplit(".", 1)[-1] for ref in re.findall(r":mod:`[~.]*([\w.]+)`", doc)}
    return plain | refs


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_docstring_lists_its_modules(package: str) -> None:
    path = modules()[package]
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    children = _children(package)
    public = {child for child in children if not child.startswith("_")}
    missing = public - _named(doc)
    assert not missing, f"{package}: not in its docstring: {sorted(missing)}"
    # a table row (````name````  what it is) for a module that is gone
    rows = set(re.findall(r"^``(\w+)``  ", doc, flags=re.MULTILINE))
    assert not rows - children, f"{package}: listed but absent: {sorted(rows - children)}"
