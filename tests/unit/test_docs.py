"""The documentation holds together: every relative link in README.md and docs/
resolves to a file in the repository (and, for ``#anchor`` links into Markdown, to a
heading there), the README stays a short front door, and nothing tracked points
outside the repository (``../shared``) — a reader of a clone has only the clone."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_LIMIT = 12 * 1024

LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    out = []
    for ch in text:
        if ch in " -":
            out.append("-" if ch == " " else ch)
        elif ch == "_" or ch.isalnum():  # Unicode letters and digits (ε) are kept
            out.append(ch)
    return "".join(out)


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    result = set()
    for line in text.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = CODE.sub("", text)
    return LINK.findall(text) + IMAGE.findall(text)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no such file")
            continue
        if root not in dest.parents:
            problems.append(f"{target}: outside the repository")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading with anchor #{anchor}")
    return problems


def test_the_link_checker_catches_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# Top heading\n\n## `spherecal audit`: the report\n\n"
        "[ok](#top-heading) [ok2](#spherecal-audit-the-report) [bad](missing.md) "
        "[bad2](#nowhere) [web](https://example.org) `[code](not-a-link.md)`\n"
        "```\n[in a fence](fence.md)\n```\n"
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("[out](../../x.md) [up](../a.md#top-heading)\n")
    (tmp_path.parent / "x.md").write_text("outside\n")
    assert broken_links(tmp_path / "sub" / "b.md", tmp_path) == [
        "../../x.md: outside the repository"
    ]
    found = broken_links(tmp_path / "a.md", tmp_path)
    assert found == ["missing.md: no such file", "#nowhere: no heading with anchor #nowhere"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_readme_is_a_short_front_door() -> None:
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) < README_LIMIT, f"README.md is {len(readme)} bytes"
    text = readme.decode()
    for command in ("make demo", "make test"):
        assert command in text
    assert "docs/design.md" in text


def test_no_tracked_file_points_outside_the_repository() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    if not listed:
        pytest.skip("not a git checkout: nothing tracked to check")
    offenders = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if "../shared" in text or "DESIGN §" in text or "DESIGN.md" in text:
            offenders.append(name)
    assert offenders == []


def test_baselines_page_quotes_the_committed_tables() -> None:
    """docs/baselines.md's result tables are copies of the committed ``table.md`` files
    (``python -m spherecal.baselines_docs``): a rerun cannot leave old numbers there."""
    from spherecal.baselines_docs import DOC, main, render

    text = DOC.read_text()
    assert text.count("<!-- generated: ") >= 6
    assert render(text) == text, "docs/baselines.md is stale: python -m spherecal.baselines_docs"
    assert main(["--check"]) == 0


def test_a_changed_table_makes_the_baselines_page_stale(tmp_path: Path) -> None:
    from spherecal.baselines_docs import DOC, RESULTS, main

    results = tmp_path / "baselines"
    shutil.copytree(RESULTS, results)
    doc = tmp_path / "baselines.md"
    doc.write_text(DOC.read_text())
    table = results / "methods" / "table.md"
    old = "| FedAvg | none | 94.9 ± 1.0 |"
    assert old in table.read_text() and old in doc.read_text()
    table.write_text(table.read_text().replace(old, "| FedAvg | none | 11.1 ± 1.0 |"))
    assert main(["--check", "--doc", str(doc)]) == 1
    assert main(["--doc", str(doc)]) == 0  # regenerated …
    assert "| FedAvg | none | 11.1 ± 1.0 |" in doc.read_text()  # … with the new numbers
    assert main(["--check", "--doc", str(doc)]) == 0


def test_the_changelog_is_cut_into_releases_and_the_version_follows_the_last() -> None:
    """``## [Unreleased]`` on top, then dated releases, newest first; the version
    (defined once, in pyproject.toml, read through ``importlib.metadata``) is later
    than the last release, so a build from main never claims a released number."""
    import tomllib

    from packaging.version import Version

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    heads = re.findall(r"^## \[([^\]]+)\](.*)$", text, flags=re.M)
    assert heads[0] == ("Unreleased", ""), heads[:2]
    releases = heads[1:]
    assert releases, "no release section"
    for name, rest in releases:
        assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest), f"{name}: {rest!r}"
    versions = [Version(name) for name, _ in releases]
    assert versions == sorted(versions, reverse=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert Version(project["version"]) > versions[0]
