"""Aggregation strategies: how local training is configured and how sums become a
new global model. A small registry the baselines work extends.

A strategy sees only *sums* (``Σ n_k Δ_k``, ``Σ n_k``) — exactly what secure
aggregation delivers — never a single participant's update. FedAvg and FedProx
share the server step; FedProx differs only in the local objective (``prox_mu``).
FedAdam and FedYogi (Reddi et al. 2021, Algorithm 2) keep FedAvg's local step and
feed the averaged update to a server optimiser; their moments ``m``, ``v`` are
server state, saved with each round's checkpoint (:meth:`Strategy.state_dict`) so a
restarted coordinator resumes the optimiser exactly where it stopped.

FedNova and SCAFFOLD need more than these two sums (``Σ n_k τ_k``; control variates
broadcast and summed), so they run in ``spherefed.algorithms`` / ``spherecal
experiment`` but not yet through the service.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from spherefed.algorithms.strategies import FedAdam, FedOpt, FedYogi
from spherefed.fl import server_step

from .settings import TrainingSettings

__all__ = [
    "STRATEGIES",
    "FedAvg",
    "FedProx",
    "ServerOptimizer",
    "Strategy",
    "make_strategy",
    "register_strategy",
]

#: A strategy's resumable state: named float64 arrays (saved in the round checkpoint).
StrategyState = dict[str, npt.NDArray[np.float64]]


@dataclass(frozen=True)
class LocalPlan:
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    loss: str
    prox_mu: float


class Strategy(Protocol):
    @property
    def name(self) -> str: ...

    def local_plan(self, round_index: int) -> LocalPlan:
        """Local training settings for a round."""
        ...

    def aggregate(
        self,
        global_vector: npt.NDArray[np.float64],
        delta_sum: npt.NDArray[np.float64],
        weight_sum: float,
    ) -> npt.NDArray[np.float64]:
        """The next global model from the round's sums."""
        ...

    def state_dict(self) -> StrategyState:
        """Server state to checkpoint with the global model ({} when stateless)."""
        ...

    def load_state_dict(self, state: StrategyState) -> None:
        """Restore :meth:`state_dict` output (on resume); refuse what does not fit."""
        ...


@dataclass(frozen=True)
class FedAvg:
    training: TrainingSettings
    name: str = "fedavg"

    def local_plan(self, round_index: int) -> LocalPlan:
        t = self.training
        return LocalPlan(
            t.local_epochs, t.batch_size, t.lr, t.momentum, t.weight_decay, t.loss, 0.0
        )

    def aggregate(
        self,
        global_vector: npt.NDArray[np.float64],
        delta_sum: npt.NDArray[np.float64],
        weight_sum: float,
    ) -> npt.NDArray[np.float64]:
        return server_step(global_vector, delta_sum, weight_sum)

    def state_dict(self) -> StrategyState:
        return {}

    def load_state_dict(self, state: StrategyState) -> None:
        if state:
            raise ValueError(f"{self.name} keeps no server state; got {sorted(state)}")


@dataclass(frozen=True)
class FedProx(FedAvg):
    name: str = "fedprox"

    def local_plan(self, round_index: int) -> LocalPlan:
        t = self.training
        return LocalPlan(
            t.local_epochs, t.batch_size, t.lr, t.momentum, t.weight_decay, t.loss, t.prox_mu
        )


@dataclass
class ServerOptimizer:
    """FedAdam / FedYogi: FedAvg's local step; the round's average update
    ``Σ n_k Δ_k / Σ n_k`` is the pseudo-gradient of a server optimiser (Reddi et al.
    2021, Algorithm 2) with η = ``training.fedopt_lr`` and the paper's β₁, β₂, τ.

    The arithmetic is :class:`spherefed.algorithms.strategies.FedOpt`'s, the same
    object the reference runner steps, so service and reference agree to the bit.
    """

    training: TrainingSettings
    optimizer: FedOpt
    name: str

    def local_plan(self, round_index: int) -> LocalPlan:
        return FedAvg(self.training).local_plan(round_index)

    def aggregate(
        self,
        global_vector: npt.NDArray[np.float64],
        delta_sum: npt.NDArray[np.float64],
        weight_sum: float,
    ) -> npt.NDArray[np.float64]:
        sums = {"delta": delta_sum, "weight": np.asarray(weight_sum, dtype=np.float64)}
        return np.asarray(
            self.optimizer.server_step(global_vector, sums, num_selected=0), dtype=np.float64
        )

    def state_dict(self) -> StrategyState:
        state = self.optimizer.state_dict()
        if state["m"] is None:
            return {}  # no round aggregated yet: the moments start from their defaults
        return {
            "m": np.asarray(state["m"], dtype=np.float64),
            "v": np.asarray(state["v"], dtype=np.float64),
            "steps": np.array([state["steps"]], dtype=np.float64),
        }

    def load_state_dict(self, state: StrategyState) -> None:
        if not state:
            self.optimizer.load_state_dict({"m": None, "v": None, "steps": 0})
            return
        if set(state) != {"m", "v", "steps"}:
            raise ValueError(f"{self.name} state needs m, v and steps; got {sorted(state)}")
        m, v = state["m"], state["v"]
        if m.shape != v.shape or m.ndim != 1:
            raise ValueError(f"{self.name} state: m {m.shape} and v {v.shape} do not match")
        if not (np.isfinite(m).all() and np.isfinite(v).all()) or (v < 0).any():
            raise ValueError(f"{self.name} state: m and v must be finite, v non-negative")
        self.optimizer.load_state_dict({"m": m, "v": v, "steps": int(state["steps"][0])})


def _fedadam(t: TrainingSettings) -> ServerOptimizer:
    return ServerOptimizer(t, FedAdam(lr=t.fedopt_lr), "fedadam")


def _fedyogi(t: TrainingSettings) -> ServerOptimizer:
    return ServerOptimizer(t, FedYogi(lr=t.fedopt_lr), "fedyogi")


STRATEGIES: dict[str, Callable[[TrainingSettings], Strategy]] = {
    "fedavg": lambda t: FedAvg(t),
    "fedprox": lambda t: FedProx(t),
    "fedadam": _fedadam,
    "fedyogi": _fedyogi,
}


def register_strategy(name: str, factory: Callable[[TrainingSettings], Strategy]) -> None:
    STRATEGIES[name] = factory


def make_strategy(training: TrainingSettings) -> Strategy:
    try:
        return STRATEGIES[training.algorithm](training)
    except KeyError:
        raise ValueError(
            f"no aggregation strategy {training.algorithm!r}; known: {sorted(STRATEGIES)}"
        ) from None
