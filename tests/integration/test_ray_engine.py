"""``--engine ray`` gives the federation ``--engine processes`` gives.

The same 5-participant secure federation (digits, 2 rounds, FFC) runs once with a
process per participant and once as virtual participants on 2 Ray workers (a local
Ray instance of 2 CPUs, no dashboard), with the same two faults: p4 dies in round
2's training and p3 half-way through its masked FFC upload (so its masks are
recovered). Same seed, same survivors ⇒ the same accuracies, per-round losses and
aggregates, bit for bit; and the ray engine reports its kills like the process
engine does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from participant.faults import HaltPoint
from spherecal.simulate import Drop, SimulationSettings, run_simulation
from spherefed.runner import ReferenceConfig

pytest.importorskip("ray")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DROPS = (Drop("p4", HaltPoint("train", "r2")), Drop("p3", HaltPoint("masked", "ffc")))


def _settings(out: Path) -> SimulationSettings:
    return SimulationSettings(
        reference=ReferenceConfig(participants=5, model="mlp", rounds=2, alpha=0.5, seed=3),
        out=out,
        calibration=("ffc",),
        drops=DROPS,
        chunk_entries=1024,  # FFC in 10 chunks: p3's upload is cut mid-stream
        timeout_s=300,
    )


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    from spherecal.engines.ray import RayEngineSettings, run_ray_simulation

    processes = run_simulation(_settings(tmp_path_factory.mktemp("processes")))
    ray_run = run_ray_simulation(
        _settings(tmp_path_factory.mktemp("ray")), RayEngineSettings(workers=2, worker_cpus=1)
    )
    return processes, ray_run


def test_ray_engine_reproduces_the_process_engine(
    both: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    processes, ray_run = both
    assert processes["status"] == "completed", processes["errors"]
    assert ray_run["status"] == "completed", ray_run["errors"]
    assert ray_run["engine"]["name"] == "ray" and ray_run["engine"]["workers"] == 2
    assert ray_run["accuracy"] == processes["accuracy"]
    assert ray_run["accuracy"]["ffc"] is not None
    for a, b in zip(ray_run["per_round"], processes["per_round"], strict=True):
        assert a["contributors"] == b["contributors"]
        assert (a["train_loss"], a["test_accuracy"]) == (b["train_loss"], b["test_accuracy"])
    jobs = {(j["purpose"], j["round"]): j for j in ray_run["jobs"]}
    for job in processes["jobs"]:
        mine = jobs[(job["purpose"], job["round"])]
        assert mine["contributors"] == job["contributors"], job["purpose"]
        assert mine["dropouts"] == job["dropouts"]
    assert ray_run["statistics"]["ffc"] == processes["statistics"]["ffc"]


def test_ray_engine_drops_land_where_asked(
    both: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, ray_run = both
    assert ray_run["drops_not_triggered"] == []
    landed = {(d["participant"], d["stage"], d["job"]) for d in ray_run["dropped"]}
    assert landed == {("p4", "train", "update"), ("p3", "masked", "ffc")}
    assert ray_run["exit_codes"] == {"p0": 0, "p1": 0, "p2": 0, "p3": -9, "p4": -9}
    ffc = next(j for j in ray_run["jobs"] if j["purpose"] == "ffc")
    assert ffc["dropouts"] == ["p3"]  # shared, then cut mid-upload: masks recovered
    assert ffc["contributors"] == ["p0", "p1", "p2"]
