"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1): control variates against client
drift. Local steps on ``g + c − c_k``; afterwards (option II)
``c_k⁺ = c_k − c + (x − y_k)/(η K_k)``. Server: ``x ← x + η_g Σ n_k Δ_k / Σ n_k`` and
``c ← c + (1/N) Σ_{k∈S} (c_k⁺ − c_k)``. Sums: [``delta``, ``weight``,
``control_delta``]; ``c`` is server state and is broadcast; ``c_k`` never leaves
participant ``k`` (see :mod:`spherecal.spherefed.algorithms.strategies` for the notation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from spherecal.spherefed.algorithms.base import (
    AlgorithmSettings,
    ClientResult,
    NamedSum,
    Payload,
    ServerStrategy,
    UpdateLimits,
    as_payload,
    parameter_mask,
)
from spherecal.spherefed.algorithms.strategies import fednova_norm
from spherecal.spherefed.fl import (
    LocalObjective,
    LocalTrainConfig,
    aggregated_keys,
    local_steps,
    local_train,
)

__all__ = ["Scaffold", "scaffold_control_update", "scaffold_local_step", "scaffold_server_step"]


def scaffold_control_update(
    client_control: np.ndarray,
    server_control: np.ndarray,
    delta: np.ndarray,
    *,
    lr: float,
    effective_steps: float,
) -> np.ndarray:
    """Option II of SCAFFOLD (Algorithm 1): ``c_k⁺ = c_k − c + (x − y_k)/(K η)``.

    ``delta = y_k − x``; ``effective_steps`` is ``K`` (``‖a_k‖₁`` under momentum, see
    :func:`fednova_norm`). ``(x − y_k)/(Kη)`` is the participant's average corrected
    gradient; subtracting the correction ``c − c_k`` leaves its average *raw* gradient.
    """
    if effective_steps <= 0:
        return np.array(client_control, dtype=np.float64, copy=True)
    return client_control - server_control - delta / (lr * effective_steps)


def scaffold_local_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LocalTrainConfig,
    *,
    seed: int,
    server_control: np.ndarray,
    client_control: np.ndarray | None = None,
    objective: LocalObjective | None = None,
) -> ClientResult:
    """SCAFFOLD's participant half: corrected local SGD, then the control update.

    Payload ``delta = n_k Δ_k``, ``weight = n_k``, ``control_delta = c_k⁺ − c_k``; the
    new ``c_k`` is returned as ``client_state["control"]`` and stays local. Control
    variates live in the state-vector layout and are zero on buffers.
    """
    keys = aggregated_keys(model)
    mask = parameter_mask(model, keys)
    c = np.asarray(server_control, dtype=np.float64)
    if c.shape != mask.shape:
        raise ValueError(f"server control has {c.shape} entries, the model {mask.shape}")
    ck = np.zeros_like(c) if client_control is None else np.asarray(client_control, np.float64)
    if ck.shape != c.shape:
        raise ValueError(f"client control has {ck.shape} entries, the model {c.shape}")
    upd = local_train(
        model, x, y, config, seed=seed, objective=objective, gradient_correction=(c - ck) * mask
    )
    if upd.num_samples == 0:
        new_ck = ck.copy()
    else:
        steps = fednova_norm(
            upd.num_steps, momentum=config.momentum, lr=config.lr, prox_mu=config.prox_mu
        )
        delta = upd.weighted_delta / upd.num_samples
        new_ck = scaffold_control_update(ck, c, delta, lr=config.lr, effective_steps=steps) * mask
    return ClientResult(
        as_payload(delta=upd.weighted_delta, weight=upd.num_samples, control_delta=new_ck - ck),
        upd.num_samples,
        upd.num_steps,
        upd.mean_loss,
        client_state={"control": new_ck},
    )


def scaffold_server_step(
    global_vector: np.ndarray,
    server_control: np.ndarray,
    sums: Payload,
    *,
    num_participants: int,
    server_lr: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """``x + η_g Σ n_kΔ_k/Σ n_k`` and ``c + Σ Δc_k / N`` (Algorithm 1, server update)."""
    if num_participants < 1:
        raise ValueError(f"num_participants must be >= 1, got {num_participants}")
    weight = float(sums["weight"])
    if weight <= 0:
        raise ValueError("no samples in this round's updates (weight sum is 0)")
    x = global_vector + server_lr * sums["delta"] / weight
    c = server_control + sums["control_delta"] / num_participants
    return x, c


class Scaffold(ServerStrategy):
    """SCAFFOLD (Karimireddy et al. 2020): control variates against client drift.

    ``num_participants`` is ``N`` in ``c ← c + (1/N) Σ Δc_k``; ``None`` (default)
    uses the number of participants selected in each round, which equals ``N`` under
    full participation.
    """

    name: ClassVar[str] = "scaffold"
    sums: ClassVar[tuple[NamedSum, ...]] = (
        NamedSum("delta", per_entry=True, example_weighted=True),
        NamedSum("weight", example_weighted=True),
        NamedSum("control_delta", per_entry=True),
    )

    def reweighed(
        self,
        result: ClientResult,
        weight: int,
        config: LocalTrainConfig,
        *,
        trainable: np.ndarray | None = None,
    ) -> ClientResult:
        """FedAvg's rescaling, and the control update as a site of ``weight`` examples
        would make it. ``Δc_k = −c − Δ_k/(ηK_k)`` divides by the local step count
        ``K_k`` (``epochs·⌈n_k/B⌉``, its momentum norm), so with the update itself — which
        a coordinator can isolate by differencing two rounds of one model (the
        documented residual) — it gave the count to within the batch size, past the
        released ``ñ_k``. Sent for ``K̃ = local_steps(ñ_k)`` instead (Option II with the
        released count's steps), and kept so in the site's ``c_k``, the invariant
        ``c = mean(c_k)`` holds as before; ``K̃ = K`` whenever the noised count stays in
        the same batch. ``trainable`` (:func:`parameter_mask`) keeps the control variates
        zero on buffers; without it the control update is left as computed."""
        out = super().reweighed(result, weight, config, trainable=trainable)
        n = int(result.num_samples)
        if trainable is None or n == 0 or "control_delta" not in result.payload:
            return out
        norm = {"momentum": config.momentum, "lr": config.lr, "prox_mu": config.prox_mu}
        true_k = fednova_norm(int(result.num_steps), **norm)
        sent_k = fednova_norm(local_steps(int(weight), config), **norm)
        if true_k <= 0 or sent_k <= 0 or true_k == sent_k:
            return out
        delta = np.asarray(result.payload["delta"], dtype=np.float64) / n  # y_k − x
        shift = delta / config.lr * (1.0 / true_k - 1.0 / sent_k) * trainable
        control_delta = np.asarray(result.payload["control_delta"], dtype=np.float64) + shift
        state = dict(result.client_state or {})
        if "control" in state:
            state["control"] = np.asarray(state["control"], dtype=np.float64) + shift
        return replace(
            out,
            payload={**out.payload, "control_delta": control_delta},
            client_state=state or None,
        )

    def __init__(self, *, num_participants: int | None = None, server_lr: float = 1.0) -> None:
        if num_participants is not None and num_participants < 1:
            raise ValueError(f"num_participants must be >= 1, got {num_participants}")
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        self.num_participants = num_participants
        self.server_lr = float(server_lr)
        self.control: np.ndarray | None = None

    def entry_bound(self, limits: UpdateLimits) -> float | None:
        """None: ``c_k⁺ − c_k = (x − y_k)/(K η) − c`` carries the server's control
        variate ``c``, which accumulates over rounds; no declared limit bounds it, so
        the service's configured ``update_bound`` applies."""
        return None

    @classmethod
    def configured(cls, settings: AlgorithmSettings) -> Scaffold:
        return cls(num_participants=settings.num_participants)

    def broadcast(self, global_vector: np.ndarray) -> dict[str, np.ndarray]:
        if self.control is None:
            self.control = np.zeros_like(global_vector)
        return {"control": self.control.copy()}

    def local_step(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        config: LocalTrainConfig,
        *,
        seed: int,
        broadcast: Mapping[str, np.ndarray],
        client_state: Mapping[str, np.ndarray] | None = None,
        objective: LocalObjective | None = None,
    ) -> ClientResult:
        if "control" not in broadcast:
            raise ValueError("SCAFFOLD's local step needs the server control variate c")
        return scaffold_local_step(
            model,
            x,
            y,
            config,
            seed=seed,
            server_control=broadcast["control"],
            client_control=None if client_state is None else client_state.get("control"),
            objective=objective,
        )

    def server_step(
        self, global_vector: np.ndarray, sums: Payload, *, num_selected: int
    ) -> np.ndarray:
        self._check_sums(global_vector, sums)
        if self.control is None:
            self.control = np.zeros_like(global_vector)
        n = self.num_participants if self.num_participants is not None else num_selected
        x, self.control = scaffold_server_step(
            global_vector, self.control, sums, num_participants=n, server_lr=self.server_lr
        )
        return x

    def state_dict(self) -> dict[str, Any]:
        return {"control": None if self.control is None else self.control.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != {"control"}:
            raise ValueError(f"SCAFFOLD state needs the key control; got {sorted(state)}")
        c = state["control"]
        self.control = None if c is None else np.array(c, dtype=np.float64)

    def hyperparameters(self) -> dict[str, Any]:
        return {"num_participants": self.num_participants, "server_lr": self.server_lr}
