"""Sizing one noisy calibration release: scale, sensitivity, noise, job-spec fields.

This is the one call the service needs per FFC/CCVR job. Given the release shape, the
federation (``n`` participants, ``t`` guaranteed contributors), the per-release target
ε at δ and a public bound on any participant's number of examples, it

1. fixes the fixed-point scale ``f = 2q`` (exact statistics of ``q``-bit features
   encode without rounding except the ``√2`` off-diagonals; see
   :mod:`spherecal.spherefed.privacy.sensitivity`);
2. bounds the ring-unit sensitivity ``Δ̃₂``, ``Δ̃₁``;
3. finds the smallest total noise variance (Skellam) or per-party ``σ`` (distributed
   discrete Gaussian) whose RDP bound meets ε at δ with only ``t - c`` honest
   contributors (``c`` colluders), and the per-participant noise (:mod:`spherecal.crypto.dp`);
4. checks the ring cannot wrap and returns the ``JobSpec.create`` arguments.

Coordinator and participants run it with the same public inputs and get the same
plan; a participant additionally checks the job spec against it
(:func:`spherecal.crypto.dp.verify_plan`) before joining.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spherecal.crypto.dp import (
    DEFAULT_MECHANISM,
    DEFAULT_TAIL_LOG2,
    DGAUSS,
    SKELLAM,
    NoisePlan,
    check_ring_headroom,
    plan_noise,
    realised_noise,
)
from spherecal.spherefed.privacy.accounting import (
    ddg_rdp,
    ddg_sigma_for,
    delta_with_truncation,
    epsilon,
    skellam_rdp,
    skellam_variance_for,
)
from spherecal.spherefed.privacy.charge import PrivacyCharge
from spherecal.spherefed.privacy.sensitivity import (
    DEFAULT_QUANT_BITS,
    Sensitivity,
    release_length,
    ring_sensitivity,
)

__all__ = ["CalibrationPlan", "plan_calibration_release"]


@dataclass(frozen=True)
class CalibrationPlan:
    """Everything fixed before a noisy FFC/CCVR job starts."""

    kind: str
    dim: int
    num_classes: int
    target_epsilon: float
    delta: float
    quant_bits: int
    scale_bits: int
    value_bound: float
    sensitivity: Sensitivity
    noise: NoisePlan
    planned_epsilon: float
    """ε at δ with exactly the guaranteed number of honest contributors (``<= target``)."""

    @property
    def mechanism(self) -> str:
        return self.noise.mechanism

    @property
    def length(self) -> int:
        return self.noise.length

    def job_spec_arguments(self) -> dict[str, Any]:
        """Keyword arguments for :meth:`spherecal.crypto.spec.JobSpec.create`."""
        return {
            "length": self.length,
            "bound": self.value_bound,
            "scale_bits": self.scale_bits,
            "noise_bound": self.noise.noise_bound,
        }

    def rdp(self, contributors: int) -> Any:
        """The RDP curve of a release whose aggregate has ``contributors`` inputs."""
        honest = realised_noise(self.noise, contributors).honest_contributors
        s = self.sensitivity
        if self.mechanism == SKELLAM:
            return skellam_rdp(honest * self.noise.participant_variance, s.l2_ring, s.l1_ring)
        return ddg_rdp(self.noise.participant_variance, honest, s.l2_ring, s.l1_ring, self.length)

    def charge(self, contributors: int) -> PrivacyCharge:
        """What the release actually cost, from the aggregate's contributor count."""
        realised = realised_noise(self.noise, contributors)
        scale = float(2**self.scale_bits)
        noise = realised.to_json()
        noise["stddev_real_units"] = (realised.total_variance**0.5) / scale
        noise["noise_bound"] = self.noise.noise_bound
        return PrivacyCharge.from_curve(
            self.kind,
            self.mechanism,
            self.rdp(contributors),
            self.delta,
            tail_probability=self.noise.tail_probability,
            noise=noise,
            sensitivity=self.sensitivity.to_json(),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dim": self.dim,
            "num_classes": self.num_classes,
            "mechanism": self.mechanism,
            "target_epsilon": self.target_epsilon,
            "planned_epsilon": self.planned_epsilon,
            "delta": self.delta,
            "delta_with_truncation": delta_with_truncation(
                self.planned_epsilon, self.delta, self.noise.tail_probability
            ),
            "quant_bits": self.quant_bits,
            "scale_bits": self.scale_bits,
            "value_bound": self.value_bound,
            "sensitivity": self.sensitivity.to_json(),
            "noise": self.noise.to_json(),
        }


def plan_calibration_release(
    kind: str,
    *,
    dim: int,
    num_classes: int,
    participants: int,
    min_contributors: int,
    epsilon_target: float,
    delta: float,
    max_examples: int,
    mechanism: str = DEFAULT_MECHANISM,
    quant_bits: int = DEFAULT_QUANT_BITS,
    colluders: int = 0,
    tail_log2: float = DEFAULT_TAIL_LOG2,
) -> CalibrationPlan:
    """Plan one noisy FFC (``kind="ffc"``) or CCVR (``"ccvr"``) release (module docstring).

    Raises :class:`spherecal.crypto.dp.RingOverflowRisk` (the noisy sum could wrap: lower
    ``quant_bits`` or ``max_examples``) or :class:`spherecal.crypto.dp.NoiseTooLarge`.
    """
    if epsilon_target <= 0:
        raise ValueError("epsilon_target must be positive")
    scale_bits = 2 * quant_bits
    sens = ring_sensitivity(
        kind,
        dim,
        num_classes,
        scale_bits=scale_bits,
        quant_bits=quant_bits,
        max_examples=max_examples,
    )
    length = release_length(kind, dim, num_classes)
    honest = min_contributors - colluders
    if honest < 1:
        raise ValueError(f"{colluders} colluders leave no honest contributor")
    if mechanism == SKELLAM:
        target_variance = skellam_variance_for(epsilon_target, delta, sens.l2_ring, sens.l1_ring)
    elif mechanism == DGAUSS:
        sigma = ddg_sigma_for(
            epsilon_target,
            delta,
            sens.l2_ring,
            sens.l1_ring,
            length,
            contributors=honest,
            max_contributors=participants,
        )
        target_variance = honest * sigma * sigma
    else:
        raise ValueError(f"mechanism must be {SKELLAM!r} or {DGAUSS!r}, got {mechanism!r}")
    noise = plan_noise(
        target_variance,
        min_contributors=min_contributors,
        participants=participants,
        length=length,
        mechanism=mechanism,
        colluders=colluders,
        tail_log2=tail_log2,
    )
    value_bound = float(max_examples)
    check_ring_headroom(participants, value_bound, scale_bits, noise.noise_bound)
    if mechanism == SKELLAM:
        curve = skellam_rdp(honest * noise.participant_variance, sens.l2_ring, sens.l1_ring)
    else:
        curve = ddg_rdp(
            noise.participant_variance,
            honest,
            sens.l2_ring,
            sens.l1_ring,
            length,
            tau_contributors=participants,
        )
    planned, _ = epsilon(curve, delta)
    return CalibrationPlan(
        kind=kind,
        dim=dim,
        num_classes=num_classes,
        target_epsilon=epsilon_target,
        delta=delta,
        quant_bits=quant_bits,
        scale_bits=scale_bits,
        value_bound=value_bound,
        sensitivity=sens,
        noise=noise,
        planned_epsilon=planned,
    )
