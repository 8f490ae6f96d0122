"""THE registry of algorithms: name → :class:`ServerStrategy` subclass.

The reference runner, the baselines harness, the CLI choices, the coordinator's
``[training] algorithm`` and the participant all read it; adding an algorithm means
adding its class here (docs/extending.md, "Add an algorithm").
"""

from __future__ import annotations

from typing import Any

from spherecal.spherefed.algorithms.base import AlgorithmSettings, ServerStrategy
from spherecal.spherefed.algorithms.scaffold import Scaffold
from spherecal.spherefed.algorithms.strategies import FedAdam, FedAvg, FedNova, FedProx, FedYogi

__all__ = ["ALGORITHM_NAMES", "STRATEGIES", "configured_strategy", "make_strategy"]

STRATEGIES: dict[str, type[ServerStrategy]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fednova": FedNova,
    "fedadam": FedAdam,
    "fedyogi": FedYogi,
    "scaffold": Scaffold,
}
"""THE registry of algorithms, by name (FedOpt appears as its Adam and Yogi variants).
The reference runner, the baselines harness, the CLI choices, the coordinator and
the participant all read it; adding an algorithm means adding it here."""

ALGORITHM_NAMES: tuple[str, ...] = tuple(STRATEGIES)


def make_strategy(name: str, **kwargs: Any) -> ServerStrategy:
    """A fresh strategy for algorithm ``name`` (keyword arguments go to its constructor)."""
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {ALGORITHM_NAMES}") from None
    return factory(**kwargs)


def configured_strategy(name: str, settings: AlgorithmSettings) -> ServerStrategy:
    """A fresh strategy for algorithm ``name`` with a deployment's settings
    (:meth:`ServerStrategy.configured`): what the runner, the harness, the coordinator
    and the participant build, so all four run the same arithmetic."""
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {ALGORITHM_NAMES}") from None
    return factory.configured(settings)
