"""Aggregation strategies: how local training is configured and how sums become a
new global model. A small registry the baselines work extends.

A strategy sees only *sums* (``Σ n_k Δ_k``, ``Σ n_k``) — exactly what secure
aggregation delivers — never a single participant's update. FedAvg and FedProx
share the server step; FedProx differs only in the local objective (``prox_mu``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from spherefed.fl import server_step

from .settings import TrainingSettings

__all__ = ["STRATEGIES", "FedAvg", "FedProx", "Strategy", "make_strategy", "register_strategy"]


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


@dataclass(frozen=True)
class FedProx(FedAvg):
    name: str = "fedprox"

    def local_plan(self, round_index: int) -> LocalPlan:
        t = self.training
        return LocalPlan(
            t.local_epochs, t.batch_size, t.lr, t.momentum, t.weight_decay, t.loss, t.prox_mu
        )


STRATEGIES: dict[str, Callable[[TrainingSettings], Strategy]] = {
    "fedavg": lambda t: FedAvg(t),
    "fedprox": lambda t: FedProx(t),
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
