"""Every bench script starts as the docs run it: ``python bench/<name>.py``.

docs/performance.md and the bench docstrings give each figure's command as a script path,
not ``python -m``; a script that imports a sibling (``bench._report``, ``bench.service``)
only works that way if it makes the repository root importable itself. Each script is run
with ``--help`` from a directory outside the repository, so neither the working directory
nor pytest's own ``sys.path`` can stand in for that.
"""

from __future__ import annotations

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


def test_the_bench_folder_has_scripts() -> None:
    assert len(SCRIPTS) >= 10, [p.name for p in SCRIPTS]


@pytest.mark.long
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script_runs_from_its_path(script: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
