"""The coordinator's adapter around the one registry: the aggregated vector's layout,
server state through a checkpoint (SCAFFOLD's c, FedYogi's moments) and refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spherecal.coordinator.driver.model import Checkpoints
from spherecal.coordinator.driver.strategy import Strategy
from spherecal.coordinator.settings import TrainingSettings
from spherecal.spherefed.algorithms import ALGORITHM_NAMES, Scaffold

L = 6


def _sums(rng: np.random.Generator, strategy: Strategy) -> dict[str, np.ndarray]:
    layout = strategy.layout(L)
    sums = layout.unflatten(rng.normal(size=layout.length))
    sums["weight"] = np.asarray(5.0 + rng.integers(0, 5), dtype=np.float64)
    if "tau" in sums:
        sums["tau"] = sums["weight"] * 3.0
    sums.pop("loss")
    return sums


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_server_state_survives_a_checkpoint(algorithm: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    training = TrainingSettings(algorithm=algorithm)
    original = Strategy(training, num_participants=4)
    assert original.layout(L).names[-1] == "loss"
    x = rng.normal(size=L)
    for _ in range(2):
        original.broadcast(x)
        x = original.step(x, _sums(rng, original), num_selected=4)
    path, digest = Checkpoints(tmp_path).save(1, x, original.state_dict())
    vector, state = Checkpoints.load_with_state(path, digest, L)
    resumed = Strategy(training, num_participants=4)
    resumed.load_state_dict(state)
    for key, value in original.broadcast(x).items():
        assert np.array_equal(resumed.broadcast(vector)[key], value)
    sums = _sums(rng, original)
    assert np.array_equal(
        resumed.step(vector, sums, num_selected=4), original.step(x, sums, num_selected=4)
    )


def test_scaffold_server_control_is_checkpointed_and_broadcast() -> None:
    strategy = Strategy(TrainingSettings(algorithm="scaffold"), num_participants=4)
    assert isinstance(strategy.server, Scaffold)
    x = np.zeros(L)
    assert np.array_equal(strategy.broadcast(x)["control"], np.zeros(L))
    sums = {
        "delta": np.ones(L),
        "weight": np.asarray(2.0),
        "control_delta": np.full(L, 8.0),
    }
    x = strategy.step(x, sums, num_selected=2)
    np.testing.assert_array_equal(x, np.full(L, 0.5))  # x + Σ n_kΔ_k / Σ n_k
    # c ← c + Σ Δc_k / N with N = 4 participants (not the 2 selected).
    np.testing.assert_array_equal(strategy.state_dict()["control"], np.full(L, 2.0))
    np.testing.assert_array_equal(strategy.broadcast(x)["control"], np.full(L, 2.0))


def test_bad_state_is_refused() -> None:
    avg = Strategy(TrainingSettings(), num_participants=3)
    with pytest.raises(ValueError, match="keeps no server state"):
        avg.load_state_dict({"control": np.zeros(L)})
    scaffold = Strategy(TrainingSettings(algorithm="scaffold"), num_participants=3)
    with pytest.raises(ValueError, match="unknown entries"):
        scaffold.load_state_dict({"m": np.zeros(L)})
    with pytest.raises(ValueError, match="finite"):
        scaffold.load_state_dict({"control": np.full(L, np.nan)})
    yogi = Strategy(TrainingSettings(algorithm="fedyogi"), num_participants=3)
    with pytest.raises(ValueError, match="one number"):
        yogi.load_state_dict({"m": np.zeros(L), "v": np.ones(L), "steps": np.ones(2)})
