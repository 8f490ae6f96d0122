"""The ``[privacy]`` settings shared by coordinator and participant configurations.

Both sides read the same table so that an operator reads one vocabulary: the
coordinator uses it to *request* noisy calibration releases (and to size them), a
participant uses it as *its own* policy — whether it demands noise, which ε per
release it accepts at most, its total budget, and how many colluders it assumes.
A participant never trusts the coordinator's numbers: it re-plans the noise from
the job's public inputs and refuses what its policy or budget does not allow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spherecal.crypto.dp import DGAUSS, SKELLAM
from spherecal.spherefed.privacy.ledger import PrivacyBudget
from spherecal.spherefed.privacy.sensitivity import DEFAULT_QUANT_BITS

__all__ = ["MECHANISMS", "UPDATE_MODES", "PrivacySettings"]

MECHANISMS = (SKELLAM, DGAUSS)
UPDATES_NONE = "none"
UPDATES_DISTRIBUTED = "distributed"
UPDATE_MODES = (UPDATES_NONE, UPDATES_DISTRIBUTED)


@dataclass(frozen=True)
class PrivacySettings:
    """One ``[privacy]`` table (see docs/privacy.md, "Switching it on")."""

    enabled: bool = False
    mechanism: str = SKELLAM
    epsilon: float | None = None
    """Target ε of each calibration release (coordinator) / the largest ε per release
    this participant accepts (participant)."""
    total_epsilon: float | None = None
    """Total budget over every release (composed by RDP); ``None`` = no total limit."""
    delta: float = 1e-5
    max_examples: int = 100_000
    """Public bound on any participant's number of training examples. It sizes the ring
    headroom and the rounding term of the sensitivity; it is never read off data. A
    participant with more examples computes each release over a random subset of this
    many (drawn afresh per release) and never refuses on its count: a refusal would
    tell the coordinator, without noise or charge, that it holds more."""
    quant_bits: int = DEFAULT_QUANT_BITS
    colluders: int = 0
    """Participants assumed to collude with the coordinator (their noise is not counted).
    A participant also refuses a secure job whose threshold does not cover them
    (``2t > share holders + colluders``, with DP on or off): at a lower one the
    coordinator and that many members read its input by splitting its share holders
    between two signed survivor sets."""
    dpsgd: bool = False
    """Participant only: train locally with DP-SGD (Opacus), each round charged to the
    local ledger and refused over budget. Protects the trained weights; the mean loss
    sent with each update is not covered, and the example count it is weighted by is
    released once per federation with its own noise (``[policy]
    example_count_noise_sd``)."""
    dpsgd_noise_multiplier: float = 1.0
    """Local DP-SGD's σ; with ``updates = "distributed"``: the coordinator's σ of every
    step, and the smallest σ a participant accepts."""
    dpsgd_max_grad_norm: float = 1.0
    updates: str = UPDATES_NONE
    """``"distributed"``: training is distributed DP-SGD (issue #25) — each round one
    step over the union of the sites' data, each site's clipped gradient sum noised
    in the ring (``spherecal.spherefed.privacy.distributed_dpsgd``). Coordinator: run
    it (needs secure updates). Participant: demand it, refusing any other training
    task. ``"none"``: updates carry no DP unless ``dpsgd`` is on."""
    dpsgd_sample_rate: float = 0.01
    """Distributed DP-SGD (coordinator): the federation-wide Poisson rate ``q``."""
    dpsgd_expected_batch_size: float = 0.0
    """Distributed DP-SGD (coordinator): the public ``q·N`` the noisy sum is divided
    by (``N`` the federation's training records; a public figure, never read off
    data). Required with ``updates = "distributed"``."""

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(
                f"privacy mechanism must be one of {MECHANISMS}, got {self.mechanism!r}"
            )
        for name in ("epsilon", "total_epsilon"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"privacy {name} must be a positive number")
        if not 0 < self.delta < 1:
            raise ValueError(f"privacy delta must be in (0, 1), got {self.delta}")
        if self.max_examples < 1:
            raise ValueError("privacy max_examples must be >= 1")
        if not 1 <= self.quant_bits <= 20:
            raise ValueError("privacy quant_bits must be in 1..20")
        if self.colluders < 0:
            raise ValueError("privacy colluders must be >= 0")
        if not (self.dpsgd_noise_multiplier > 0 and self.dpsgd_max_grad_norm > 0):
            raise ValueError("privacy dpsgd_noise_multiplier and dpsgd_max_grad_norm must be > 0")
        if self.updates not in UPDATE_MODES:
            raise ValueError(f"privacy updates must be one of {UPDATE_MODES}, got {self.updates!r}")
        if not 0 < self.dpsgd_sample_rate <= 1:
            raise ValueError("privacy dpsgd_sample_rate must be in (0, 1]")
        batch = self.dpsgd_expected_batch_size
        if not (math.isfinite(batch) and batch >= 0):
            raise ValueError("privacy dpsgd_expected_batch_size must be >= 0")
        if self.enabled and self.epsilon is None and self.total_epsilon is None:
            raise ValueError("[privacy] enabled needs epsilon (per release) or total_epsilon")

    @property
    def distributed_updates(self) -> bool:
        return self.updates == UPDATES_DISTRIBUTED

    @property
    def release_epsilon(self) -> float:
        """The per-release target a coordinator plans with (the whole budget if only a
        total is configured)."""
        value = self.epsilon if self.epsilon is not None else self.total_epsilon
        if value is None:
            raise ValueError("no epsilon configured")
        return value

    def budget(self) -> PrivacyBudget:
        return PrivacyBudget(
            delta=self.delta, total_epsilon=self.total_epsilon, epsilon_per_release=self.epsilon
        )
