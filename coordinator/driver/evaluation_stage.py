"""Evaluation: federated (participants report correct/total counts on their own test
data) and, optionally, central on held-out test data the coordinator was given.

A real coordinator usually holds no data; then only federated evaluation (the sum of
participants' correct/total counts) is reported. When it is given test data — the
simulation harness gives it the reference runner's test split — it also evaluates
centrally, exactly as the reference runner does (same batches, same head swap).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Collection
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch

from spherecal import crypto
from spherecal.coordinator.driver.board import Board
from spherecal.coordinator.driver.bounds import evaluation_bound
from spherecal.coordinator.driver.integrity import (
    IntegrityCheckFailed,
    check_evaluation_counts,
    integrity_record,
    note,
)
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.driver.rejoin import wait_before_retry
from spherecal.coordinator.driver.secure_job import SecureJob, guaranteed_inputs
from spherecal.coordinator.driver.stages import StageContext, with_first_cause
from spherecal.coordinator.driver.tasks import Task
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.summary_schema import EvaluationNoise as NoiseJson
from spherecal.coordinator.summary_schema import FederatedEvaluation
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.task_context import task_context
from spherecal.spherefed.data import load_dataset
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.fl import evaluate
from spherecal.spherefed.network import classifier_swapped, compute_features
from spherecal.spherefed.privacy.evaluation_noise import (
    EvaluationNoise,
    accuracy_sd,
    plan_evaluation_noise,
)

__all__ = [
    "CentralEvaluator",
    "Head",
    "Heads",
    "add_evaluations",
    "federated_evaluation",
    "final_evaluation",
    "publish_head",
]

Head = npt.NDArray[np.float64] | CalibratedHead
"""A calibrated head: a weight swapped into the classifier (FFC, CCVR) or a
:class:`~spherecal.spherefed.discriminant.CalibratedHead` with a bias (and QDA's quadratic term)."""
Heads = dict[str, Head]

UNRESOLVED_SDS = 4.0
"""A noisy total below this many standard deviations of its noise is read as no
samples at all (every site's split empty): a ratio of two noises is no accuracy."""

_KIND = {"affine": pb.HEAD_AFFINE, "quadratic": pb.HEAD_QUADRATIC}


def _evaluation_job(
    ctx: StageContext,
    participants: list[str],
    names: tuple[str, ...],
    round_index: int | None,
    slot: str,
    context: bytes,
) -> tuple[SecureJob, EvaluationNoise | None]:
    """The secure evaluation job over ``participants`` (raises when they are too few
    for one), with the counts' DP noise planned for them."""
    s = ctx.settings
    noise: EvaluationNoise | None = None
    arguments: dict[str, Any] | None = None
    if s.secagg.evaluation_noise_sd > 0:
        noise = plan_evaluation_noise(
            s.secagg.evaluation_noise_sd,
            participants=len(participants),
            min_contributors=guaranteed_inputs(s.secagg, len(participants), s.privacy.colluders),
            length=1 + len(names),
        )
        arguments = {"scale_bits": noise.scale_bits, "noise_bound": noise.plan.noise_bound}
    job = ctx.new_job(
        "evaluate",
        round_index,
        participants,
        1 + len(names),
        evaluation_bound(s),
        s.timeouts.evaluation_s,
        spec_arguments=arguments,
        context=context,
        slot=slot,
    )
    return job, noise


def publish_head(board: Board, name: str, head: Head) -> pb.NamedTensorRef:
    """Publish ``head``'s tensors and return the reference an evaluation task carries
    (its kind, weight, bias and quadratic term; the bias finite on the wire)."""
    if not isinstance(head, CalibratedHead):
        return pb.NamedTensorRef(name=name, tensor=board.publish(f"head-{name}", head))
    quadratic = (
        board.publish(f"head-{name}-quadratic", head.quadratic)
        if head.quadratic is not None
        else None
    )
    return pb.NamedTensorRef(
        name=name,
        kind=_KIND[head.kind],
        tensor=board.publish(f"head-{name}", head.weight),
        bias=board.publish(f"head-{name}-bias", head.finite_bias()),
        quadratic=quadratic,
    )


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

    def accuracy(self, vector: npt.NDArray[np.float64], head: Head | None = None) -> float:
        net = self.model.load(vector)
        if isinstance(head, CalibratedHead):
            z = compute_features(net, self.x)
            return float(np.mean(head.predict(z) == self.y.numpy()))
        with classifier_swapped(net, head):
            return evaluate(net, self.x, self.y)


def federated_evaluation(
    ctx: StageContext,
    global_vector: npt.NDArray[np.float64],
    heads: Heads,
    round_index: int | None,
    *,
    split: str = "test",
    leave_out: Collection[str] = (),
    part: int = 1,
) -> FederatedEvaluation:
    """Every live participant evaluates the model (without calibration, ``"none"``, and
    with each head) on its test data — or, with ``split="validation"``, on its
    validation split (the calibrators' grid); accuracies are Σ correct / Σ total.

    With ``[secure_aggregation] evaluation`` (default) the counts are one secure
    job's sum — ``[total, correct("none"), correct(head)…]`` — so the coordinator
    sees federation totals only (a crafted head cannot read one participant's label
    histogram); otherwise participants report plaintext counts.

    Issue #19: the secure sum carries every site's DP noise
    (``[secure_aggregation] evaluation_noise_sd``), so the counts are real numbers;
    each accuracy comes with its standard deviation (``accuracy_sd``) and the
    noise's stated bound (``noise``: ``sum_sd``, ``sum_bound`` in counts — what a
    cross-check between sums may allow for).

    ``leave_out``: sites not asked — they answered this evaluation in an earlier job
    whose counts this one's are added to (:func:`add_evaluations`); ``part``: which
    such job this is (1, 2, …), and so its journal slot, which a restarted
    coordinator continues instead of asking its sites again."""
    s = ctx.settings
    board = ctx.board
    model_name = "final" if round_index is None else f"eval-r{round_index}"
    model_ref = board.publish(model_name, global_vector)
    refs = [publish_head(board, name, head) for name, head in heads.items()]
    split_code = pb.SPLIT_VALIDATION if split == "validation" else pb.SPLIT_TEST
    participants = _askable(ctx, leave_out)
    names = ("none", *heads)
    job: SecureJob | None = None
    noise: EvaluationNoise | None = None
    error: str | None = None
    # what the journal finds again after a restart: this split, this model, these heads
    contents = hashlib.sha256(bytes(model_ref.header.sha256))
    for ref in refs:
        contents.update(ref.SerializeToString())
    slot = f"evaluate:{split}:{model_name}:{contents.hexdigest()[:32]}"
    if part > 1:  # a retry whose counts are added to a short evaluation's (``leave_out``)
        slot += f"+{part}"
    context = task_context(
        pb.EvaluateTask(
            model=model_ref,
            heads=refs,
            round=-1 if round_index is None else round_index,
            split=split_code,
        ),
        ctx.shared_plan(),
    )
    if s.secagg.evaluation:
        participants = ctx.resume_participants(slot, participants)  # continued after a restart
        for attempt in (1, 2):
            try:
                job, noise = _evaluation_job(ctx, participants, names, round_index, slot, context)
                error = None
                break
            except (crypto.SecAggError, ValueError) as exc:
                error = f"cannot create the evaluation job: {exc}"
            if attempt == 2:
                break
            # too few connected (sites restarting right now): wait for them, as a
            # statistics job's retry does, then try once more
            wait_before_retry(
                ctx,
                stage=f"{split} evaluation",
                next_attempt=2,
                reason=error,
                wanted=ctx.eligible(list(s.participants)),
            )
            participants = _askable(ctx, leave_out)
    task = Task(
        task_id=ctx.task_id(slot),
        kind="evaluate",
        expected=frozenset(participants),
        instructions={
            p: pb.Instruction(
                evaluate=pb.EvaluateTask(
                    model=model_ref,
                    heads=refs,
                    round=-1 if round_index is None else round_index,
                    secure=job.job_message(p) if job is not None else None,
                    split=split_code,
                )
            )
            for p in participants
        },
        round=round_index,
        purpose="evaluate",
        heads=names,
        job=job,
    )
    accuracy: dict[str, float | None] = {name: None for name in names}
    spread: dict[str, float | None] = {name: None for name in names}
    noise_json: NoiseJson | None = None
    total: float = 0
    contributors: list[str] = []
    dropped: dict[str, str] = {}
    if error is None:
        board.set_task(task, "evaluating")
        if job is not None:
            gathered = ctx.gather(task, timeout_s=s.timeouts.evaluation_s, phase_after="evaluated")
            dropped, error = gathered.dropped, gathered.error
            if error is not None:  # the sites' own reasons, not only the lost quorum
                error = with_first_cause(error, dropped)
            if gathered.values is not None:
                contributors = sorted(gathered.contributors, key=ctx.registry.index_of)
                if noise is None:
                    sums = np.rint(gathered.values).astype(np.int64)
                    total = int(sums[0])
                    correct = {n: float(c) for n, c in zip(names, sums[1:], strict=True)}
                else:  # noisy counts: kept as real numbers, reported with their spread
                    values = np.asarray(gathered.values, dtype=np.float64)
                    total = float(values[0])
                    correct = {n: float(c) for n, c in zip(names, values[1:], strict=True)}
                    noise_json = cast(NoiseJson, noise.to_json(len(contributors)))
                    sum_sd = noise.sum_sd(len(contributors))
                    if total < UNRESOLVED_SDS * sum_sd:  # e.g. no validation split anywhere
                        total = 0.0
                    else:
                        spread = {n: accuracy_sd(correct[n], total, sum_sd) for n in names}
        else:
            dropped = ctx.wait_task(task, s.timeouts.evaluation_s)
            board.set_task(None, "evaluated")
            results = [task.evaluations[p] for p in sorted(task.evaluations)]
            total = sum(r.total for r in results)
            correct = {n: float(sum(r.correct.get(n, 0) for r in results)) for n in names}
            contributors = sorted(task.evaluations, key=ctx.registry.index_of)
        if error is None and contributors:
            sigma = noise.sum_sd(len(contributors)) if noise_json is not None and noise else 0.0
            error = _check_counts(
                ctx, split, model_ref, total, correct, contributors, noise_sigma=sigma
            )
        if total > 0 and error is None:  # a noisy ratio may leave [0, 1] by a hair: clipped
            accuracy = {n: min(1.0, max(0.0, correct[n] / total)) for n in names}
    if error is not None:
        ctx.say(f"federated evaluation failed: {error}")
        ctx.store.event("error", f"federated evaluation failed: {error}")
    if round_index is not None:
        board.unpublish(model_name)
    out: FederatedEvaluation = {
        "accuracy": accuracy,
        "participants": contributors,
        "samples": round(total) if noise_json is not None else total,
        "accuracy_sd": spread,
        "noise": noise_json,
        "dropped": dropped,
        "secure": bool(s.secagg.evaluation),
        "error": error,
    }
    if error is None and contributors:
        out["counts"] = {"total": float(total), "correct": {n: float(correct[n]) for n in names}}
    return out


def add_evaluations(
    kept: FederatedEvaluation, more: FederatedEvaluation, order: Callable[[str], int]
) -> FederatedEvaluation:
    """One evaluation from two over disjoint sites — a short final evaluation's and its
    retry's, which asked only the sites that had not answered: the counts are sums over
    examples, so they add to the counts over the union; independent noise adds in
    variance (its stated bound, conservatively, in sum). ``kept`` unchanged when
    ``more`` summed nothing (its error stays in the log and the events)."""
    counts, extra = kept.get("counts"), more.get("counts")
    if counts is None or extra is None or more["error"] is not None:
        return kept
    shared = set(kept["participants"]) & set(more["participants"])
    if shared:  # a site in both would be counted twice
        raise ValueError(f"evaluations share {sorted(shared)}: not added")
    total = counts["total"] + extra["total"]
    correct = {n: counts["correct"][n] + extra["correct"][n] for n in counts["correct"]}
    participants = sorted([*kept["participants"], *more["participants"]], key=order)
    noise, other = kept["noise"], more["noise"]
    accuracy: dict[str, float | None] = {n: None for n in correct}
    spread: dict[str, float | None] = {n: None for n in correct}
    sum_sd = 0.0
    if noise is not None and other is not None:
        sum_sd = math.hypot(noise["sum_sd"], other["sum_sd"])
        noise = NoiseJson(
            mechanism=noise["mechanism"],
            sd_target=noise["sd_target"],
            site_sd=noise["site_sd"],
            sum_sd=sum_sd,
            sum_bound=noise["sum_bound"] + other["sum_bound"],
            contributors=len(participants),
        )
    resolved = total > 0 and total >= UNRESOLVED_SDS * sum_sd
    if resolved:  # a noisy ratio may leave [0, 1] by a hair: clipped
        accuracy = {n: min(1.0, max(0.0, correct[n] / total)) for n in correct}
        if sum_sd > 0:
            spread = {n: accuracy_sd(correct[n], total, sum_sd) for n in correct}
    return {
        "accuracy": accuracy,
        "participants": participants,
        "samples": round(total) if noise is not None else total,
        "accuracy_sd": spread,
        "noise": noise,
        "dropped": {**kept["dropped"], **more["dropped"]},
        "secure": kept["secure"],
        "error": None,
        "counts": {"total": total, "correct": correct},
        "parts": [*_parts(kept), more["participants"]],
    }


def _parts(fed: FederatedEvaluation) -> list[list[str]]:
    """Each job's participants of an evaluation, in the order they were added (one
    job: its own)."""
    return list(fed.get("parts", [fed["participants"]]))


def _askable(ctx: StageContext, leave_out: Collection[str]) -> list[str]:
    """The eligible live participants, in roster order, less ``leave_out``."""
    alive = ctx.eligible(sorted(ctx.registry.alive(), key=ctx.registry.index_of))
    return [p for p in alive if p not in leave_out]


def _check_counts(
    ctx: StageContext,
    split: str,
    model_ref: pb.TensorRef,
    total: float,
    correct: dict[str, float],
    contributors: list[str],
    *,
    noise_sigma: float = 0.0,
) -> str | None:
    """The evaluation's sums against their bounds (``integrity``); on success they
    join the record that later evaluations are cross-checked against. Returns the
    refusal, or None. ``noise_sigma``: the standard deviation of each noisy sum (the
    sites' evaluation noise over these contributors; 0 for exact counts)."""
    s = ctx.settings
    try:
        check_evaluation_counts(
            total,
            correct,
            len(contributors),
            s.max_examples_per_site,
            noise_sigma=noise_sigma,
            sigmas=s.gate_sigmas,
        )
    except IntegrityCheckFailed as exc:
        note(ctx, f"{split} evaluation counts", False, str(exc))
        return f"evaluation counts refused: {exc}"
    integrity_record(ctx.progress, s)["evaluations"].append(
        {
            "split": split,
            "model": bytes(model_ref.header.sha256).hex()[:16],
            "contributors": list(contributors),
            "total": total,
            "correct": dict(correct),
            "noise_sigma": noise_sigma,
        }
    )
    return None


def final_evaluation(
    ctx: StageContext,
    heads: Heads,
    evaluator: CentralEvaluator | None,
    *,
    kept: FederatedEvaluation | None = None,
) -> None:
    """The final model, federated and (with test data) central, into the results
    (``accuracy``, ``federated_evaluation``, the central ones). ``kept``: an earlier
    attempt's evaluation, short of the calibration minimum — its sites answered it and
    are not asked again; this attempt asks the others and its counts are added to it
    (:func:`add_evaluations`)."""
    progress = ctx.progress
    t0 = time.monotonic()
    fed = federated_evaluation(
        ctx,
        progress.global_vector,
        heads,
        round_index=None,
        leave_out=kept["participants"] if kept is not None else (),
        part=1 if kept is None else len(_parts(kept)) + 1,
    )
    if kept is not None:
        more = len(fed["participants"])
        fed = add_evaluations(kept, fed, ctx.registry.index_of)
        ctx.say(
            f"final evaluation: {more} more participants added to the {len(kept['participants'])} "
            "of the evaluation kept"
            if fed is not kept
            else "final evaluation: the retry summed nothing; the evaluation kept stands"
        )
    shown_names = ("none", "ffc", "ccvr", *(m for m in ctx.settings.calibration.methods))
    acc = {name: fed["accuracy"].get(name) for name in dict.fromkeys(shown_names)}
    progress.results["accuracy"] = acc
    progress.results["federated_evaluation"] = fed
    if evaluator is not None:
        central: dict[str, float | None] = {name: None for name in acc}
        central["none"] = evaluator.accuracy(progress.global_vector)
        for name, head in heads.items():
            central[name] = evaluator.accuracy(progress.global_vector, head)
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
