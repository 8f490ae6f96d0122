"""Evaluation: federated (participants report correct/total counts on their own test
data) and, optionally, central on held-out test data the coordinator was given.

A real coordinator usually holds no data; then only federated evaluation (the sum of
participants' correct/total counts) is reported. When it is given test data — the
simulation harness gives it the reference runner's test split — it also evaluates
centrally, exactly as the reference runner does (same batches, same head swap).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from proto import spherecal_pb2 as pb
from spherefed.data import load_dataset
from spherefed.fl import evaluate
from spherefed.network import classifier_swapped

from .model import GlobalModel
from .settings import CoordinatorSettings
from .stages import StageContext
from .tasks import EvaluationResult, Task

__all__ = ["CentralEvaluator", "federated_evaluation", "final_evaluation"]

Heads = dict[str, npt.NDArray[np.float64]]


class CentralEvaluator:
    def __init__(self, model: GlobalModel, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model = model
        self.x = x
        self.y = y

    @classmethod
    def from_settings(
        cls, settings: CoordinatorSettings, model: GlobalModel
    ) -> CentralEvaluator | None:
        name = settings.evaluation.test_dataset
        if not name:
            return None
        splits = load_dataset(
            name,
            root=settings.evaluation.test_data_root,
            seed=settings.seed,
            samples=settings.evaluation.test_samples,
        )
        test = splits.test
        if test.num_classes != model.num_classes:
            raise ValueError(
                f"test data has {test.num_classes} classes, the model {model.num_classes}"
            )
        return cls(model, torch.from_numpy(test.x), torch.from_numpy(test.y))

    @property
    def size(self) -> int:
        return int(self.y.shape[0])

    def accuracy(
        self, vector: npt.NDArray[np.float64], head: npt.NDArray[np.float64] | None = None
    ) -> float:
        net = self.model.load(vector)
        with classifier_swapped(net, head):
            return evaluate(net, self.x, self.y)


def federated_evaluation(
    ctx: StageContext,
    global_vector: npt.NDArray[np.float64],
    heads: Heads,
    round_index: int | None,
) -> dict[str, Any]:
    """Every live participant evaluates the model (without calibration, ``"none"``, and
    with each head) on its test data; accuracies are Σ correct / Σ total."""
    s = ctx.settings
    board = ctx.board
    model_name = "final" if round_index is None else f"eval-r{round_index}"
    model_ref = board.publish(model_name, global_vector)
    refs = [
        pb.NamedTensorRef(name=name, tensor=board.publish(f"head-{name}", weight))
        for name, weight in heads.items()
    ]
    participants = sorted(ctx.registry.alive(), key=ctx.registry.index_of)
    task = Task(
        kind="evaluate",
        expected=frozenset(participants),
        instructions={
            p: pb.Instruction(
                evaluate=pb.EvaluateTask(
                    model=model_ref,
                    heads=refs,
                    round=-1 if round_index is None else round_index,
                )
            )
            for p in participants
        },
        round=round_index,
        purpose="evaluate",
        heads=("none", *heads),
    )
    board.set_task(task, "evaluating")
    dropped = ctx.wait_task(task, s.timeouts.evaluation_s)
    board.set_task(None, "evaluated")
    if round_index is not None:
        board.unpublish(model_name)
    results: list[EvaluationResult] = [task.evaluations[p] for p in sorted(task.evaluations)]
    total = sum(r.total for r in results)
    accuracy: dict[str, float | None] = {}
    for name in task.heads:
        correct = sum(r.correct.get(name, 0) for r in results)
        accuracy[name] = correct / total if total else None
    return {
        "accuracy": accuracy,
        "participants": sorted(task.evaluations, key=ctx.registry.index_of),
        "samples": total,
        "dropped": dropped,
    }


def final_evaluation(ctx: StageContext, heads: Heads, evaluator: CentralEvaluator | None) -> None:
    """The final model, federated and (with test data) central, into the results."""
    progress = ctx.progress
    t0 = time.monotonic()
    fed = federated_evaluation(ctx, progress.global_vector, heads, round_index=None)
    acc = {name: fed["accuracy"].get(name) for name in ("none", "ffc", "ccvr")}
    progress.results["accuracy"] = acc
    progress.results["federated_evaluation"] = fed
    if evaluator is not None:
        central: dict[str, float | None] = {
            "none": evaluator.accuracy(progress.global_vector),
            "ffc": None,
            "ccvr": None,
        }
        for name, weight in heads.items():
            central[name] = evaluator.accuracy(progress.global_vector, weight)
        progress.results["central_accuracy"] = central
        progress.results["central_test_samples"] = evaluator.size
    else:
        progress.results["central_accuracy"] = None
    progress.timings["evaluate_s"] = time.monotonic() - t0
    shown = ", ".join(f"{k} {v:.4f}" for k, v in acc.items() if v is not None)
    ctx.say(
        f"federated accuracy ({fed['samples']} test samples on "
        f"{len(fed['participants'])} of {len(ctx.settings.participants)} participants): {shown}"
    )
