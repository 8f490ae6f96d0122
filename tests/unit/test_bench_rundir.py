"""A benchmark's run directory goes when the benchmark ends, unless it is wanted
(``bench/_rundir.py``): one ``bench/ffc_stage.py`` invocation leaves ~400 MB of state."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from bench._rundir import RunDirectory, add_run_directory_option

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary folder ``tempfile`` hands out, empty at the start."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    return root


def test_a_temporary_folder_is_removed_after_a_clean_run(tmp_root: Path) -> None:
    run_dir = RunDirectory(None, prefix="bench-x-")
    with run_dir as root:
        assert root.parent == tmp_root and root.name.startswith("bench-x-")
        (root / "state").mkdir()
        (root / "state" / "journal.db").write_bytes(b"x" * 1000)
        assert run_dir.kept_path() is None
    assert not root.exists()
    assert list(tmp_root.iterdir()) == []


def test_a_named_folder_is_made_and_kept(tmp_path: Path) -> None:
    chosen = tmp_path / "runs" / "here"
    run_dir = RunDirectory(chosen, prefix="bench-x-")
    with run_dir as root:
        assert root == chosen and root.is_dir()
        (root / "log").write_text("kept")
    assert (chosen / "log").read_text() == "kept"
    assert run_dir.kept_path() == str(chosen)


def test_a_failed_benchmark_keeps_its_folder_and_says_where(
    tmp_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        pytest.raises(RuntimeError, match="run 2 failed"),
        RunDirectory(None, prefix="bench-x-") as root,
    ):
        (root / "coordinator.log").write_text("the reason")
        raise RuntimeError("run 2 failed")
    assert (root / "coordinator.log").read_text() == "the reason"
    err = capsys.readouterr().err
    assert "kept (the benchmark raised RuntimeError)" in err and str(root) in err


def test_a_failed_run_inside_a_finished_benchmark_keeps_the_folder(
    tmp_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = RunDirectory(None, prefix="bench-x-")
    with run_dir as root:
        run_dir.keep("seed 3 ended failed")
        run_dir.keep("seed 5 ended failed")
        assert run_dir.kept_path() == str(root)
    assert root.is_dir()
    assert f"kept (seed 3 ended failed; seed 5 ended failed): {root}" in capsys.readouterr().err


def test_an_interrupted_benchmark_removes_its_temporary_folder(tmp_root: Path) -> None:
    with pytest.raises(KeyboardInterrupt), RunDirectory(None, prefix="bench-x-") as root:
        (root / "partial").write_text("half")
        raise KeyboardInterrupt
    assert not root.exists()


def test_no_path_is_named_before_the_block() -> None:
    assert RunDirectory(None, prefix="bench-x-").kept_path() is None


def test_no_bench_script_leaves_a_temporary_folder_behind() -> None:
    """Every script that makes run directories goes through :class:`RunDirectory`; a
    bare ``mkdtemp`` (never removed) would fill the disk again. The one exception builds a
    small shared library and then replaces the process with ``execve``."""
    allowed = {"_rundir.py": 1, "store_durability.py": 1}
    for script in sorted(BENCH.glob("*.py")):
        found = len(re.findall(r"\bmkdtemp\(", script.read_text()))
        assert found == allowed.get(script.name, 0), f"{script.name}: {found} mkdtemp call(s)"


def test_the_option_names_a_folder_or_leaves_the_default() -> None:
    parser = argparse.ArgumentParser()
    add_run_directory_option(parser, "--keep", kept_when="a run failed", purpose=", for X")
    assert parser.parse_args([]).keep is None
    assert parser.parse_args(["--keep", "runs"]).keep == Path("runs")
    text = " ".join(parser.format_help().split())
    assert "keep the run directories here, for X (by default a temporary folder," in text
    assert "removed at the end unless a run failed)" in text
