"""A finished federation's state directory is read-only to a restarted coordinator
(issue #23, item 1): a 3-site mutual-TLS federation runs to completion; the real
``spherecal coordinator`` restarted on its state reports the stored result and exits
0, and the summary, the results, the database and every site's models are byte-for-byte
what they were. ``--new-federation`` then sets the finished federation aside whole
(nothing deleted) before a new one starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]


def _snapshot(out: Path) -> dict[str, bytes]:
    """Every file of the result: the coordinator's state and outputs, the sites'
    models, results.json (logs and the port file aside: not results)."""
    files: dict[str, bytes] = {}
    for folder in ("coordinator/state", "coordinator/out", "out", "state"):
        for path in sorted((out / folder).rglob("*")):
            if path.is_file():
                files[str(path.relative_to(out))] = path.read_bytes()
    files["results.json"] = (out / "results.json").read_bytes()
    return files


def _coordinator(out: Path, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spherecal.cli", "coordinator", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        cwd=out,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("finished")
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=2),
        out=out,
        calibration=("ffc",),
        tls=True,
        timeout_s=240,
    )
    t0 = time.monotonic()
    with Simulation(settings) as sim:
        sim.start_coordinator()
        sim.start_participants()
        assert sim.wait_coordinator(240) == 0
        results = dict[str, Any](
            sim.results(sim.wait_participants(timeout=60), time.monotonic() - t0)
        )
    (out / "results.json").write_text(json.dumps(results, indent=2))
    assert results["status"] == "completed", results["status_reasons"]
    yield out, results


def test_restart_on_a_finished_federation_changes_nothing(
    finished: tuple[Path, dict[str, Any]],
) -> None:
    out, results = finished
    before = _snapshot(out)
    assert any(k.startswith("out/p0/model_") for k in before), sorted(before)
    restarted = _coordinator(out, out / "coordinator.toml")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    shown = json.loads(restarted.stdout)
    assert shown["status"] == "completed"
    assert shown["accuracy"] == results["accuracy"]  # the stored result, reported
    assert "already ended completed" in restarted.stderr
    assert "resuming" not in restarted.stderr and "listening" not in restarted.stderr
    after = _snapshot(out)
    assert after.keys() == before.keys()
    changed = [name for name in before if before[name] != after[name]]
    assert not changed, changed


def test_new_federation_sets_the_finished_one_aside_whole(
    finished: tuple[Path, dict[str, Any]],
) -> None:
    out, _ = finished
    before = _snapshot(out)
    config = tomllib.loads((out / "coordinator.toml").read_text())
    config.setdefault("timeouts", {})["join_s"] = 1.0  # nobody joins: it ends at once
    quick = out / "coordinator-new.toml"
    quick.write_text(tomli_w.dumps(config))
    started = _coordinator(out, quick, "--new-federation")
    assert started.returncode == 1, started.stderr[-3000:]  # the new one failed: nobody came
    assert "--new-federation: federation" in started.stderr
    assert "starting a NEW federation" in started.stderr
    state_aside = sorted((out / "coordinator/state").glob("set-aside-*"))
    out_aside = sorted((out / "coordinator/out").glob("set-aside-*"))
    assert len(state_aside) == 1 and len(out_aside) == 1
    # the finished federation, whole: its database and its summary, byte for byte
    assert (state_aside[0] / "state.db").read_bytes() == before["coordinator/state/state.db"]
    assert (out_aside[0] / "summary.json").read_bytes() == before["coordinator/out/summary.json"]
    for name, data in before.items():
        if name.startswith("coordinator/state/checkpoints/"):
            moved = state_aside[0] / "checkpoints" / Path(name).name
            assert moved.read_bytes() == data, name
    # the new federation wrote its own summary, with its own id
    new = json.loads((out / "coordinator/out/summary.json").read_text())
    old = json.loads(before["coordinator/out/summary.json"])
    assert new["federation_id"] != old["federation_id"] and new["status"] == "failed"
    assert re.search(r"only 0 of 3 participants joined", " ".join(new["status_reasons"]))
    # the sites' models were not the coordinator's to touch
    assert all(
        (out / name).read_bytes() == data
        for name, data in before.items()
        if name.startswith("out/")
    )
