"""Every bench script starts as the docs run it: ``python bench/<name>.py``.

docs/performance.md and the bench docstrings give each figure's command as a script path,
not ``python -m``; a script that imports a sibling (``bench._report``, ``bench.service``)
only works that way if it makes the repository root importable itself. Each script is run
with ``--help`` from a directory outside the repository, so neither the working directory
nor pytest's own ``sys.path`` can stand in for that.

How: one fresh interpreter (outside the repository, no ``PYTHONPATH``) imports the
installed heavy dependencies once — torch, grpc and the installed ``spherecal`` stack, never
``bench`` or ``tests`` — and then *forks* one child per script. Each child starts from
that same state, sets ``sys.argv`` and ``sys.path[0]`` exactly as ``python
bench/<name>.py`` does (the script's own folder, not the repository root) and runs the
file as ``__main__``; its exit status, stdout and stderr come back per script. Starting
each script in its own fresh interpreter costs about 3 CPU-s of torch and project
imports each (14 of the scripts), the same modules every time; forked, they are imported
once. What each script must do itself is unchanged: no child sees the repository root
on its path unless the script puts it there (``test_a_script_without_its_path_fix_fails``
checks that the harness would catch a script that does not).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(
    p
    for p in BENCH.glob("*.py")
    if not p.name.startswith("_") and 'if __name__ == "__main__"' in p.read_text()
)
# Installed modules the parent imports before forking (what the scripts import most;
# a script importing anything else imports it itself, in its child).
PRELOAD = ("numpy", "torch", "grpc", "spherecal.simulate", "spherecal.spherefed.reference")

# Run with `python -c`: sys.path[0] is then '' (the working directory, outside the
# repository); each child replaces it with the script's folder as `python SCRIPT` would.
_RUNNER = r"""
import importlib, json, os, runpy, sys
out, preload, scripts = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
for name in preload:
    importlib.import_module(name)
assert "bench" not in sys.modules and "tests" not in sys.modules
results = {}
for k, script in enumerate(scripts):
    stdout, stderr = os.path.join(out, f"{k}.out"), os.path.join(out, f"{k}.err")
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for fd, path in ((1, stdout), (2, stderr)):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            sys.argv = [script, "--help"]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    results[script] = {
        "returncode": os.waitstatus_to_exitcode(status),
        "stdout": open(stdout, encoding="utf-8", errors="replace").read(),
        "stderr": open(stderr, encoding="utf-8", errors="replace").read(),
    }
with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f)
"""


def _run_help(scripts: list[Path], cwd: Path) -> dict[str, dict[str, object]]:
    """``python SCRIPT --help`` for each script, forked from one preloaded interpreter
    started in ``cwd`` without ``PYTHONPATH``: ``{script path: returncode, stdout,
    stderr}``."""
    out = cwd / "help-out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(out), ",".join(PRELOAD), *map(str, scripts)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results: dict[str, dict[str, object]] = json.loads((out / "results.json").read_text())
    return results


@pytest.fixture(scope="module")
def helps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    return _run_help(SCRIPTS, tmp_path_factory.mktemp("bench-help"))


def test_the_bench_folder_has_scripts() -> None:
    assert len(SCRIPTS) >= 10, [p.name for p in SCRIPTS]


@pytest.mark.long
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script_runs_from_its_path(script: Path, helps: dict[str, dict[str, object]]) -> None:
    done = helps[str(script)]
    assert done["returncode"] == 0, str(done["stderr"])[-2000:]
    assert "usage:" in str(done["stdout"])


@pytest.mark.long
def test_a_script_without_its_path_fix_fails(tmp_path: Path) -> None:
    """The harness itself: a script that imports a sibling (``bench._report``) but does
    not put the repository root on its path fails there, and the same script with the
    fix passes (a harness that leaked the root into the children would pass both).
    Both are copies in a throw-away tree laid out as the repository."""
    source = (BENCH / "ci_timeline.py").read_text()
    fix = "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))"
    assert fix in source and "from bench._report import" in source
    tree = tmp_path / "repo" / "bench"
    tree.mkdir(parents=True)
    for name in ("__init__.py", "_report.py"):
        (tree / name).write_text((BENCH / name).read_text())
    with_fix, without_fix = tree / "with_fix.py", tree / "without_fix.py"
    with_fix.write_text(source)
    without_fix.write_text(source.replace(fix, "pass"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    got = _run_help([with_fix, without_fix], elsewhere)
    assert got[str(with_fix)]["returncode"] == 0, got[str(with_fix)]["stderr"]
    assert "usage:" in str(got[str(with_fix)]["stdout"])
    assert got[str(without_fix)]["returncode"] != 0
    assert "No module named 'bench'" in str(got[str(without_fix)]["stderr"])
