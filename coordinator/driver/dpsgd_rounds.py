"""The coordinator's half of distributed DP-SGD (``[privacy] updates = "distributed"``,
issue #25): plan each round's step, size its secure job, apply the noisy step.

Each round is one DP-SGD step (Abadi et al. 2016, Algorithm 1) over the union of the
sites' data. The coordinator plans it from public inputs only
(:class:`~spherecal.spherefed.privacy.distributed_dpsgd.DistributedDpsgdPlan`: σ, the
federation-wide rate ``q``, ``C``, the job's guaranteed contributors ``t``, colluders,
mechanism, the ring's grid and the public bound on any site's records), fixes the
update job's length (the model vector), bound (``max_examples·C``), grid and noise
bound from it, and sends the same inputs with the task
(:class:`spherecal.proto.spherecal_pb2.DPSGDStep`) so that every site re-plans,
verifies and charges before it samples. The unmasked sum is the sum of the sites'
clipped gradient sums plus at least ``(σΔ)²`` of noise per entry; the step is

    θ ← θ − η · m ⊙ (Σ_k g_k + noise) / B,

with ``η`` = ``[training] lr``, ``m`` the trainable entries of the model vector (the
noise on buffer entries is dropped) and ``B`` the public expected batch size
``q·N`` (``[privacy] dpsgd_expected_batch_size``), as Opacus divides by the expected
batch size. Each completed step is recorded in the coordinator's ledger
(:meth:`~spherecal.coordinator.driver.dp_releases.CoordinatorPrivacy.record_dpsgd_step`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.driver.dp_releases import CoordinatorPrivacy
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.driver.secure_job import guaranteed_inputs
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.algorithms.base import parameter_mask
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan

__all__ = ["DistributedDpsgd"]


class DistributedDpsgd:
    """Plans, step and accounting of distributed DP-SGD rounds."""

    def __init__(
        self, settings: CoordinatorSettings, model: GlobalModel, privacy: CoordinatorPrivacy
    ) -> None:
        self.settings = settings
        self.privacy = privacy
        self.length = model.length
        self.mask = parameter_mask(model.net, model.keys)
        p = settings.privacy
        self.expected_batch = float(p.dpsgd_expected_batch_size)
        self.max_examples = int(settings.max_examples_per_site)

    def plan(self, n: int) -> DistributedDpsgdPlan:
        """The step's plan for a job over ``n`` participants."""
        p = self.settings.privacy
        return DistributedDpsgdPlan(
            noise_multiplier=p.dpsgd_noise_multiplier,
            sample_rate=p.dpsgd_sample_rate,
            max_grad_norm=p.dpsgd_max_grad_norm,
            min_contributors=guaranteed_inputs(self.settings.secagg, n, p.colluders),
            colluders=p.colluders,
            mechanism=p.mechanism,
        )

    def spec_arguments(self, plan: DistributedDpsgdPlan, n: int) -> dict[str, Any]:
        return plan.job_spec_arguments(self.length, n, self.max_examples)

    def message(self, plan: DistributedDpsgdPlan) -> pb.DPSGDStep:
        return pb.DPSGDStep(
            noise_multiplier=plan.noise_multiplier,
            sample_rate=plan.sample_rate,
            max_grad_norm=plan.max_grad_norm,
            min_contributors=plan.min_contributors,
            colluders=plan.colluders,
            delta=self.settings.privacy.delta,
            mechanism=plan.mechanism,
            scale_bits=plan.scale_bits,
            max_examples=self.max_examples,
        )

    def step(
        self, before: npt.NDArray[np.float64], noisy_sum: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """``θ − η·m⊙(noisy sum)/B`` (module docstring)."""
        if noisy_sum.shape != before.shape:
            raise ValueError(f"the step's sum has shape {noisy_sum.shape}, model {before.shape}")
        if not np.isfinite(noisy_sum).all():
            raise ValueError("the step's noisy sum is not finite")
        lr = self.settings.training.lr
        return np.asarray(before - lr * self.mask * (noisy_sum / self.expected_batch))

    def record(
        self, job_hex: str, round_index: int, plan: DistributedDpsgdPlan, contributors: list[str]
    ) -> dict[str, Any]:
        return self.privacy.record_dpsgd_step(
            job_hex=job_hex,
            round_index=round_index,
            plan=plan,
            length=self.length,
            contributors=contributors,
        )
