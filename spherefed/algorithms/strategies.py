"""Base federated algorithms, each as a local step + a server step on sums.

Notation: ``x`` the global state vector, ``y_k`` participant ``k``'s model after local
training, ``Δ_k = y_k − x``, ``n_k`` its sample count, ``p_k = n_k / Σ n``. Every
server step below reads only sums over the round's participants (the payload keys in
brackets), so it runs unchanged on top of secure aggregation.

- **FedAvg** (McMahan et al. 2017) — ``x ← x + Σ n_k Δ_k / Σ n_k``.
  Sums: [``delta`` = Σ n_k Δ_k, ``weight`` = Σ n_k].
- **FedProx** (Li et al. 2020) — the FedAvg server step; locally
  ``+ (μ/2)‖w − x‖²``. Same sums.
- **FedNova** (Wang et al. 2020, "Tackling the objective inconsistency problem…") —
  normalised averaging. A participant that ran ``τ_k`` local steps reports its
  *normalised* update ``d_k = Δ_k / ‖a_k‖₁``, where ``a_k`` is the vector of weights
  its optimiser put on the ``τ_k`` gradients
  (``‖a_k‖₁ = τ_k`` for plain SGD; see :func:`fednova_norm` for momentum and the
  proximal term). The server applies ``x ← x + τ_eff Σ p_k d_k`` with
  ``τ_eff = Σ p_k ‖a_k‖₁``. Written on sums,
  ``x ← x + (Σ n_k‖a_k‖₁ / Σ n_k) · (Σ n_k d_k / Σ n_k)``, so three sums suffice:
  [``delta`` = Σ n_k Δ_k/‖a_k‖₁, ``tau`` = Σ n_k ‖a_k‖₁, ``weight`` = Σ n_k]. No
  participant reveals its own ``τ_k``: only ``Σ n_k ‖a_k‖₁`` is opened. With equal
  ``‖a_k‖₁`` it is exactly FedAvg.
- **FedOpt** (Reddi et al. 2021, Algorithm 2) — the FedAvg average
  ``Δ = Σ n_k Δ_k / Σ n_k`` is a pseudo-gradient for a server optimiser:
  ``m ← β₁m + (1−β₁)Δ``; Adagrad ``v ← v + Δ²``, Adam ``v ← β₂v + (1−β₂)Δ²``, Yogi
  ``v ← v − (1−β₂)Δ² sign(v − Δ²)``; ``x ← x + η m / (√v + τ)``. No bias correction,
  ``v₋₁ = τ²``, as in the paper. Same sums as FedAvg; ``m`` and ``v`` are server state.
- **SCAFFOLD** (Karimireddy et al. 2020, Algorithm 1) — local steps on
  ``g + c − c_k``; afterwards (option II) ``c_k⁺ = c_k − c + (x − y_k)/(η K_k)``.
  Server: ``x ← x + η_g Σ n_k Δ_k / Σ n_k`` and ``c ← c + (1/N) Σ_{k∈S} (c_k⁺ − c_k)``.
  Sums: [``delta``, ``weight``, ``control_delta`` = Σ (c_k⁺ − c_k)]. ``c`` is server
  state and is broadcast; ``c_k`` never leaves participant ``k``. The model update is
  sample-weighted like FedAvg here (the paper averages uniformly; weighting keeps it
  comparable with the other rows), the control update uses ``1/N`` as in the paper.

Local optimiser: every algorithm uses the same local SGD with momentum
(:func:`spherecal.spherefed.fl.local_train`), as the SphereFed and FedFN experiments do. Where
an algorithm's formula assumes plain SGD (FedNova's ``‖a‖₁``, SCAFFOLD's ``K η``) the
momentum-aware effective step count of FedNova's Appendix (and its reference code)
is used; it reduces to the paper's formula at momentum 0.
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
)
from spherecal.spherefed.fl import (
    LocalObjective,
    LocalTrainConfig,
    local_steps,
    local_train,
    server_step,
)

FEDOPT_VARIANTS: tuple[str, ...] = ("adam", "yogi", "adagrad")


# ----------------------------------------------------------------------------- FedAvg


def fedavg_local_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LocalTrainConfig,
    *,
    seed: int,
    objective: LocalObjective | None = None,
) -> ClientResult:
    """Local SGD; payload ``delta = n_k Δ_k``, ``weight = n_k`` (FedAvg/FedProx/FedOpt)."""
    upd = local_train(model, x, y, config, seed=seed, objective=objective)
    return ClientResult(
        as_payload(delta=upd.weighted_delta, weight=upd.num_samples),
        upd.num_samples,
        upd.num_steps,
        upd.mean_loss,
    )


def fedavg_server_step(global_vector: np.ndarray, sums: Payload) -> np.ndarray:
    """``x + Σ n_k Δ_k / Σ n_k`` — :func:`spherecal.spherefed.fl.server_step` on a payload."""
    return server_step(global_vector, sums["delta"], float(sums["weight"]))


class FedAvg(ServerStrategy):
    """FedAvg (McMahan et al. 2017): sample-weighted average of the local updates."""

    name: ClassVar[str] = "fedavg"
    sums: ClassVar[tuple[NamedSum, ...]] = (
        NamedSum("delta", per_entry=True, example_weighted=True),
        NamedSum("weight", example_weighted=True),
    )

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
        return fedavg_local_step(model, x, y, config, seed=seed, objective=objective)

    def server_step(
        self, global_vector: np.ndarray, sums: Payload, *, num_selected: int
    ) -> np.ndarray:
        self._check_sums(global_vector, sums)
        return fedavg_server_step(global_vector, sums)

    def entry_bound(self, limits: UpdateLimits) -> float | None:
        """``|n_k Δ_k| ≤ n_max · max_change`` per entry and ``n_k ≤ n_max`` (FedProx and
        FedOpt send the same sums)."""
        return float(limits.max_examples) * max(limits.max_change, 1.0)


class FedProx(FedAvg):
    """FedProx (Li et al. 2020): FedAvg's server step, ``(μ/2)‖w − x‖²`` added locally.

    ``mu`` overrides ``config.prox_mu`` in the local step (default 0.01, the value
    FedUV §4.1 and most FedProx baselines use).
    """

    name: ClassVar[str] = "fedprox"

    def __init__(self, *, mu: float = 0.01) -> None:
        if not mu >= 0:
            raise ValueError(f"FedProx mu must be >= 0, got {mu}")
        self.mu = float(mu)

    @classmethod
    def configured(cls, settings: AlgorithmSettings) -> FedProx:
        return cls(mu=settings.prox_mu)

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
        cfg = config if config.prox_mu == self.mu else replace(config, prox_mu=self.mu)
        return fedavg_local_step(model, x, y, cfg, seed=seed, objective=objective)

    def hyperparameters(self) -> dict[str, Any]:
        return {"mu": self.mu}


# ----------------------------------------------------------------------------- FedNova


def fednova_norm(
    steps: int, *, momentum: float = 0.0, lr: float = 0.0, prox_mu: float = 0.0
) -> float:
    """``‖a_k‖₁``: the total weight local training put on its ``τ_k = steps`` gradients.

    FedNova (Wang et al. 2020) writes any local solver as ``Δ_k = −η G_k a_k``; its
    ``‖a_k‖₁`` is the *effective* number of steps. Plain SGD: ``τ``. Momentum ``ρ``:
    ``Σ_{t=1..τ} (1 − ρ^t)/(1 − ρ)``. FedProx (``ημ`` > 0): ``(1 − (1 − ημ)^τ)/(ημ)``.
    Both together follow the recurrence of the authors' reference optimiser
    (per step: ``c ← ρc + 1; s ← s + c``; then ``s ← (1 − ημ)s + 1``).
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    eta_mu = float(lr) * float(prox_mu)
    if momentum == 0 and eta_mu == 0:
        return float(steps)
    counter, norm = 0.0, 0.0
    for _ in range(steps):
        if momentum != 0:
            counter = counter * momentum + 1.0
            norm += counter
        if eta_mu != 0:
            norm = norm * (1.0 - eta_mu) + 1.0
    return norm


def fednova_local_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LocalTrainConfig,
    *,
    seed: int,
    objective: LocalObjective | None = None,
) -> ClientResult:
    """Local SGD; payload ``delta = n_k Δ_k/‖a_k‖₁``, ``tau = n_k ‖a_k‖₁``, ``weight = n_k``."""
    upd = local_train(model, x, y, config, seed=seed, objective=objective)
    norm = fednova_norm(
        upd.num_steps, momentum=config.momentum, lr=config.lr, prox_mu=config.prox_mu
    )
    if upd.num_samples == 0 or norm == 0:
        delta = np.zeros_like(upd.weighted_delta)
    else:
        delta = upd.weighted_delta / norm
    return ClientResult(
        as_payload(delta=delta, tau=upd.num_samples * norm, weight=upd.num_samples),
        upd.num_samples,
        upd.num_steps,
        upd.mean_loss,
    )


def fednova_server_step(
    global_vector: np.ndarray, sums: Payload, *, server_lr: float = 1.0
) -> np.ndarray:
    """``x + η_g τ_eff Σ p_k d_k`` with ``τ_eff = Σ n_k‖a_k‖₁ / Σ n_k`` (FedNova)."""
    weight = float(sums["weight"])
    if weight <= 0:
        raise ValueError("no samples in this round's updates (weight sum is 0)")
    tau_eff = float(sums["tau"]) / weight
    return global_vector + server_lr * tau_eff * (sums["delta"] / weight)


class FedNova(FedAvg):
    """FedNova (Wang et al. 2020): normalised averaging, robust to unequal local steps."""

    name: ClassVar[str] = "fednova"
    sums: ClassVar[tuple[NamedSum, ...]] = (
        NamedSum("delta", per_entry=True, example_weighted=True),
        NamedSum("tau", example_weighted=True),
        NamedSum("weight", example_weighted=True),
    )

    def __init__(self, *, server_lr: float = 1.0) -> None:
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        self.server_lr = float(server_lr)

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
        return fednova_local_step(model, x, y, config, seed=seed, objective=objective)

    def scalar_reach(self, max_examples: int, config: LocalTrainConfig) -> dict[str, float]:
        """``tau = n_k‖a_k‖₁`` grows with the square of the examples (``n_k`` times the
        effective steps ``‖a_k‖₁`` of ``epochs·⌈n_k/B⌉`` steps, ≈ ``1/(1 − ρ)`` each under
        momentum): at its default a 600-example site reached 1.7e5, past the update
        bound of 1e5 (issue #23). Its reach is that of a site at ``max_examples``:
        :func:`fednova_norm` is increasing in the steps, so this bounds every site."""
        steps = config.epochs * -(-int(max_examples) // config.batch_size)
        norm = fednova_norm(steps, momentum=config.momentum, lr=config.lr, prox_mu=config.prox_mu)
        return {**super().scalar_reach(max_examples, config), "tau": float(max_examples) * norm}

    def server_step(
        self, global_vector: np.ndarray, sums: Payload, *, num_selected: int
    ) -> np.ndarray:
        self._check_sums(global_vector, sums)
        return fednova_server_step(global_vector, sums, server_lr=self.server_lr)

    def reweighed(
        self,
        result: ClientResult,
        weight: int,
        config: LocalTrainConfig,
        *,
        trainable: np.ndarray | None = None,
    ) -> ClientResult:
        """FedAvg's rescaling, and ``τ`` as a site of ``weight`` examples would send
        it: ``ñ_k ‖a‖₁`` of :func:`~spherecal.spherefed.fl.local_steps` for ``ñ_k``.
        ``τ / weight = ‖a_k‖₁`` follows the local step count ``epochs·⌈n_k/B⌉``, so
        sent from the true steps it gives the count to within the batch size; from the
        released count it gives nothing beyond it. The direction ``d_k`` keeps the true
        ``‖a_k‖₁``; the server's ``τ_eff`` moves only where a noised count crosses a
        batch boundary, by that site's steps of one batch."""
        out = super().reweighed(result, weight, config, trainable=trainable)
        norm = fednova_norm(
            local_steps(weight, config),
            momentum=config.momentum,
            lr=config.lr,
            prox_mu=config.prox_mu,
        )
        return replace(out, payload={**out.payload, "tau": np.asarray(weight * norm, np.float64)})

    def entry_bound(self, limits: UpdateLimits) -> float | None:
        """FedAvg's bound, and ``tau = n_k ‖a_k‖₁ ≤ n_max · τ_max / (1 − ρ)``
        (:func:`fednova_norm`: ``‖a_k‖₁ ≥ 1`` after one step, so ``|n_k Δ_k / ‖a_k‖₁|``
        stays within FedAvg's bound)."""
        steps = limits.max_steps / (1.0 - limits.momentum)
        return float(limits.max_examples) * max(limits.max_change, 1.0, steps)

    def hyperparameters(self) -> dict[str, Any]:
        return {"server_lr": self.server_lr}


# ----------------------------------------------------------------------------- FedOpt


def fedopt_update(
    global_vector: np.ndarray,
    pseudo_gradient: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    *,
    variant: str = "adam",
    lr: float = 0.01,
    beta1: float = 0.9,
    beta2: float = 0.99,
    tau: float = 1e-3,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One server-optimiser step of Reddi et al. (2021), Algorithm 2 → ``(x, m, v)``.

    ``pseudo_gradient`` is the averaged update ``Δ`` (an *ascent* direction: the
    server adds it). Pure: the inputs are not modified.
    """
    if variant not in FEDOPT_VARIANTS:
        raise ValueError(f"unknown FedOpt variant {variant!r}; expected one of {FEDOPT_VARIANTS}")
    d = np.asarray(pseudo_gradient, dtype=np.float64)
    m_new = beta1 * m + (1.0 - beta1) * d
    d2 = d * d
    if variant == "adagrad":
        v_new = v + d2
    elif variant == "adam":
        v_new = beta2 * v + (1.0 - beta2) * d2
    else:  # yogi
        v_new = v - (1.0 - beta2) * d2 * np.sign(v - d2)
    x_new = global_vector + lr * m_new / (np.sqrt(v_new) + tau)
    return x_new, m_new, v_new


class FedOpt(FedAvg):
    """FedOpt (Reddi et al. 2021): FedAvg's sums fed to a server Adam / Yogi / Adagrad.

    Defaults ``β₁ = 0.9``, ``β₂ = 0.99``, ``τ = 10⁻³`` are the paper's; the server
    learning rate ``lr`` (default 0.01) is the knob Reddi et al. tune per task.
    """

    name: ClassVar[str] = "fedopt"

    def __init__(
        self,
        *,
        variant: str = "adam",
        lr: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
    ) -> None:
        if variant not in FEDOPT_VARIANTS:
            raise ValueError(
                f"unknown FedOpt variant {variant!r}; expected one of {FEDOPT_VARIANTS}"
            )
        if not lr > 0 or not tau > 0:
            raise ValueError(f"lr and tau must be > 0, got lr={lr}, tau={tau}")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"betas must be in [0, 1), got {beta1}, {beta2}")
        self.variant, self.lr, self.beta1, self.beta2, self.tau = (
            variant,
            float(lr),
            float(beta1),
            float(beta2),
            float(tau),
        )
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.steps = 0

    def server_step(
        self, global_vector: np.ndarray, sums: Payload, *, num_selected: int
    ) -> np.ndarray:
        self._check_sums(global_vector, sums)
        if self.m is None or self.v is None:
            self.m = np.zeros_like(global_vector)
            self.v = np.full_like(global_vector, self.tau**2)
        if self.m.shape != global_vector.shape:
            raise ValueError(
                f"server state is for {self.m.shape} entries, the model has {global_vector.shape}"
            )
        pseudo = sums["delta"] / float(sums["weight"])
        x, self.m, self.v = fedopt_update(
            global_vector,
            pseudo,
            self.m,
            self.v,
            variant=self.variant,
            lr=self.lr,
            beta1=self.beta1,
            beta2=self.beta2,
            tau=self.tau,
        )
        self.steps += 1
        return x

    def state_dict(self) -> dict[str, Any]:
        return {
            "m": None if self.m is None else self.m.copy(),
            "v": None if self.v is None else self.v.copy(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != {"m", "v", "steps"}:
            raise ValueError(f"FedOpt state needs keys m, v, steps; got {sorted(state)}")
        m, v = state["m"], state["v"]
        if (m is None) != (v is None):
            raise ValueError("FedOpt state: m and v must both be set or both be None")
        if m is not None:
            m, v = np.array(m, dtype=np.float64), np.array(v, dtype=np.float64)
            if m.shape != v.shape or m.ndim != 1:
                raise ValueError(f"FedOpt state: m {m.shape} and v {v.shape} do not match")
            if not (np.isfinite(m).all() and np.isfinite(v).all()) or (v < 0).any():
                raise ValueError("FedOpt state: m and v must be finite, v non-negative")
        self.m, self.v = m, v
        self.steps = int(state["steps"])

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "lr": self.lr,
            "beta1": self.beta1,
            "beta2": self.beta2,
            "tau": self.tau,
        }


class FedAdam(FedOpt):
    """FedOpt with server Adam."""

    name: ClassVar[str] = "fedadam"

    def __init__(
        self, *, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3
    ) -> None:
        super().__init__(variant="adam", lr=lr, beta1=beta1, beta2=beta2, tau=tau)

    @classmethod
    def configured(cls, settings: AlgorithmSettings) -> FedAdam:
        return cls(lr=settings.fedopt_lr)


class FedYogi(FedOpt):
    """FedOpt with server Yogi (additive, sign-controlled second-moment update)."""

    name: ClassVar[str] = "fedyogi"

    def __init__(
        self, *, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3
    ) -> None:
        super().__init__(variant="yogi", lr=lr, beta1=beta1, beta2=beta2, tau=tau)

    @classmethod
    def configured(cls, settings: AlgorithmSettings) -> FedYogi:
        return cls(lr=settings.fedopt_lr)
