"""What one release costs: its RDP curve, ε(δ) alone, and what produced it.

A :class:`PrivacyCharge` is the unit the ledger records and composes. It keeps the
whole RDP curve on :data:`~spherecal.spherefed.privacy.accounting.ORDERS` (so composition is
exact RDP addition) and, for the reader, the mechanism, noise and sensitivity that
determined it, as plain JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.spherefed.privacy.accounting import ORDERS, dpsgd_rdp, epsilon, gaussian_rdp

__all__ = ["LOCAL_DPSGD_KIND", "PrivacyCharge", "dpsgd_charge", "gaussian_charge"]

LOCAL_DPSGD_KIND = "dpsgd"
"""The kind of a site's local DP-SGD charge: its ε follows the site's example count
(sampling rate ``1/⌈n/b⌉``), unlike every charge planned from public inputs."""


@dataclass(frozen=True)
class PrivacyCharge:
    """The privacy cost of one release (one FFC job, one CCVR job, one DP-SGD run…)."""

    kind: str
    """What was released: ``"ffc"``, ``"ccvr"``, ``"dpsgd"``, ``"model_update"``…"""
    mechanism: str
    """``"skellam"``, ``"dgauss"``, ``"gaussian"`` or ``"dpsgd"``."""
    rdp: tuple[float, ...]
    delta: float
    epsilon: float
    """ε of this release alone at ``delta``."""
    tail_probability: float = 0.0
    """TV distance to the untruncated mechanism (adds ``(1+e^ε)·η`` to δ)."""
    noise: dict[str, Any] = field(default_factory=dict)
    sensitivity: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.rdp) != len(ORDERS):
            raise ValueError(f"an RDP curve needs {len(ORDERS)} values, got {len(self.rdp)}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if any(math.isnan(v) or v < 0 for v in self.rdp):
            raise ValueError("RDP values must be non-negative numbers")

    @classmethod
    def from_curve(
        cls,
        kind: str,
        mechanism: str,
        curve: npt.ArrayLike,
        delta: float,
        *,
        tail_probability: float = 0.0,
        noise: dict[str, Any] | None = None,
        sensitivity: dict[str, Any] | None = None,
    ) -> PrivacyCharge:
        values = tuple(float(v) for v in np.asarray(curve, dtype=np.float64))
        eps, _ = epsilon(values, delta)
        return cls(
            kind=kind,
            mechanism=mechanism,
            rdp=values,
            delta=delta,
            epsilon=eps,
            tail_probability=tail_probability,
            noise=dict(noise or {}),
            sensitivity=dict(sensitivity or {}),
        )

    @property
    def curve(self) -> npt.NDArray[np.float64]:
        return np.asarray(self.rdp, dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "mechanism": self.mechanism,
            "delta": self.delta,
            "epsilon": self.epsilon,
            "tail_probability": self.tail_probability,
            "noise": self.noise,
            "sensitivity": self.sensitivity,
            "rdp": list(self.rdp),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PrivacyCharge:
        return cls(
            kind=str(data["kind"]),
            mechanism=str(data["mechanism"]),
            rdp=tuple(float(v) for v in data["rdp"]),
            delta=float(data["delta"]),
            epsilon=float(data["epsilon"]),
            tail_probability=float(data.get("tail_probability", 0.0)),
            noise=dict(data.get("noise", {})),
            sensitivity=dict(data.get("sensitivity", {})),
        )


def gaussian_charge(
    kind: str, noise_multiplier: float, delta: float, *, l2_sensitivity: float = 1.0
) -> PrivacyCharge:
    """One release of the (continuous) Gaussian mechanism, ``σ = z·Δ₂``."""
    return PrivacyCharge.from_curve(
        kind,
        "gaussian",
        gaussian_rdp(noise_multiplier),
        delta,
        noise={"noise_multiplier": noise_multiplier, "stddev": noise_multiplier * l2_sensitivity},
        sensitivity={"l2": l2_sensitivity},
    )


def dpsgd_charge(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    *,
    max_grad_norm: float,
    kind: str = LOCAL_DPSGD_KIND,
) -> PrivacyCharge:
    """A DP-SGD run (Poisson-sampled, per-example clipping at ``max_grad_norm``)."""
    return PrivacyCharge.from_curve(
        kind,
        "dpsgd",
        dpsgd_rdp(noise_multiplier, sample_rate, steps),
        delta,
        noise={"noise_multiplier": noise_multiplier, "sample_rate": sample_rate, "steps": steps},
        sensitivity={"max_grad_norm": max_grad_norm},
    )
