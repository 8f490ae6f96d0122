"""The task context (``spherecal.proto.task_context``): every field the coordinator
sends all members of a job alike — the task and the plan they joined under — changes
the digest; what differs per member by design (the training seed, the plan's roster
index, the secure job message) and the blob names tensors are fetched by do not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for
from spherecal.proto.task_context import secure_task, task_context

PLAN = pb.Plan(
    federation_id="fed",
    training=pb.LocalTraining(epochs=1, batch_size=32, lr=0.1),
    rounds=3,
    participant_index=1,
)


def _ref(values: list[float], name: str = "t") -> pb.TensorRef:
    return pb.TensorRef(name=name, header=header_for(np.asarray(values, dtype=np.float64)))


def _head(name: str = "ffc", *, bias: bool = False) -> pb.NamedTensorRef:
    return pb.NamedTensorRef(
        name=name,
        kind=pb.HEAD_AFFINE,
        tensor=_ref([1.0, 2.0]),
        bias=_ref([0.5]) if bias else None,
    )


def _train() -> pb.TrainTask:
    return pb.TrainTask(round=2, model=_ref([1.0, 2.0, 3.0]), seed=7)


def _statistics() -> pb.StatisticsTask:
    return pb.StatisticsTask(kind=pb.FFC, model=_ref([1.0, 2.0, 3.0]))


def _evaluate() -> pb.EvaluateTask:
    return pb.EvaluateTask(model=_ref([1.0, 2.0, 3.0]), heads=[_head()], round=-1)


Task = Any  # one of pb.TrainTask, pb.StatisticsTask, pb.EvaluateTask, per row

CHANGES: dict[str, tuple[Callable[[], Task], Callable[[Task], None]]] = {
    "train round": (_train, lambda t: setattr(t, "round", 3)),
    "train model content": (_train, lambda t: t.model.CopyFrom(_ref([1.0, 2.0, 3.5]))),
    "train model shape": (_train, lambda t: t.model.header.shape.append(1)),
    "train broadcast": (_train, lambda t: t.broadcast.append(_head("control"))),
    "train DP-SGD step": (_train, lambda t: t.dpsgd.CopyFrom(pb.DPSGDStep(noise_multiplier=1.0))),
    "statistics kind": (_statistics, lambda t: setattr(t, "kind", pb.CCVR)),
    "statistics model": (_statistics, lambda t: t.model.CopyFrom(_ref([0.0, 2.0, 3.0]))),
    "statistics DP plan": (_statistics, lambda t: t.privacy.CopyFrom(pb.DPRelease(epsilon=1.0))),
    "evaluation split": (_evaluate, lambda t: setattr(t, "split", pb.SPLIT_VALIDATION)),
    "evaluation round": (_evaluate, lambda t: setattr(t, "round", 0)),
    "evaluation head name": (_evaluate, lambda t: setattr(t.heads[0], "name", "ccvr")),
    "evaluation head kind": (_evaluate, lambda t: setattr(t.heads[0], "kind", pb.HEAD_QUADRATIC)),
    "evaluation head bias": (_evaluate, lambda t: t.heads[0].bias.CopyFrom(_ref([0.5]))),
    "evaluation one more head": (_evaluate, lambda t: t.heads.append(_head("lda"))),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_shared_field_changes_the_digest(change: str) -> None:
    make, modify = CHANGES[change]
    task = make()
    before = task_context(task, PLAN)
    assert len(before) == 32 and before == task_context(make(), PLAN)  # deterministic
    modify(task)
    assert task_context(task, PLAN) != before


def test_what_differs_per_member_or_names_a_blob_does_not() -> None:
    task = _train()
    before = task_context(task, PLAN)
    task.seed = 8
    task.secure.CopyFrom(pb.SecAggJob(spec=b"anything", purpose="update"))
    task.model.name = "global-r2-for-p1"
    assert task_context(task, PLAN) == before


@pytest.mark.parametrize(
    "field", ["federation_id", "training.lr", "training.epochs", "model", "sum_scales"]
)
def test_the_plan_the_members_joined_under_is_bound(field: str) -> None:
    """Per-member plans would be model inconsistency too: ``lr = 0`` for the others
    makes their updates zero."""
    changed = pb.Plan()
    changed.CopyFrom(PLAN)
    if field == "federation_id":
        changed.federation_id = "other"
    elif field == "training.lr":
        changed.training.lr = 0.0
    elif field == "training.epochs":
        changed.training.epochs = 2
    elif field == "model":
        changed.model.feature_dim = 64
    else:
        changed.sum_scales["tau"] = 0.5
    for make in (_train, _statistics, _evaluate):
        assert task_context(make(), changed) != task_context(make(), PLAN)
    changed.CopyFrom(PLAN)
    changed.participant_index = 7  # the one per-member field of a plan
    changed.heartbeat_interval_ms = 5000  # and what changes nothing computed
    changed.max_chunk_bytes = 1 << 20
    changed.calibration.append("lda")
    assert task_context(_train(), changed) == task_context(_train(), PLAN)


def test_tasks_of_different_kinds_never_share_a_digest() -> None:
    """A training and a statistics task over the same model differ: the kind is
    hashed first, and every field is length-prefixed."""
    model = _ref([1.0])
    contexts = {
        task_context(pb.TrainTask(model=model), PLAN),
        task_context(pb.StatisticsTask(model=model), PLAN),
        task_context(pb.EvaluateTask(model=model), PLAN),
    }
    assert len(contexts) == 3
    with pytest.raises(TypeError, match="no task context"):
        task_context(pb.Wait(), PLAN)  # type: ignore[arg-type]


def test_secure_task_is_the_task_that_carries_a_secure_job() -> None:
    job = pb.SecAggJob(spec=b"spec", purpose="update")
    train = pb.Instruction(train=pb.TrainTask(secure=job))
    statistics = pb.Instruction(statistics=pb.StatisticsTask(secure=job))
    evaluate = pb.Instruction(evaluate=pb.EvaluateTask(secure=job))
    assert secure_task(train) == train.train
    assert secure_task(statistics) == statistics.statistics
    assert secure_task(evaluate) == evaluate.evaluate
    assert secure_task(pb.Instruction(train=pb.TrainTask(round=1))) is None  # plaintext
    assert secure_task(pb.Instruction(wait=pb.Wait())) is None
    assert secure_task(pb.Instruction(secagg=pb.SecAggStep(job_id=b"j"))) is None
