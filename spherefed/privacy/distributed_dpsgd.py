"""Distributed DP-SGD: the noise plan and the accounting of one step over the union
of the sites' data (issue #25, item 1).

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

In the ring (:meth:`DistributedDpsgdPlan.ring_noise`): the site's clipped sum is
rounded to the job's fixed-point grid ``2^-f`` before its noise is added, which can
move two neighbouring sums apart by up to ``√d·2^-f`` more (``d`` entries, each
rounding error at most ``2^-f-1``), so the noise is sized for the sensitivity
``Δ = C + √d·2^-f`` (:meth:`DistributedDpsgdPlan.sensitivity`): the sum carries
``(σΔ)²`` and the charge is the sampled Gaussian's with multiplier ``σ`` at that
sensitivity. The noise is the exact integer mechanism of :mod:`spherecal.crypto.dp`
(Skellam by default), split over the ``t`` guaranteed contributors like a calibration
release's; its variance is at least the Gaussian's. The charge is Opacus's accountant
for the sampled *Gaussian*, i.e. it treats the ring's noise as Gaussian of that
variance — an approximation, stated as such: for the un-subsampled mechanism the
Skellam's RDP exceeds the Gaussian's ``αΔ²/(2·var)`` by about ``α/(2σ⁴(Δ·2^f)²)``
(Agarwal, Kairouz & Liu 2021, Thm. 3.5; ≈ ``1.2·10⁻¹⁰·α/σ⁴`` at ``f = 16``,
``C = 1``), and the subsampled bound is taken over from the Gaussian's.

The participant's step (sampling, clipping, summing) is
:mod:`spherecal.spherefed.privacy.dpsgd_step`; the service's halves are
``spherecal.participant.distributed_dpsgd`` and
``spherecal.coordinator.driver.dpsgd_rounds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from spherecal.crypto.dp import DEFAULT_MECHANISM, NoisePlan, plan_noise
from spherecal.spherefed.privacy.charge import PrivacyCharge, dpsgd_charge

__all__ = ["DEFAULT_SCALE_BITS", "DistributedDpsgdPlan"]

DEFAULT_SCALE_BITS = 16
"""Fixed-point bits of the clipped sums in the ring: a grid of ``2^-16`` adds
``√d·1.5·10⁻⁵`` to the sensitivity (0.002 for ``d = 2·10⁴`` entries, against ``C = 1``)."""


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
    scale_bits: int = DEFAULT_SCALE_BITS
    """``f``: the ring's fixed-point grid is ``2^-f``."""
    mechanism: str = DEFAULT_MECHANISM
    """The exact integer noise in the ring (``skellam`` or ``dgauss``)."""

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
        if not 1 <= self.scale_bits <= 30:
            raise ValueError(f"scale_bits must be in 1..30, got {self.scale_bits}")

    def sensitivity(self, length: int) -> float:
        """``Δ = C + √d·2^-f``: the L2 distance two neighbouring sites' sums can have
        after rounding to the ring's grid (module docstring)."""
        return self.max_grad_norm + math.sqrt(length) * 2.0**-self.scale_bits

    def value_bound(self, max_examples: int) -> float:
        """Bound on every entry of a site's clipped sum: at most ``max_examples``
        records, each of norm at most ``C`` (the job spec's ``bound``)."""
        return float(max_examples) * self.max_grad_norm

    def ring_noise(self, length: int, participants: int) -> NoisePlan:
        """Each site's integer noise: any ``t − c`` honest contributors together
        reach ``(σΔ·2^f)²`` ring units² per entry (:func:`spherecal.crypto.dp.plan_noise`)."""
        sd_ring = self.noise_multiplier * self.sensitivity(length) * 2.0**self.scale_bits
        return plan_noise(
            sd_ring**2,
            min_contributors=self.min_contributors,
            participants=participants,
            length=length,
            mechanism=self.mechanism,
            colluders=self.colluders,
        )

    def job_spec_arguments(
        self, length: int, participants: int, max_examples: int
    ) -> dict[str, Any]:
        """The job spec's length, bound, scale and noise bound for this step."""
        return {
            "length": length,
            "bound": self.value_bound(max_examples),
            "scale_bits": self.scale_bits,
            "noise_bound": self.ring_noise(length, participants).noise_bound,
        }

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
