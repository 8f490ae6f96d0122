"""The participant's checks on an evaluation task, and the counts' secure layout.

Why: evaluation counts are a statistic of the local test labels. With plaintext
counts, a coordinator that sends ``C`` crafted heads (head ``c`` always predicts
class ``c``) reads the participant's exact label histogram. So (issue #9):

* with secure aggregation the counts enter a secure-aggregation job like any other
  statistic, laid out as ``[total, correct("none"), correct(head_1), …]`` in the
  task's head order (:func:`counts_vector`), and the coordinator sees only sums over
  at least ``min_inputs`` participants; plaintext reports need ``allow_plaintext``;
* every head must have the plan's shape ``(num_classes, feature_dim)`` and float64
  dtype, the names must be distinct (and not ``none``), and there may be at most
  ``[policy] max_evaluation_heads`` of them (:func:`check_evaluation`);
* each (model, heads) is evaluated once (:func:`evaluation_digest` keys the release
  ledger), so the same evaluation cannot be repeated over different rosters.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from proto import spherecal_pb2 as pb

from .policy import EvaluationRefused

__all__ = ["check_evaluation", "counts_vector", "evaluation_digest", "evaluation_length"]


def check_evaluation(
    task: pb.EvaluateTask, *, num_classes: int, feature_dim: int, max_heads: int
) -> None:
    """Raise :class:`EvaluationRefused` unless every head is one the plan allows."""
    names = [h.name for h in task.heads]
    if len(names) > max_heads:
        raise EvaluationRefused(
            f"the evaluation carries {len(names)} heads; this participant's policy allows "
            f"at most {max_heads} (max_evaluation_heads)"
        )
    if len(set(names)) != len(names) or "none" in names or any(not n for n in names):
        raise EvaluationRefused("evaluation head names must be distinct, non-empty and not 'none'")
    want = [num_classes, feature_dim]
    for head in task.heads:
        header = head.tensor.header
        if header.dtype != pb.FLOAT64 or list(header.shape) != want:
            raise EvaluationRefused(
                f"evaluation head {head.name!r} has shape {list(header.shape)}; the plan's "
                f"classifier is {want} (float64)"
            )


def evaluation_length(task: pb.EvaluateTask) -> int:
    """Entries of the secure layout: the total, then one count per head ("none" first)."""
    return 2 + len(task.heads)


def counts_vector(
    task: pb.EvaluateTask, total: int, counts: dict[str, int]
) -> npt.NDArray[np.float64]:
    """``[total, correct("none"), correct(head) for each head in task order]``."""
    order = ["none", *(h.name for h in task.heads)]
    return np.array([float(total), *(float(counts[name]) for name in order)], dtype=np.float64)


def evaluation_digest(task: pb.EvaluateTask) -> bytes:
    """SHA-256 over the model's and every head's content digest (with names, in
    order): the release ledger's key for one evaluation."""
    h = hashlib.sha256(b"spherecal/evaluation/v1")
    h.update(bytes(task.model.header.sha256))
    for head in task.heads:
        name = head.name.encode()
        h.update(len(name).to_bytes(4, "big") + name + bytes(head.tensor.header.sha256))
    return h.digest()
