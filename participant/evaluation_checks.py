"""The participant's checks on an evaluation task, and the counts' secure layout.

Why: evaluation counts are a statistic of the local test labels. With plaintext
counts, a coordinator that sends ``C`` crafted heads (head ``c`` always predicts
class ``c``) reads the participant's exact label histogram. So (issue #9):

* with secure aggregation the counts enter a secure-aggregation job like any other
  statistic, laid out as ``[total, correct("none"), correct(head_1), …]`` in the
  task's head order (:func:`counts_vector`), and the coordinator sees only sums over
  at least ``min_inputs`` participants; plaintext reports need ``allow_plaintext``;
* every head's tensors must have the plan's shapes for its kind (weight
  ``(num_classes, feature_dim)``, bias ``(num_classes,)``, QDA's ``A`` ``(num_classes,
  feature_dim, feature_dim)``) and float64 dtype, the names must be distinct (and
  not ``none``), and there may be at most ``[policy] max_evaluation_heads`` of them
  (``max_validation_heads`` for the calibrators' grid on the validation split)
  (:func:`check_evaluation`);
* the counts carry distributed DP noise (``[policy] evaluation_noise_sd``;
  issue #19), and each (executed model, split, head contents) is evaluated once
  (:func:`evaluation_content` keys the release ledger with the executed-model
  digest; head names are not part of it).

Heads that do not depend on the features (weight 0, bias ``e_c``: "always class
c") are *not* refused: a head with a 1e-9 weight and the same bias predicts the
same class on every example, so a check on the weight would only be cosmetic
(``tests/security/test_differencing.py`` shows both give the same counts). The
noise is what protects the counts, whatever the heads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from spherecal.participant.policy import EvaluationRefused
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.discriminant import CalibratedHead

__all__ = [
    "check_evaluation",
    "download_heads",
    "counts_vector",
    "evaluation_content",
    "evaluation_length",
    "head_shapes",
]


def head_shapes(
    head: pb.NamedTensorRef, *, num_classes: int, feature_dim: int
) -> dict[str, tuple[int, ...]]:
    """The tensors a head of its kind must carry, with their shapes: the weight
    ``(C, l)`` always, a bias ``(C,)`` for affine and quadratic heads, ``A``
    ``(C, l, l)`` for a quadratic head (``spherecal.spherefed.discriminant.CalibratedHead``)."""
    c, dim = num_classes, feature_dim
    shapes: dict[str, tuple[int, ...]] = {"tensor": (c, dim)}
    if head.kind in (pb.HEAD_AFFINE, pb.HEAD_QUADRATIC):
        shapes["bias"] = (c,)
    if head.kind == pb.HEAD_QUADRATIC:
        shapes["quadratic"] = (c, dim, dim)
    return shapes


def check_evaluation(
    task: pb.EvaluateTask,
    *,
    num_classes: int,
    feature_dim: int,
    max_heads: int,
    max_validation_heads: int | None = None,
) -> None:
    """Raise :class:`EvaluationRefused` unless every head is one the plan allows.

    A validation-split evaluation (the calibrators' grid) is capped by
    ``max_validation_heads`` instead of ``max_heads`` (``[policy]``)."""
    names = [h.name for h in task.heads]
    validation = task.split == pb.SPLIT_VALIDATION
    if task.split not in (pb.SPLIT_TEST, pb.SPLIT_VALIDATION):
        raise EvaluationRefused(f"unknown evaluation split {task.split}")
    limit, key = (
        (max_validation_heads, "max_validation_heads")
        if validation and max_validation_heads is not None
        else (max_heads, "max_evaluation_heads")
    )
    if len(names) > limit:
        raise EvaluationRefused(
            f"the evaluation carries {len(names)} heads; this participant's policy allows "
            f"at most {limit} ({key})"
        )
    if len(set(names)) != len(names) or "none" in names or any(not n for n in names):
        raise EvaluationRefused("evaluation head names must be distinct, non-empty and not 'none'")
    for head in task.heads:
        if head.kind not in (pb.HEAD_LINEAR, pb.HEAD_AFFINE, pb.HEAD_QUADRATIC):
            raise EvaluationRefused(f"evaluation head {head.name!r} has unknown kind {head.kind}")
        shapes = head_shapes(head, num_classes=num_classes, feature_dim=feature_dim)
        for field in ("tensor", "bias", "quadratic"):
            present = head.HasField(field)
            if present != (field in shapes):
                raise EvaluationRefused(
                    f"evaluation head {head.name!r} ({pb.HeadKind.Name(head.kind)}) "
                    f"{'carries' if present else 'lacks'} a {field} tensor"
                )
            if not present:
                continue
            header = getattr(head, field).header
            if header.dtype != pb.FLOAT64 or tuple(header.shape) != shapes[field]:
                raise EvaluationRefused(
                    f"evaluation head {head.name!r} {field} has shape {list(header.shape)}; "
                    f"the plan's is {list(shapes[field])} (float64)"
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


def evaluation_content(task: pb.EvaluateTask) -> bytes:
    """SHA-256 over the split and every head's kind and tensor digests, in order —
    *not* the head names (renaming a head is free for the coordinator, so it must not
    make a fresh key; issue #19) and not the model (the release ledger keys that by the
    executed-model digest)."""
    h = hashlib.sha256(b"spherecal/evaluation-content/v3")
    h.update(int(task.split).to_bytes(4, "big"))
    for head in task.heads:
        h.update(int(head.kind).to_bytes(4, "big"))
        for field in ("tensor", "bias", "quadratic"):
            digest = bytes(getattr(head, field).header.sha256) if head.HasField(field) else b""
            h.update(len(digest).to_bytes(4, "big") + digest)
    return h.digest()


def download_heads(
    fetch: Callable[[pb.TensorRef, tuple[int, ...]], npt.NDArray[np.float64]],
    task: pb.EvaluateTask,
    *,
    num_classes: int,
    feature_dim: int,
) -> dict[str, npt.NDArray[np.float64] | CalibratedHead]:
    """Every head of ``task`` (already checked), each tensor fetched at its kind's
    shape: a plain weight for a linear head, a :class:`CalibratedHead` otherwise.
    A bias of ``WIRE_NEVER`` marks a class the head never predicts."""
    out: dict[str, npt.NDArray[np.float64] | CalibratedHead] = {}
    for head in task.heads:
        shapes = head_shapes(head, num_classes=num_classes, feature_dim=feature_dim)
        tensors = {f: fetch(getattr(head, f), shape) for f, shape in shapes.items()}
        if head.kind == pb.HEAD_LINEAR:
            out[head.name] = tensors["tensor"]
            continue
        out[head.name] = CalibratedHead(
            weight=np.array(tensors["tensor"]),
            bias=np.array(tensors["bias"]),
            quadratic=np.array(tensors["quadratic"]) if "quadratic" in tensors else None,
        )
    return out
