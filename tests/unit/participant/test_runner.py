"""Participant logic over the in-process transport."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from spherecal.coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    ModelSettings,
    SecAggSettings,
    ServerSettings,
    Timeouts,
    TrainingSettings,
)
from spherecal.crypto import generate_identity
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.inprocess_transport import InProcessFederation
from spherecal.logs import level_of
from spherecal.participant.data import load_local_data
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb


def _federation(tmp: Path, *, allow_plaintext: bool) -> InProcessFederation:
    torch.set_num_threads(1)
    ids = ("p0", "p1")
    cs = CoordinatorSettings(
        participants=ids,
        model=ModelSettings(extractor="mlp"),
        training=TrainingSettings(rounds=1, max_round_attempts=1),
        calibration=CalibrationSettings(methods=("ffc",)),
        # plaintext throughout (evaluation counts too), as `simulate --no-secure`
        secagg=SecAggSettings(updates=False, statistics=False, evaluation=False),
        server=ServerSettings(insecure=True),
        timeouts=Timeouts(
            heartbeat_interval_s=0.2, heartbeat_timeout_s=5, long_poll_s=0.3, linger_s=3
        ),
        state_dir=tmp / "state",
        out_dir=tmp / "out",
    )
    ps = [
        ParticipantSettings(
            participant_id=p,
            insecure=True,
            allow_plaintext=allow_plaintext,
            long_poll_ms=300,
            data=DataSettings(slice_index=k, slice_of=2),
        )
        for k, p in enumerate(ids)
    ]
    if allow_plaintext is False:
        ps[1] = replace(ps[1], allow_plaintext=True)
    return InProcessFederation(cs, ps)


def test_participant_refuses_plaintext_uploads_by_default(tmp_path: Path) -> None:
    fed = _federation(tmp_path, allow_plaintext=False).start()
    summary = fed.join(timeout=120)
    # p0 withdrew with its reason; a round needs two updates, so the federation fails
    # cleanly and every participant is told so.
    assert summary["status"] == "failed"
    assert any("allow_plaintext" in m for m in fed.messages)
    assert fed.exit_codes == {"p0": 1, "p1": 1}
    # the site's own line is a warning (it was INFO): `… WARNING p0: WARNING: withdrawing`
    withdrawals = [m for m in fed.messages if m.startswith("[p0] ") and "withdrawing" in m]
    assert withdrawals and "allow_plaintext" in withdrawals[0], withdrawals
    for line in withdrawals:
        assert line.startswith("[p0] WARNING: withdrawing from "), line
        assert level_of(line.removeprefix("[p0] ")) == "WARNING"
    # the coordinator's own record (its SQLite event log) names the withdrawal's reason
    # (read from the file: the federation is over and its store closed)
    with contextlib.closing(sqlite3.connect(fed.store.path)) as db:
        events = [m for (m,) in db.execute("SELECT message FROM events")]
    assert any("allow_plaintext" in m for m in events), events


def test_participant_rejoins_when_its_session_expires(tmp_path: Path) -> None:
    fed = _federation(tmp_path, allow_plaintext=True)
    runner = fed.runners["p0"]
    original = runner._join  # observe rejoining
    joins: list[int] = []

    def counting_join() -> None:
        joins.append(1)
        original()
        if len(joins) == 1:
            runner.session = "expired"  # as if the coordinator restarted

    runner._join = counting_join  # type: ignore[method-assign]
    fed.start()
    summary = fed.join(timeout=120)
    assert summary["status"] == "completed"
    assert len(joins) >= 2
    assert fed.exit_codes == {"p0": 0, "p1": 0}


@pytest.mark.parametrize(
    ("value", "why"), [(0, "go together"), (3, r"slice_index must be in 0\.\.2, got 3")]
)
def test_data_settings_validate_slices(value: int, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        DataSettings(slice_index=value, slice_of=None if value == 0 else 3)


class _SlowStopPresence:
    """A presence stream that blocks until cancelled, then takes a moment to end —
    like a gRPC stream whose cancellation is delivered asynchronously."""

    def __init__(self, opened: list[_SlowStopPresence]) -> None:
        self.cancelled = threading.Event()
        self.ended = threading.Event()
        opened.append(self)

    def __iter__(self) -> Iterator[pb.HeartbeatReply]:
        try:
            while not self.cancelled.wait(0.01):
                yield pb.HeartbeatReply(interval_ms=10)
            time.sleep(0.3)
        finally:
            self.ended.set()

    def cancel(self) -> None:
        self.cancelled.set()


class _DoneAfterPresence:
    """Just enough transport: presence streams, then ``done`` once one is open."""

    def __init__(self) -> None:
        self.opened: list[_SlowStopPresence] = []

    def presence(self, request: pb.HeartbeatRequest) -> _SlowStopPresence:
        return _SlowStopPresence(self.opened)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        deadline = time.monotonic() + 10
        while not self.opened and time.monotonic() < deadline:
            time.sleep(0.01)
        return pb.Instruction(done=pb.Done(status="completed", message="bye"))

    def close(self) -> None:
        pass


def test_run_returns_only_after_the_presence_stream_has_ended(tmp_path: Path) -> None:
    """No presence call may outlive run(): the caller closes the channel next and the
    process exits, and a gRPC call still live in a daemon thread at interpreter
    shutdown can abort the process (an exit status of -6 after a completed run)."""
    settings = ParticipantSettings(
        participant_id="p0", insecure=True, state_dir=tmp_path / "p0", long_poll_ms=50
    )
    transport = _DoneAfterPresence()
    runner = ParticipantRunner(
        settings,
        transport,  # type: ignore[arg-type]  # only the calls this test makes
        load_local_data(DataSettings(slice_index=0, slice_of=2)),
        generate_identity(),
        MemoryJobLedger(),
        DirectoryTrust(None),
        log=lambda _message: None,
    )
    runner.session = "already-joined"
    assert runner.run() == 0
    assert runner._heartbeat is not None
    assert not runner._heartbeat.is_alive()
    assert transport.opened, "the presence stream was never opened"
    assert all(s.cancelled.is_set() and s.ended.is_set() for s in transport.opened)
