"""What every hostile-coordinator double answers before its attack: the join reply
with a one-round plan, and a presence stream that stays open (shared by
``test_malicious_coordinator_service.HostileCoordinator`` and ``hostile_ring.HostileRing``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from spherecal.coordinator.driver.model import GlobalModel
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import model_spec_to_proto

__all__ = ["Presence", "hostile_join_reply"]


class Presence:
    """A presence stream the double keeps open until the runner cancels it."""

    def __init__(self) -> None:
        self._stop = threading.Event()

    def __iter__(self) -> Iterator[pb.HeartbeatReply]:
        while not self._stop.wait(0.05):
            yield pb.HeartbeatReply(phase="hostile")

    def cancel(self) -> None:
        self._stop.set()


def hostile_join_reply(federation: str, model: GlobalModel, participants: int) -> pb.JoinReply:
    """The plan a real runner accepts: secure updates and statistics, one round."""
    plan = pb.Plan(
        federation_id=federation,
        model=model_spec_to_proto(model.spec),
        training=pb.LocalTraining(epochs=1, batch_size=32, lr=0.1, loss="mse"),
        rounds=1,
        heartbeat_interval_ms=1000,
        secure_updates=True,
        secure_statistics=True,
        participant_index=0,
        num_participants=participants,
        max_chunk_bytes=1 << 20,
    )
    return pb.JoinReply(session="s", plan=plan)
