"""The ``spherecal`` CLI: argument validation and the reference command's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spherecal.cli import build_parser, main

REPO = Path(__file__).resolve().parents[3]


def test_reference_writes_json_with_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "out.json"
    code = main(
        [
            "reference",
            "--participants",
            "3",
            "--rounds",
            "1",
            "--local-epochs",
            "1",
            "--model",
            "mlp",
            "--alpha",
            "iid",
            "--calibration",
            "ffc,ccvr,qda",
            "--shrinkage-grid",
            "0.1",
            "0.5",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["accuracy"]) == {"none", "ffc", "ccvr", "qda", "oracle"}
    assert result["calibration"]["qda"]["chosen"] in (0.1, 0.5)
    assert result["settings"]["shrinkage_grid"] == [0.1, 0.5]
    assert result["settings"]["partition"] == "iid"
    assert result["settings"]["loss"] == "mse"  # sphere head defaults to MSE
    printed = json.loads(capsys.readouterr().out)
    assert printed["accuracy"] == result["accuracy"]


def test_learnable_head_defaults_to_ce_and_shards_select_partition() -> None:
    from spherecal.cli import _reference_config

    args = build_parser().parse_args(["reference", "--head", "learnable", "--shards", "2"])
    cfg = _reference_config(args)
    assert cfg.loss == "ce" and cfg.partition == "shards" and cfg.shards_per_client == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["reference", "--alpha", "-1"],
        ["reference", "--alpha", "lots"],
        ["reference", "--lr", "0"],
        ["reference", "--head", "nope"],
    ],
)
def test_bad_arguments_exit_2_with_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_runtime_errors_are_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["reference", "--dataset", "npz", "--data-root", "/nonexistent.npz", "--quiet"])
    assert code == 2
    assert "spherecal reference: error" in capsys.readouterr().err


def test_console_script_entry_point_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "spherecal.cli", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0 and "reference" in out.stdout


def test_sigusr1_writes_every_threads_stack_and_the_process_goes_on() -> None:
    """``spherecal coordinator`` / ``participant`` register SIGUSR1 with faulthandler
    (docs/deployment.md): a stuck run can be looked into without stopping it."""
    code = (
        "import os, signal, threading, time\n"
        "from spherecal.service_cli import _enable_faulthandler\n"
        "_enable_faulthandler()\n"
        "def parked_in_a_named_function():\n"
        "    time.sleep(30)\n"
        "threading.Thread(target=parked_in_a_named_function, daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "time.sleep(0.2)\n"
        "print('still running')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running"
    assert "parked_in_a_named_function" in done.stderr  # the other thread's stack too
    assert "most recent call first" in done.stderr
