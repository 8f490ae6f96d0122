"""The participant's evaluation task: counts of the model and its calibrated heads.

Why a module of its own: evaluating is its own concern — the model and every
calibrated head (bias, QDA's quadratic term), on the test split or the validation
split of the calibrators' grid — while ``runner`` only dispatches tasks. It is a
function of the runner's state.

Issue #19: the counts leave with this site's share of distributed DP noise
(:mod:`spherecal.spherefed.privacy.evaluation_noise`), added in the ring before
masking, and the release (with its ε) is recorded in the site's ledger.

A split larger than the secure job's bound is evaluated on a random subset that fits
it (:func:`_count_limit`): a refusal by the split's size would be an exact, un-noised
answer of this site's own, past secure aggregation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import grpc
import numpy as np

from spherecal import crypto
from spherecal.crypto.dp import guaranteed_contributors, sample_noise, verify_plan
from spherecal.participant.dp_gate import NoiseRequired, PrivacyRefused
from spherecal.participant.evaluation_checks import (
    check_evaluation,
    counts_vector,
    download_heads,
    evaluation_content,
    evaluation_length,
)
from spherecal.participant.failures import LOCAL_WORK_ERRORS
from spherecal.participant.release_ledger import EVALUATE, Release, evaluation_digest
from spherecal.participant.results import FinalModels
from spherecal.participant.transport import TransportError
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.privacy.evaluation_noise import (
    EVALUATION_DELTA,
    EvaluationNoise,
    evaluation_epsilon,
    plan_evaluation_noise,
)

if TYPE_CHECKING:
    from spherecal.participant.runner import ParticipantRunner

__all__ = ["evaluate_task"]


def _noise(runner: ParticipantRunner, job: pb.SecAggJob) -> tuple[EvaluationNoise, float] | None:
    """This site's noise for an evaluation job (None with ``evaluation_noise_sd = 0``)
    and its ε; raises :class:`NoiseRequired` when the job spec cannot carry it."""
    sd = float(runner.policy.evaluation_noise_sd)
    if sd == 0:
        return None
    spec = crypto.JobSpec.from_bytes(job.spec)
    noise = plan_evaluation_noise(
        sd,
        participants=spec.n,
        min_contributors=guaranteed_contributors(spec),
        length=spec.length,
        scale_bits=spec.scale_bits,
    )
    try:
        verify_plan(spec, noise.plan)
    except crypto.SecAggError as exc:
        raise NoiseRequired(
            f"evaluation counts leave this site only with DP noise of sd {sd:g} counts "
            f"([policy] evaluation_noise_sd); {exc}"
        ) from None
    return noise, evaluation_epsilon(noise)


def _count_limit(runner: ParticipantRunner, task: pb.EvaluateTask, split: str) -> int:
    """The most examples this site evaluates in the secure job: ``⌊bound⌋`` of the
    job's spec, since the total and every correct count are entries of the input.

    Why not refuse a split that holds more: the coordinator chooses the bound, and
    the refusal would be this site's alone — past secure aggregation and the counts'
    noise — answering exactly "does the split hold more than B examples?" once per
    evaluation (up to ``max_evaluations_per_federation`` bits a federation, recorded
    as a noised release when it was a comparison). A larger split is evaluated on a
    uniformly random ``⌊bound⌋`` of its examples instead (``LocalTrainer.evaluate``),
    so the site sends counts whatever its size, and only its own log says so."""
    bound = crypto.JobSpec.from_bytes(task.secure.spec).bound
    limit = int(math.floor(bound))
    held = _split_size(runner, split)
    if held > limit:
        runner.log(
            f"evaluation ({split} split): this site holds {held} examples, above the "
            f"job's bound {bound:g}: this evaluation uses a random {limit} of them"
        )
    return limit


def _split_size(runner: ParticipantRunner, split: str) -> int:
    data = runner.data
    if split == "validation":
        return 0 if data.val_y is None else int(data.val_y.shape[0])
    return int(data.test_y.shape[0])


def _noise_json(noise: EvaluationNoise) -> dict[str, object]:
    return {"sd": noise.sd, "site_sd": noise.site_sd, **noise.plan.to_json()}


def evaluate_task(runner: ParticipantRunner, task_id: str, task: pb.EvaluateTask) -> None:
    """Counts on the local test (or validation) split: securely aggregated with each
    site's DP noise when the task carries a job, plaintext only with
    ``allow_plaintext``; heads checked against the plan and the policy, each
    (executed model, split, head contents) evaluated once
    (``spherecal.participant.evaluation_checks``)."""
    trainer = runner._trainer()
    secure = task.HasField("secure")
    split = "validation" if task.split == pb.SPLIT_VALIDATION else "test"
    try:
        check_evaluation(
            task,
            num_classes=trainer.num_classes,
            feature_dim=trainer.feature_dim,
            max_heads=runner.policy.max_evaluation_heads,
            max_validation_heads=runner.policy.max_validation_heads,
        )
        if not secure and not runner.settings.allow_plaintext:
            raise runner._no_plaintext("evaluation counts")
        vector = runner._download(task.model, (trainer.length,))
        planned = _noise(runner, task.secure) if secure else None
        release = runner._reserve(
            task_id,
            Release(
                kind=EVALUATE,
                federation=runner._federation(),
                model=trainer.executed_digest(vector),
                data=runner._fingerprint(split),
                content=evaluation_content(task),
                noised=planned is not None,
                epsilon=None if planned is None else planned[1],
                delta=None if planned is None else EVALUATION_DELTA,
                noise=None if planned is None else _noise_json(planned[0]),
            ),
            task.secure if secure else None,
            task,
        )
    except (PrivacyRefused, crypto.SecAggError) as exc:
        runner._refuse(task_id, exc)
        return
    session = None
    if secure:
        session = runner.secure.start(
            task_id,
            task.secure,
            round_index=None,
            expected_length=evaluation_length(task),
            release=release,
        )
        if session is None:
            return
    heads = download_heads(
        runner._download, task, num_classes=trainer.num_classes, feature_dim=trainer.feature_dim
    )
    limit = _count_limit(runner, task, split) if secure else None
    try:
        total, counts = trainer.evaluate(vector, heads, split=split, max_examples=limit)
    except LOCAL_WORK_ERRORS as exc:  # may depend on the data: counted as the release
        runner._local_work_failed(task_id, session, release, exc)
        return
    if task.round < 0 and split == "test":  # the final models, saved once the run completes
        linear = {n: h for n, h in heads.items() if isinstance(h, np.ndarray)}
        runner._final = FinalModels(
            vector=vector,
            vector_sha256=bytes(task.model.header.sha256).hex(),
            heads=linear,
            head_sha256={
                n.name: bytes(n.tensor.header.sha256).hex() for n in task.heads if n.name in linear
            },
            closed={n: h for n, h in heads.items() if isinstance(h, CalibratedHead)},
        )
    if session is not None:
        noise = None if planned is None else sample_noise(planned[0].plan)
        runner.secure.set_input(task_id, session, counts_vector(task, total, counts), noise=noise)
        return
    try:
        runner.releases.consume(release, value=evaluation_digest(total, counts))
    except PrivacyRefused as exc:
        runner._refuse(task_id, exc)
        return
    try:
        runner.transport.report_evaluation(
            pb.EvaluationReport(
                caller=runner._caller(),
                task_id=task_id,
                total=total,
                counts=[pb.HeadCount(head=k, correct=v) for k, v in counts.items()],
            )
        )
    except TransportError as exc:
        if exc.code is not grpc.StatusCode.ALREADY_EXISTS:
            raise
    if task.round < 0:
        shown = ", ".join(f"{k} {v}/{total}" for k, v in counts.items())
        runner.log(f"final evaluation: {shown}")
