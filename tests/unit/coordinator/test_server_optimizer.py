"""FedAdam / FedYogi through the service: the server step against hand-computed
Adam / Yogi, the optimiser state through checkpoints, and an in-process federation
that reproduces the reference runner exactly and resumes the optimiser's moments."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.driver.model import Checkpoints
from spherecal.coordinator.driver.strategy import Strategy
from spherecal.coordinator.settings import CoordinatorSettings, ModelSettings, TrainingSettings
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.store import Store
from spherecal.inprocess_transport import InProcessFederation
from spherecal.participant.settings import ParticipantSettings
from spherecal.spherefed.reference import ReferenceConfig, run_reference
from tests.unit.coordinator.helpers import plaintext_federation

B1, B2, TAU = 0.9, 0.99, 1e-3  # Reddi et al. 2021's defaults


def _strategy(training: TrainingSettings) -> Strategy:
    return Strategy(training, num_participants=3)


def _step(strategy: Strategy, x: np.ndarray, delta_sum: np.ndarray, weight: float) -> np.ndarray:
    sums = {"delta": delta_sum, "weight": np.asarray(weight, dtype=np.float64)}
    return strategy.step(x, sums, num_selected=3)


def _hand_step(
    x: np.ndarray, d: np.ndarray, m: np.ndarray, v: np.ndarray, eta: float, variant: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 2 of Reddi et al., written out element by element (independent of
    the vectorised implementation)."""
    x, m, v = x.copy(), m.copy(), v.copy()
    for i in range(x.size):
        m[i] = B1 * m[i] + (1 - B1) * d[i]
        if variant == "adam":
            v[i] = B2 * v[i] + (1 - B2) * d[i] ** 2
        else:
            sign = 1.0 if v[i] > d[i] ** 2 else (-1.0 if v[i] < d[i] ** 2 else 0.0)
            v[i] = v[i] - (1 - B2) * d[i] ** 2 * sign
        x[i] = x[i] + eta * m[i] / (v[i] ** 0.5 + TAU)
    return x, m, v


@pytest.mark.parametrize("algorithm", ["fedadam", "fedyogi"])
def test_server_step_is_algorithm_2_on_the_average_update(algorithm: str) -> None:
    rng = np.random.default_rng(0)
    strategy = _strategy(TrainingSettings(algorithm=algorithm, fedopt_lr=0.05))
    assert strategy.name == algorithm
    x = rng.normal(size=6)
    m, v = np.zeros(6), np.full(6, TAU**2)
    for _ in range(3):
        delta_sum, weight_sum = rng.normal(size=6) * 40.0, 40.0 + rng.integers(0, 20)
        expected, m, v = _hand_step(x, delta_sum / weight_sum, m, v, 0.05, algorithm[3:])
        x = _step(strategy, x, delta_sum, float(weight_sum))
        np.testing.assert_allclose(x, expected, rtol=1e-12, atol=1e-15)
    state = strategy.state_dict()
    np.testing.assert_allclose(state["m"], m, rtol=1e-12)
    np.testing.assert_allclose(state["v"], v, rtol=1e-12)
    assert state["steps"][0] == 3


def test_optimizer_state_survives_a_checkpoint(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    training = TrainingSettings(algorithm="fedyogi")
    original = _strategy(training)
    x = rng.normal(size=5)
    for _ in range(2):
        x = _step(original, x, rng.normal(size=5), 3.0)
    path, digest = Checkpoints(tmp_path).save(1, x, original.state_dict())
    vector, state = Checkpoints.load_with_state(path, digest, 5)
    resumed = _strategy(training)
    resumed.load_state_dict(state)
    step = rng.normal(size=5)
    assert np.array_equal(_step(resumed, vector, step, 3.0), _step(original, x, step, 3.0))


def test_stateless_checkpoints_and_bad_state_are_refused(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path)
    path, digest = checkpoints.save(0, np.zeros(4))
    assert Checkpoints.load_with_state(path, digest, 4)[1] == {}
    # A FedAvg federation refuses optimiser state; FedYogi refuses malformed moments.
    with pytest.raises(ValueError, match="no server state"):
        _strategy(TrainingSettings()).load_state_dict({"m": np.zeros(4)})
    yogi = _strategy(TrainingSettings(algorithm="fedyogi"))
    with pytest.raises(ValueError, match=r"needs \['m', 'steps', 'v'\]"):
        yogi.load_state_dict({"m": np.zeros(4)})
    bad = {"m": np.zeros(4), "v": np.full(4, -1.0), "steps": np.ones(1)}
    with pytest.raises(ValueError, match="non-negative"):
        yogi.load_state_dict(bad)
    with pytest.raises(ValueError, match="fedopt_lr"):
        TrainingSettings(algorithm="fedadam", fedopt_lr=0.0)
    # A checkpoint with an entry that is neither the vector nor strategy state.
    torch.save({"vector": torch.zeros(4, dtype=torch.float64), "x": torch.zeros(1)}, path)
    from spherecal.coordinator.driver.model import file_sha256

    with pytest.raises(ValueError, match="unknown entry"):
        Checkpoints.load_with_state(path, file_sha256(Path(path)), 4)


N, ROUNDS = 3, 2


def _settings(tmp: Path) -> tuple[CoordinatorSettings, list[ParticipantSettings]]:
    training = TrainingSettings(rounds=ROUNDS, algorithm="fedadam", fedopt_lr=0.02)
    return plaintext_federation(tmp, ModelSettings(extractor="mlp"), training, n=N)


def test_fedadam_federation_reproduces_the_reference_and_resumes_its_moments(
    tmp_path: Path,
) -> None:
    torch.set_num_threads(1)
    cs, ps = _settings(tmp_path)
    fed = InProcessFederation(cs, ps).start()
    summary = fed.join(timeout=240)
    assert summary["status"] == "completed", fed.messages[-20:]
    reference = run_reference(
        ReferenceConfig(
            participants=N, model="mlp", rounds=ROUNDS, algorithm="fedadam", fedopt_lr=0.02
        )
    )
    assert reference["settings"]["algorithm"] == "fedadam"
    assert summary["accuracy"]["none"] == reference["accuracy"]["none"]
    assert summary["accuracy"]["ffc"] == reference["accuracy"]["ffc"]
    central = summary["central_accuracy"]
    assert central is not None and central["ffc"] == reference["accuracy"]["ffc"]
    for ours, theirs in zip(summary["per_round"], reference["per_round"], strict=True):
        assert ours["train_loss"] == theirs["train_loss"]
        assert ours["test_accuracy"] == theirs["test_accuracy"]
    final_state = fed.federation.strategy.state_dict()
    assert final_state["steps"][0] == ROUNDS

    # A coordinator restarted on this state directory resumes model *and* moments.
    store = Store(cs.state_dir / "state.db")
    try:
        registry = Registry(
            cs.participants,
            store,
            require_certificates=False,
            heartbeat_timeout_s=5,
            clock_skew_s=60,
        )
        resumed = Federation(cs, store, registry, say=lambda m: None)
        resumed.prepare()
        assert resumed.resumed_from == ROUNDS
        state = resumed.strategy.state_dict()
        assert set(state) == {"m", "v", "steps"}
        for key in state:
            assert np.array_equal(state[key], final_state[key])
        other = replace(cs, training=replace(cs.training, fedopt_lr=0.05))
        with pytest.raises(Exception, match="different settings"):
            Federation(other, store, registry, say=lambda m: None).prepare()
    finally:
        store.close()
