"""The participant's half of distributed DP-SGD (issue #25): admit the step, charge it,
then compute the clipped gradient sum and its noise share.

Order matters and follows the calibration releases' gate (``dp_gate``): from the
step's public inputs (:class:`spherecal.proto.spherecal_pb2.DPSGDStep`) the site
re-plans the noise itself (``DistributedDpsgdPlan``, in
:mod:`spherecal.spherefed.privacy.distributed_dpsgd`),
checks that the job spec the coordinator signed carries that plan (length = the
model's, the plan's grid and bound, a noise bound and a guaranteed contributor count
at least the plan's — :func:`spherecal.crypto.dp.verify_plan`), checks its own policy
(σ at least its ``dpsgd_noise_multiplier``, δ its own), and charges one step — at
the worst case of ``t`` contributors — to its own ledger *before its data is
touched*. Over budget it refuses with the numbers (``BudgetExceeded``). Only then
does it sample, clip, sum
(:func:`~spherecal.spherefed.privacy.dpsgd_step.clipped_gradient_sum`) and draw its
integer noise (:func:`spherecal.crypto.dp.sample_noise`, keyed from ``os.urandom``),
which the secure session adds in the ring before masking.

It never refuses because of how many records it holds: a site above the step's
public ``max_examples`` samples from a random ``max_examples`` of them
(:func:`step_input`). A refusal would be a free, un-noised answer to "more than
this bound?", and the coordinator chooses the bound per step — a binary search for
the site's count.

A plaintext step is refused whatever ``allow_plaintext`` says: without secure
aggregation each site would have to add the whole central noise, which is local
DP-SGD (``dpsgd = true``), not this.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.crypto import JobSpec, SecAggError
from spherecal.crypto.dp import NoisePlan, sample_noise, verify_plan
from spherecal.participant.dp_gate import (
    BudgetExceeded,
    NoiseRequired,
    ParticipantPrivacy,
    PrivacyRefused,
)
from spherecal.participant.failures import LOCAL_WORK_ERRORS
from spherecal.participant.release_ledger import ReleaseLedger
from spherecal.participant.secure_jobs import SecureSteps
from spherecal.participant.trainer import LocalTrainer, random_subset
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.dpsgd_step import (
    ClippedSum,
    clipped_gradient_sum,
    poisson_sample,
)

__all__ = [
    "AdmittedStep",
    "admit_step",
    "distributed_step",
    "plan_from_message",
    "require_distributed",
    "step_input",
    "step_prefix",
    "step_terms",
]


def plan_from_message(step: pb.DPSGDStep, *, colluders: int = 0) -> DistributedDpsgdPlan:
    """The plan the step's public inputs define (``colluders``: at least the step's)."""
    try:
        return DistributedDpsgdPlan(
            noise_multiplier=float(step.noise_multiplier),
            sample_rate=float(step.sample_rate),
            max_grad_norm=float(step.max_grad_norm),
            min_contributors=int(step.min_contributors),
            colluders=max(int(step.colluders), colluders),
            scale_bits=int(step.scale_bits),
            mechanism=step.mechanism,
        )
    except ValueError as exc:
        raise PrivacyRefused(f"invalid distributed DP-SGD step: {exc}") from None


def require_distributed(privacy: ParticipantPrivacy, task: pb.TrainTask) -> None:
    """A site with ``[privacy] updates = "distributed"`` trains only that way; any
    step must be securely aggregated."""
    if task.HasField("dpsgd"):
        if not task.HasField("secure"):
            raise NoiseRequired(
                "distributed DP-SGD needs secure aggregation: each site adds only a share "
                "of the noise, so its sum must never be seen alone"
            )
        if privacy.settings.dpsgd:
            # A step's admission compares the budget with what the site spent, and a
            # local DP-SGD round spends an ε that follows its example count: steps
            # between local rounds would read the count off the round they stop at.
            raise PrivacyRefused(
                "this participant trains with local DP-SGD ([privacy] dpsgd = true); it "
                "takes no distributed DP-SGD step"
            )
        return
    if privacy.settings.distributed_updates:
        raise NoiseRequired(
            "this participant trains only with distributed DP-SGD ([privacy] updates = "
            '"distributed"); the round carries no DP-SGD step'
        )


@dataclass(frozen=True)
class AdmittedStep:
    plan: DistributedDpsgdPlan
    noise: NoisePlan
    entry: dict[str, Any]
    """The local ledger's entry for this step (``epsilon``, ``epsilon_total``…)."""
    max_examples: int
    """The step's public bound on one site's records (the job's value bound is this
    times ``C``): a site holding more samples from a random subset of this size."""


def step_terms(step: pb.DPSGDStep) -> str:
    """The terms of a federation's steps, exactly (``repr`` of each number): the step
    but for what follows each job's roster (``min_contributors``, and the ring's
    ``scale_bits``). A site's charge per step is its worst case at ``t`` contributors,
    which carries ``σ`` whatever ``t``, so these terms alone fix the ε of every step
    of the federation."""
    return (
        f"σ = {step.noise_multiplier!r}, q = {step.sample_rate!r}, C = "
        f"{step.max_grad_norm!r}, colluders {step.colluders}, δ = {step.delta!r}, "
        f"{step.mechanism}, max_examples {step.max_examples}"
    )


def admit_step(
    privacy: ParticipantPrivacy,
    step: pb.DPSGDStep,
    spec: JobSpec,
    *,
    model_length: int,
    federation: str,
    round_index: int,
    plan_rounds: int,
) -> AdmittedStep:
    """Plan, verify and charge one step (raises ``PrivacyRefused``/``BudgetExceeded``).

    The site's record count is not checked here: :func:`step_input` keeps within the
    step's ``max_examples`` by sampling, so nothing about the count can turn into a
    refusal the coordinator sees (module docstring).

    Nor is what the site has spent: a budget compared step by step, at parameters the
    coordinator sets per task and with refusals free, let it lower ``q`` until the
    first admission and read the site's history to any precision. The federation's
    steps have one set of terms (:func:`step_terms`, kept at the first step; another
    is refused without comparing), and the plan's ``plan_rounds`` steps are admitted
    all or none, the federation's own steps left out of what was spent
    (``PrivacyLedger.check_plan``, as local DP-SGD): the same answer at every round
    and after a restart, and a refusal is kept for the rest of the federation. Each
    round is charged once (``dpsgd/<federation>/round-N``), however often it is
    asked."""
    s = privacy.settings
    own_colluders = s.colluders if (s.enabled or s.distributed_updates) else 0
    plan = plan_from_message(step, colluders=own_colluders)
    if plan.noise_multiplier < s.dpsgd_noise_multiplier:
        raise PrivacyRefused(
            f"the step's noise multiplier σ = {plan.noise_multiplier:g} is below this "
            f"site's dpsgd_noise_multiplier {s.dpsgd_noise_multiplier:g}"
        )
    if not math.isclose(step.delta, s.delta, rel_tol=1e-12):
        raise PrivacyRefused(f"the step's δ = {step.delta:g} differs from ours ({s.delta:g})")
    try:
        noise = plan.ring_noise(model_length, spec.n)
        verify_plan(spec, noise)
    except (ValueError, SecAggError) as exc:
        raise PrivacyRefused(f"the job does not carry this step's noise plan: {exc}") from None
    bound = plan.value_bound(int(step.max_examples))
    if spec.scale_bits != plan.scale_bits or spec.bound < bound:
        raise PrivacyRefused(
            f"job scale 2^-{spec.scale_bits} / bound {spec.bound:g} differ from the plan's "
            f"2^-{plan.scale_bits} / {bound:g}"
        )
    delta = float(step.delta)
    entry = privacy.charge_plan_step(
        federation,
        step_terms(step),
        each=plan.charge(1, delta),
        whole=plan.charge(max(1, plan_rounds), delta),
        delta=delta,
        release_id=f"{step_prefix(federation)}round-{round_index}",
        own_prefix=step_prefix(federation),
    )
    return AdmittedStep(plan=plan, noise=noise, entry=entry, max_examples=int(step.max_examples))


def step_prefix(federation: str) -> str:
    """The ledger's ``release_id`` prefix of one federation's distributed DP-SGD steps."""
    return f"dpsgd/{federation}/"


def step_input(
    trainer: LocalTrainer,
    vector: npt.NDArray[np.float64],
    admitted: AdmittedStep,
    *,
    rng: np.random.Generator | None = None,
) -> tuple[ClippedSum, npt.NDArray[np.int64]]:
    """The site's clipped gradient sum at ``vector`` and its noise share (ring units).

    The batch is a Poisson sample at the plan's rate ``q`` of at most the step's
    ``max_examples`` records: a site holding more first draws a uniformly random
    subset of that size (:func:`~spherecal.participant.trainer.random_subset`, fresh
    each step), and records outside it are not in the batch. What the plan needs of
    the sum still holds: at most ``max_examples`` clipped gradients, so every entry
    is within the job's value bound ``max_examples·C``; each record in it moves it by
    at most ``C``; and no record is drawn with probability above ``q``. At or below
    the bound the step is exactly the plan's. Above it, adding or removing one record
    can also change which others are in the subset (at most one swapped for another),
    which the add/remove accounting does not cover exactly — ``docs/privacy.md``
    states that cost; refusing instead would leak the count itself. Without ``rng``
    both draws are the site's own randomness (``secrets``, ``os.urandom``); ``rng``
    fixes them for tests."""
    trainer.load(vector)
    data = trainer.data
    subset = random_subset(data.train_size, admitted.max_examples, rng)
    batch = subset[poisson_sample(int(subset.shape[0]), admitted.plan.sample_rate, rng)]
    clipped = clipped_gradient_sum(
        trainer.model,
        data.train_x,
        data.train_y,
        loss=trainer.config.loss,
        max_grad_norm=admitted.plan.max_grad_norm,
        sample_rate=admitted.plan.sample_rate,
        indices=batch,
    )
    return clipped, sample_noise(admitted.noise)


def distributed_step(
    *,
    task_id: str,
    task: pb.TrainTask,
    release_key: str,
    trainer: LocalTrainer,
    privacy: ParticipantPrivacy,
    secure: SecureSteps,
    releases: ReleaseLedger,
    download: Callable[[pb.TensorRef, tuple[int, ...]], npt.NDArray[np.float64]],
    refuse: Callable[[str, BaseException], None],
    log: Callable[[str], None],
    federation: str,
    plan_rounds: int,
) -> None:
    """One round of distributed DP-SGD at this site: admit and charge (refusing over
    budget, before any key is advertised or any data read), then the secure session,
    the clipped sum and its noise share in the ring."""
    step = task.dpsgd
    try:
        spec = JobSpec.from_bytes(task.secure.spec)
        admitted = admit_step(
            privacy,
            step,
            spec,
            model_length=trainer.length,
            federation=federation,
            round_index=int(task.round),
            plan_rounds=plan_rounds,
        )
    except (PrivacyRefused, BudgetExceeded, SecAggError) as exc:
        refuse(task_id, exc)
        return
    plan = admitted.plan
    releases.annotate(
        release_key,
        epsilon=float(admitted.entry["epsilon"]),
        delta=float(step.delta),
        noise={
            "mechanism": plan.mechanism,
            "distributed_dpsgd": {
                "noise_multiplier": plan.noise_multiplier,
                "sample_rate": plan.sample_rate,
                "max_grad_norm": plan.max_grad_norm,
                "sensitivity": plan.sensitivity(trainer.length),
            },
            "plan": admitted.noise.to_json(),
        },
    )
    log(
        f"round {task.round + 1}: distributed DP-SGD step, σ = {plan.noise_multiplier:g}, "
        f"q = {plan.sample_rate:g}, C = {plan.max_grad_norm:g}: ε = "
        f"{admitted.entry['epsilon']:.4g} at δ = {step.delta:g}; local total ε = "
        f"{admitted.entry['epsilon_total']:.4g}"
    )
    session = secure.start(
        task_id,
        task.secure,
        round_index=task.round,
        expected_length=trainer.length,
        release=release_key,
    )
    if session is None:
        return
    vector = download(task.model, (trainer.length,))
    releases.record_executed(release_key, trainer.executed_digest(vector))
    held = trainer.data.train_size
    if held > admitted.max_examples:
        log(
            f"round {task.round + 1}: this site holds {held} examples, above the step's "
            f"public bound {admitted.max_examples}: this step samples from a random "
            f"{admitted.max_examples} of them"
        )
    t0 = time.monotonic()
    try:
        clipped, noise = step_input(trainer, vector, admitted)
    except LOCAL_WORK_ERRORS as exc:  # e.g. a model torch.func cannot differentiate
        # whether it fails may depend on the data: answered at the masked step, charged
        secure.withhold(task_id, session, exc)
        return
    log(
        f"round {task.round + 1}: clipped gradient sum in {time.monotonic() - t0:.1f}s "
        f"(noise share added in the ring)"
    )
    secure.set_input(task_id, session, clipped.vector, noise=noise)
