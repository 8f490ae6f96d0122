"""What every hostile-coordinator double answers besides its attack: the join reply
with a one-round plan, a presence stream that stays open, heartbeats, downloads of
what it published and plaintext uploads recorded by task (the base of
``test_malicious_coordinator_service.HostileCoordinator`` and ``hostile_ring.HostileRing``);
and, as the service's coordinator does, every secure job bound to the task it comes
with (:func:`bind_to_task`)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for, iter_chunks, model_spec_to_proto
from spherecal.proto.task_context import secure_task, task_context

__all__ = ["HostileTransport", "Presence", "bind_to_task", "hostile_join_reply"]


def bind_to_task(instruction: pb.Instruction, plan: pb.Plan) -> crypto.JobSpec | None:
    """Write the digest of the instruction's task under ``plan`` (the one the site
    joined under) into its secure job's spec, in place (the doubles hand out what the
    service's coordinator would: every job bound to its task), and return the bound
    spec; ``None`` when there is no secure job. A spec that already carries a context,
    or does not decode, is left as the test made it."""
    task = secure_task(instruction)
    if task is None:
        return None
    try:
        spec = crypto.JobSpec.from_bytes(task.secure.spec)
    except crypto.SecAggError:
        return None
    if not spec.context:
        spec = dataclasses.replace(spec, context=task_context(task, plan))
        task.secure.spec = spec.to_bytes()
    return spec


class Presence:
    """A presence stream the double keeps open until the runner cancels it."""

    def __init__(self) -> None:
        self._stop = threading.Event()

    def __iter__(self) -> Iterator[pb.HeartbeatReply]:
        while not self._stop.wait(0.05):
            yield pb.HeartbeatReply(phase="hostile")

    def cancel(self) -> None:
        self._stop.set()


def hostile_join_reply(
    federation: str, model: GlobalModel, participants: int, *, rounds: int = 1
) -> pb.JoinReply:
    """The plan a real runner accepts: secure updates and statistics, one round."""
    plan = pb.Plan(
        federation_id=federation,
        model=model_spec_to_proto(model.spec),
        training=pb.LocalTraining(epochs=1, batch_size=32, lr=0.1, loss="mse"),
        rounds=rounds,
        heartbeat_interval_ms=1000,
        secure_updates=True,
        secure_statistics=True,
        participant_index=0,
        num_participants=participants,
        max_chunk_bytes=1 << 20,
        example_count_noise_sd=4,
    )
    return pb.JoinReply(session="s", plan=plan)


class HostileTransport:
    """The transport calls a hostile double answers like an honest coordinator."""

    federation: str
    model: GlobalModel
    peers: int
    tensors: dict[str, npt.NDArray[np.float64]]
    uploads: list[str]  # task ids of plaintext uploads

    joined = pb.Plan()
    """The plan of the last join reply (what the site's tasks are bound under)."""
    rounds = 1
    """Rounds of the plan the site joins."""

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        reply = hostile_join_reply(self.federation, self.model, self.peers, rounds=self.rounds)
        self.joined = reply.plan
        return reply

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        return pb.HeartbeatReply(phase="hostile")

    def presence(self, request: pb.HeartbeatRequest) -> Presence:
        return Presence()

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]:
        array = self.tensors[request.name]
        yield pb.TensorChunk(header=header_for(array))
        for data in iter_chunks(array, 1 << 20):
            yield pb.TensorChunk(data=data)

    def upload_tensor(self, messages: Iterable[pb.TensorUpload]) -> pb.UploadReceipt:
        parts = list(messages)
        self.uploads.append(parts[0].header.task_id)
        return pb.UploadReceipt()
