"""Acceptance: the documented reference command on digits (issue: foundation).

``spherecal reference --dataset digits --participants 10 --alpha 0.1 --json out.json``
must finish in a few minutes on 2 cores, write the accuracies as fractions with the
settings, and SphereFed + FFC must land within 1.0 accuracy point of its oracle.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.long
def test_reference_digits_alpha_01_ffc_near_oracle(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spherecal.cli",
            "reference",
            "--dataset",
            "digits",
            "--participants",
            "10",
            "--alpha",
            "0.1",
            "--json",
            str(out),
            "--threads",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr
    assert "round 30/30" in proc.stderr  # progress is shown
    result = json.loads(out.read_text())
    acc = result["accuracy"]
    for key in ("none", "ffc", "ccvr", "oracle"):
        assert 0.0 <= acc[key] <= 1.0
    settings = result["settings"]
    assert (settings["dataset"], settings["participants"], settings["alpha"]) == ("digits", 10, 0.1)
    assert settings["head"] == "sphere" and settings["loss"] == "mse"
    assert acc["ffc"] >= acc["oracle"] - 0.010, acc
    # Training actually learned something on this skewed split.
    assert acc["none"] > 0.8, acc
