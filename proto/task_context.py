"""The digest of the task a secure job serves: what every member computes its input from.

Why (Pasquini et al. 2022, "Eluding Secure Aggregation in Federated Learning via Model
Inconsistency"): secure aggregation hides one input among the others only if the
others are real inputs. A coordinator that sends the target the real model and every
other member of the job a model whose update or statistics it knows — every hidden
unit dead, say, so their updates are zero on the first layers and their features one
constant vector — reads the target's input from the sum of a single job, past every
rule of the release ledger. So the coordinator writes this digest into the job spec
(:attr:`spherecal.crypto.JobSpec.context`), whose bytes every signature and key
derivation of the job covers, and each participant refuses a job whose context is not
the digest of the task it was sent: members shown different tasks hold different
specs and reject each other's signatures, so the job fails before anything leaves.

The digest covers what the coordinator sends every member alike: the task's kind, the
round, the statistics kind, the split, the model's and every other tensor's content
(dtype, shape, SHA-256), the heads and broadcast tensors with their names and kinds,
the DP plan, and the parts of the federation plan the member joined under that it
computes from — the federation, model spec, local-training settings (a plan with
``lr = 0`` for the others would make their updates zero just as well) and sum scales
(the plan's parts and the DP messages by their deterministic protobuf
serialisation). It leaves out what differs per member by design — the training seed,
the plan's ``participant_index``, the secure job message itself — and what changes
nothing computed: the blob names tensors are fetched by, the plan's timeouts, chunk
size and flags.
Both sides must run one release: a field one side's protobuf does not know is
serialised differently, and the job is refused.
"""

from __future__ import annotations

import hashlib
import struct

from spherecal.proto import spherecal_pb2 as pb

__all__ = ["secure_task", "task_context"]

_DOMAIN = b"spherecal/task-context/v1\0"

Task = pb.TrainTask | pb.StatisticsTask | pb.EvaluateTask


class _Digest:
    """Length-prefixed fields into one SHA-256: no two field sequences collide."""

    def __init__(self, kind: bytes) -> None:
        self._h = hashlib.sha256(_DOMAIN)
        self.blob(kind)

    def blob(self, data: bytes) -> _Digest:
        self._h.update(struct.pack(">Q", len(data)))
        self._h.update(data)
        return self

    def integer(self, value: int) -> _Digest:
        return self.blob(str(int(value)).encode())

    def tensor(self, ref: pb.TensorRef | None) -> _Digest:
        """A tensor by content: dtype, shape and SHA-256 (``None``/unset: a marker)."""
        if ref is None:
            return self.blob(b"-")
        header = ref.header
        self.blob(b"+").integer(header.dtype).integer(len(header.shape))
        for extent in header.shape:
            self.integer(extent)
        return self.blob(bytes(header.sha256))

    def named(self, ref: pb.NamedTensorRef) -> _Digest:
        self.blob(ref.name.encode()).integer(ref.kind).tensor(ref.tensor)
        self.tensor(ref.bias if ref.HasField("bias") else None)
        return self.tensor(ref.quadratic if ref.HasField("quadratic") else None)

    def plan(self, plan: pb.Plan) -> _Digest:
        """The parts of the federation plan a member computes its input from: the
        federation, the model spec, the local-training settings and the sum scales
        (not the roster index, timeouts, chunk size or flags, which change nothing
        computed — an operator may retune them across a coordinator restart)."""
        shared = pb.Plan(federation_id=plan.federation_id)
        shared.model.CopyFrom(plan.model)
        shared.training.CopyFrom(plan.training)
        for name, scale in plan.sum_scales.items():
            shared.sum_scales[name] = scale
        return self.blob(shared.SerializeToString(deterministic=True))

    def message(self, value: pb.DPSGDStep | pb.DPRelease | None) -> _Digest:
        if value is None:
            return self.blob(b"-")
        return self.blob(b"+" + value.SerializeToString(deterministic=True))

    def digest(self) -> bytes:
        return self._h.digest()


def secure_task(instruction: pb.Instruction) -> Task | None:
    """The task of ``instruction`` when it is a task (train, statistics, evaluate) that
    carries a secure job; ``None`` otherwise."""
    kind = instruction.WhichOneof("kind")
    if kind not in ("train", "statistics", "evaluate"):
        return None
    task: Task = getattr(instruction, kind)
    return task if task.HasField("secure") else None


def task_context(task: Task, plan: pb.Plan) -> bytes:
    """The 32-byte digest of ``task`` under ``plan`` that every member of its secure
    job must share (module docstring). The coordinator computes it from the task and
    plan it gives all members; each participant from the task it received and the plan
    it joined under."""
    if isinstance(task, pb.TrainTask):
        d = _Digest(b"train").plan(plan).integer(task.round).tensor(task.model)
        d.integer(len(task.broadcast))
        for ref in task.broadcast:
            d.named(ref)
        return d.message(task.dpsgd if task.HasField("dpsgd") else None).digest()
    if isinstance(task, pb.StatisticsTask):
        d = _Digest(b"statistics").plan(plan).integer(task.kind).tensor(task.model)
        return d.message(task.privacy if task.HasField("privacy") else None).digest()
    if isinstance(task, pb.EvaluateTask):
        d = _Digest(b"evaluate").plan(plan).integer(task.round).integer(task.split)
        d.tensor(task.model)
        d.integer(len(task.heads))
        for ref in task.heads:
            d.named(ref)
        return d.digest()
    raise TypeError(f"no task context for {type(task).__name__}")
