"""The coordinator's view of an algorithm: an adapter around the ONE registry,
``spherecal.spherefed.algorithms.STRATEGIES`` — no hierarchy or registry of its own.

The strategy (the same object the reference runner and the baselines harness step)
declares the named sums its server step reads (``ServerStrategy.sums``: FedAvg
``Σ n_k Δ_k``, ``Σ n_k``; FedNova adds ``Σ n_k‖a_k‖₁``; SCAFFOLD adds
``Σ (c_k⁺ − c_k)``). :meth:`Strategy.layout` lays them end to end, followed by the
service's own ``loss`` sum (``Σ mean_loss_k``, for the round's metrics), in the one
vector a secure-aggregation job sums (or a plaintext upload carries); the aggregate
is split back into named sums for :meth:`Strategy.step`. What the strategy
broadcasts (SCAFFOLD's server control variate ``c``) is published next to the model.

Server state (FedOpt's moments, SCAFFOLD's ``c``) is checkpointed with every round
(:meth:`state_dict`: named float64 arrays) so a restarted coordinator resumes it.

:func:`update_bound` is the bound on every entry of that vector, from what the
federation declares and the algorithm states (``ServerStrategy.entry_bound``): it sizes
the update jobs' ring, so a bound that follows the model lets them use 32 bits
(issue #24) where a fixed 1e5 could not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.driver.bounds import DeclaredBound
from spherecal.coordinator.settings import CoordinatorSettings, TrainingSettings
from spherecal.spherefed.algorithms.base import (
    LOSS_SUM,
    AlgorithmSettings,
    Payload,
    ServerStrategy,
    SumLayout,
    UpdateLimits,
    power_of_two_scale,
)
from spherecal.spherefed.algorithms.registry import configured_strategy
from spherecal.spherefed.fl import LocalTrainConfig
from spherecal.spherefed.privacy.example_count import count_ceiling

__all__ = [
    "FALLBACK_UPDATE_BOUND",
    "LOSS_BOUND",
    "LOSS_SUM",
    "LocalPlan",
    "Strategy",
    "StrategyState",
    "update_bound",
    "weight_ceiling",
]

FALLBACK_UPDATE_BOUND = 1e5
"""The update bound of an algorithm that states none (SCAFFOLD) when
``[secure_aggregation] update_bound`` is 0."""
LOSS_BOUND = 100.0
"""Bound on the service's ``loss`` entry (a site's mean training loss): MSE on the
sphere head is at most 4 (unit features, orthonormal classifier); a mean cross-entropy
above 100 (probability ``e^-100`` on the true class) is a diverged model."""


def weight_ceiling(settings: CoordinatorSettings) -> int:
    """The largest training weight a site may send: ``max_examples_per_site`` plus
    the bound of the noise on its count (``[federation] example_count_noise_sd``)."""
    return count_ceiling(settings.max_examples_per_site, settings.example_count_noise_sd)


def update_bound(settings: CoordinatorSettings) -> DeclaredBound:
    """The bound on ``|entry|`` of every round's update vector (Bonawitz et al. 2017
    need one so the ring sum cannot wrap; ``crypto.ring`` module docstring).

    ``[secure_aggregation] update_bound > 0`` is used as configured; otherwise the
    algorithm's :meth:`~spherecal.spherefed.algorithms.base.ServerStrategy.entry_bound`
    under the federation's declared :class:`UpdateLimits` (examples per site, the
    model's update limit, the most local steps, momentum), and at least
    :data:`LOSS_BOUND` for the ``loss`` entry. Pure: every restart derives the same.

    The examples per site are what a site may *send* as its weight:
    ``max_examples_per_site`` plus the bound of its count's noise
    (:func:`~spherecal.spherefed.privacy.example_count.count_ceiling`), so a site at
    the declared maximum fits whatever its draw.
    """
    configured = settings.secagg.update_bound
    if configured > 0:
        return DeclaredBound(configured, "configured", "[secure_aggregation] update_bound")
    t = settings.training
    n_max = weight_ceiling(settings)
    limits = UpdateLimits(
        max_examples=n_max,
        max_change=t.max_update_change,
        max_steps=t.local_epochs * math.ceil(n_max / max(1, t.batch_size)),
        momentum=t.momentum,
    )
    strategy = Strategy(t, num_participants=len(settings.participants))
    stated = strategy.server.entry_bound(limits)
    if stated is None:
        return DeclaredBound(
            FALLBACK_UPDATE_BOUND,
            "fallback",
            f"{strategy.name} states no bound; set [secure_aggregation] update_bound",
        )
    return DeclaredBound(
        max(float(stated), LOSS_BOUND),
        "derived",
        f"{strategy.name}, max_examples_per_site {settings.max_examples_per_site} "
        f"(weights up to {n_max}), max_update_change {t.max_update_change:g}",
    )


#: A strategy's resumable state: named float64 arrays (saved in the round checkpoint).
StrategyState = dict[str, npt.NDArray[np.float64]]


@dataclass(frozen=True)
class LocalPlan:
    algorithm: str
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    loss: str
    prox_mu: float


class Strategy:
    """``training.algorithm`` from the registry, configured by the training settings."""

    def __init__(
        self,
        training: TrainingSettings,
        *,
        num_participants: int,
        max_examples: int | None = None,
        update_bound: float | None = None,
    ) -> None:
        self.training = training
        self.server: ServerStrategy = configured_strategy(
            training.algorithm,
            AlgorithmSettings(
                prox_mu=training.prox_mu,
                fedopt_lr=training.fedopt_lr,
                num_participants=num_participants,
            ),
        )

        self.scales: dict[str, float] = (
            self.sum_scales(max_examples, update_bound)
            if max_examples is not None and update_bound is not None
            else {}
        )
        """Scales of the sums (:meth:`sum_scales`), sent to every site in its plan."""

    @property
    def name(self) -> str:
        return self.server.name

    def sum_scales(self, max_examples: int, update_bound: float) -> dict[str, float]:
        """The power of two each scalar sum travels divided by so that a site with at
        most ``max_examples`` examples stays within ``update_bound`` (issue #23: bounds
        that follow the data; 1 for a sum that already fits, and then left out)."""
        t = self.training
        config = LocalTrainConfig(
            epochs=t.local_epochs,
            batch_size=t.batch_size,
            lr=t.lr,
            momentum=t.momentum,
            weight_decay=t.weight_decay,
            loss=t.loss,
            prox_mu=t.effective_prox_mu,
        )
        reach = self.server.scalar_reach(max_examples, config)
        scales = {name: power_of_two_scale(r, update_bound) for name, r in reach.items()}
        return {name: scale for name, scale in scales.items() if scale != 1.0}

    def local_plan(self, round_index: int) -> LocalPlan:
        """Local training settings (FedProx's μ only for FedProx)."""
        t = self.training
        return LocalPlan(
            self.name,
            t.local_epochs,
            t.batch_size,
            t.lr,
            t.momentum,
            t.weight_decay,
            t.loss,
            t.effective_prox_mu,
        )

    def layout(self, model_length: int) -> SumLayout:
        """The aggregated vector: the strategy's sums, then :data:`LOSS_SUM`, each
        scalar sum at its scale."""
        return self.server.layout(model_length, LOSS_SUM).with_scales(self.scales)

    def broadcast(self, global_vector: npt.NDArray[np.float64]) -> dict[str, Any]:
        """What participants need besides the model this round (SCAFFOLD: ``c``)."""
        return self.server.broadcast(global_vector)

    def step(
        self, global_vector: npt.NDArray[np.float64], sums: Payload, *, num_selected: int
    ) -> npt.NDArray[np.float64]:
        """The next global model from the round's named sums (``loss`` removed)."""
        return np.asarray(
            self.server.server_step(global_vector, sums, num_selected=num_selected),
            dtype=np.float64,
        )

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> StrategyState:
        """Server state as float64 arrays: unset entries (``None``) are left out,
        numbers become one-entry arrays."""
        out: StrategyState = {}
        for key, value in self.server.state_dict().items():
            if value is None:
                continue
            array = np.asarray(value, dtype=np.float64)
            out[key] = array.reshape(1) if array.ndim == 0 else array
        return out

    def load_state_dict(self, state: Mapping[str, npt.NDArray[np.float64]]) -> None:
        """Restore :meth:`state_dict` output (on resume); refuse what does not fit."""
        template = self.server.state_dict()
        unknown = sorted(set(state) - set(template))
        if unknown:
            if not template:
                raise ValueError(f"{self.name} keeps no server state; got {sorted(state)}")
            raise ValueError(f"{self.name} state has unknown entries {unknown}")
        restored: dict[str, Any] = {}
        for key, fresh in template.items():
            value = state.get(key)
            if value is not None and not np.isfinite(value).all():
                raise ValueError(f"{self.name} state: {key} must be finite")
            if isinstance(fresh, int | float) and not isinstance(fresh, bool):
                if value is None:
                    raise ValueError(
                        f"{self.name} state needs {sorted(template)}; got {sorted(state)}"
                    )
                if value.size != 1:
                    raise ValueError(f"{self.name} state: {key} must be one number")
                restored[key] = type(fresh)(value.reshape(-1)[0])
            else:
                restored[key] = None if value is None else np.array(value, dtype=np.float64)
        self.server.load_state_dict(restored)
