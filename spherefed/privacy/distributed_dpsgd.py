"""Distributed DP-SGD: the noise plan and the accounting of one step over the union
of the sites' data (issue #25, item 1 — the planning and accounting half only).

Why: local DP-SGD makes every site add the full noise a central server would add
once, so the sum of ``n`` updates carries ``n×`` the variance central DP-SGD needs
for the same record-level ε. With secure aggregation the coordinator only sees the
sum, so each site can add a *share*: each Poisson-samples its records at the
federation-wide rate ``q``, clips per-example gradients to ``C``, sums them, and adds
Gaussian noise of variance ``σ²C² / (t − c)``, where ``t`` is the job's guaranteed
contributors (no sum of fewer is ever unmasked) and ``c`` the colluding sites assumed
to know their own noise. Any ``t`` honest contributors then put at least ``σ²C²`` into
the sum — the noise of central DP-SGD (Abadi et al. 2016) on the pooled data with the
same sampling — so one step is the sampled Gaussian mechanism with multiplier ``σ``
and its record-level RDP is Opacus's (Mironov, Talwar & Zhang 2019), composed over
steps. A dropout leaves ``k ≥ t`` contributors: more noise, never less; the realised
multiplier is ``σ·√((k − c)/(t − c))``.

Not here yet (documented as not done in docs/privacy.md): the participant's step
(Poisson sampling at ``q``, per-example clipping, the noise share in the ring — the
exact Skellam counterpart of this Gaussian share), the coordinator's plan in the job
spec, the per-step ledger charge, and the service test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spherecal.spherefed.privacy.charge import PrivacyCharge, dpsgd_charge

__all__ = ["DistributedDpsgdPlan"]


@dataclass(frozen=True)
class DistributedDpsgdPlan:
    """Public inputs of distributed DP-SGD; every site re-derives the same plan."""

    noise_multiplier: float
    """``σ``: the sum carries at least ``(σC)²`` of noise variance per coordinate."""
    sample_rate: float
    """``q``: each record is in a step's batch independently with this probability."""
    max_grad_norm: float
    """``C``: per-example gradients are clipped to this L2 norm (the sensitivity)."""
    min_contributors: int
    """``t``: no sum of fewer inputs is unmasked."""
    colluders: int = 0
    """``c``: sites assumed to collude with the coordinator (their noise is known)."""

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0 or not math.isfinite(self.noise_multiplier):
            raise ValueError(f"noise_multiplier must be positive, got {self.noise_multiplier}")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must lie in (0, 1], got {self.sample_rate}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive, got {self.max_grad_norm}")
        if self.min_contributors < 1 or not 0 <= self.colluders < self.min_contributors:
            raise ValueError(
                f"need 0 ≤ colluders < min_contributors, got {self.colluders}, "
                f"{self.min_contributors}"
            )

    @property
    def site_stddev(self) -> float:
        """Each site's noise standard deviation per coordinate (gradient units)."""
        honest = self.min_contributors - self.colluders
        return self.noise_multiplier * self.max_grad_norm / math.sqrt(honest)

    def realised_multiplier(self, contributors: int) -> float:
        """The multiplier the sum of ``contributors`` inputs really carries against a
        coordinator that knows the colluders' noise (at least ``σ``)."""
        if contributors < self.min_contributors:
            raise ValueError(
                f"{contributors} contributors: a sum of fewer than {self.min_contributors} "
                f"is never unmasked"
            )
        honest = contributors - self.colluders
        return self.site_stddev * math.sqrt(honest) / self.max_grad_norm

    def charge(self, steps: int, delta: float, *, contributors: int | None = None) -> PrivacyCharge:
        """The record-level cost of ``steps`` steps: what a site charges before a step
        (``contributors=None``: the worst case, ``t``) or the federation records after
        it (the real contributor count)."""
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        k = self.min_contributors if contributors is None else contributors
        return dpsgd_charge(
            self.realised_multiplier(k),
            self.sample_rate,
            steps,
            delta,
            max_grad_norm=self.max_grad_norm,
            kind="distributed-dpsgd",
        )

    def steps_within(self, budget_epsilon: float, delta: float, *, limit: int = 100_000) -> int:
        """The most steps whose worst-case charge stays within ``budget_epsilon``
        (0 when not even one does); bisection on the monotone ε(steps)."""
        if self.charge(1, delta).epsilon > budget_epsilon:
            return 0
        lo, hi = 1, 2
        while hi <= limit and self.charge(hi, delta).epsilon <= budget_epsilon:
            lo, hi = hi, hi * 2
        hi = min(hi, limit + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.charge(mid, delta).epsilon <= budget_epsilon:
                lo = mid
            else:
                hi = mid
        return lo
