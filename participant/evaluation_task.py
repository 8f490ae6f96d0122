"""The participant's evaluation task: counts of the model and its calibrated heads.

Why a module of its own: the task handler of ``EvaluateTask`` grew with the
calibrated heads (bias, QDA's quadratic term) and the validation split of the
calibrators' grid; kept out of ``runner`` (which dispatches it) so that the task
loop stays under the module size limit. It is a function of the runner's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import numpy as np

from spherecal import crypto
from spherecal.participant.dp_gate import PrivacyRefused
from spherecal.participant.evaluation_checks import (
    check_evaluation,
    counts_vector,
    download_heads,
    evaluation_digest,
    evaluation_length,
)
from spherecal.participant.release_ledger import EVALUATE
from spherecal.participant.results import FinalModels
from spherecal.participant.transport import TransportError
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.discriminant import CalibratedHead

if TYPE_CHECKING:
    from spherecal.participant.runner import ParticipantRunner

__all__ = ["evaluate_task"]


def evaluate_task(runner: ParticipantRunner, task_id: str, task: pb.EvaluateTask) -> None:
    """Counts on the local test (or validation) split: securely aggregated when the
    task carries a job, plaintext only with ``allow_plaintext``; heads checked against the plan
    and the policy, each (model, heads) evaluated once
    (``spherecal.participant.evaluation_checks``)."""
    trainer = runner._trainer()
    secure = task.HasField("secure")
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
        release = runner._reserve(
            task_id, EVALUATE, task.secure if secure else None, evaluation_digest(task)
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
    vector = runner._download(task.model, (trainer.length,))
    heads = download_heads(
        runner._download, task, num_classes=trainer.num_classes, feature_dim=trainer.feature_dim
    )
    split = "validation" if task.split == pb.SPLIT_VALIDATION else "test"
    try:
        total, counts = trainer.evaluate(vector, heads, split=split)
    except ValueError as exc:
        runner.secure.abandon(task_id, session, exc)
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
        runner.secure.set_input(task_id, session, counts_vector(task, total, counts))
        return
    try:
        runner.releases.consume(release)
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
