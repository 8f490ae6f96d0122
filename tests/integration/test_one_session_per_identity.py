"""Two processes with one certificate (issue #23, item 2): the second is refused with
a line naming the identity, the first keeps its session, and the federation completes.

Before, each join replaced the other's session: the two knocked each other off every
couple of seconds ("session expired; joining again") and the federation failed with
TooFewSurvivors, naming neither the duplicate nor the identity.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from spherecal.simulate import Simulation, SimulationSettings
from spherecal.simulate.launch import launch
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _wait_for(path: Path, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} never appeared in {path}")


def test_a_second_process_with_the_same_certificate_is_refused_and_the_first_finishes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=6),
        out=out,
        calibration=("ffc",),
        tls=True,
        timeout_s=240,
    )
    sim = Simulation(settings)
    twin_log = out / "logs" / "p0-twin.log"
    twin = None
    try:
        sim.start_coordinator()
        sim.start_participants()
        coordinator_log = out / "logs" / "coordinator.log"
        _wait_for(coordinator_log, "p0 joined", 120)
        # the same certificate, identity key and roster id, another state directory:
        # a copy of the site's process started by mistake (or on a second machine)
        config = (out / "participants" / "p0.toml").read_text()
        twin_config = out / "participants" / "p0-twin.toml"
        assert 'state_dir = "../state/p0"' in config
        twin_config.write_text(
            config.replace("participant-p0", "participant-p0-twin").replace(
                'state_dir = "../state/p0"', 'state_dir = "../state/p0-twin"'
            )
        )
        with twin_log.open("ab") as log:
            twin = launch(
                settings.launcher,
                ["participant", "--config", str(twin_config)],
                cwd=out,
                env=dict(os.environ),
                stdout_log=log,
                stderr_log=log,
            )
        line = _wait_for(twin_log, "already connected", 120)
        assert sim.wait_coordinator(240) == 0
    finally:
        if twin is not None:
            twin.kill()
            twin.wait(timeout=30)
        sim.close()
    # the twin was told who holds the identity
    assert "'p0' is already connected from" in line
    # the coordinator logged each refusal, naming the identity and both addresses
    coordinator_text = coordinator_log.read_text()
    refusals = [ln for ln in coordinator_text.splitlines() if "refused join from 'p0'" in ln]
    # a twin that retries after the end is refused for that (seen on a loaded box)
    duplicates = [ln for ln in refusals if "federation has ended" not in ln]
    assert duplicates and all("a second process with this identity" in ln for ln in duplicates)
    # the first process was never knocked off, and the federation completed
    assert "session expired" not in (out / "logs" / "p0.log").read_text()
    summary = json.loads((out / "coordinator" / "out" / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("status_reasons")
