"""The coordinator's grpc.aio server over a real loopback socket (issue #14): waiting
long polls and open presence streams hold no thread, a poll is answered by the
board's wake-up (not its safety re-check), stopping the server ends every poll and
stream, a cancelled presence stream or upload ends on the server too."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from spherecal.coordinator.driver.tasks import Task
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.server.grpc_server import (
    POLL_THREADS,
    SERVICE_NAME,
    CoordinatorServer,
    build_server,
)
from spherecal.coordinator.state.registry import Peer
from spherecal.proto import spherecal_pb2 as pb

from .service_harness import Harness, settings_for

N = 200
CHANNELS = 8


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Harness, CoordinatorServer, int]]:
    settings = settings_for(tmp_path, secure=False, n=N)
    settings = replace(
        settings,
        server=replace(settings.server, listen="127.0.0.1:0"),
        timeouts=replace(settings.timeouts, long_poll_s=600, heartbeat_interval_s=0.2),
    )
    harness = Harness(settings)
    # Only a wake-up can answer a poll in these tests (the safety re-check would
    # otherwise answer within 5 s and hide a missed wake-up).
    harness.federation.board.recheck_s = 3600.0
    for pid in settings.participants:
        harness.join(pid)
    server, port = build_server(settings, harness.service)
    server.start()
    try:
        yield harness, server, port
    finally:
        server.stop(grace=None).wait()
        harness.store.close()


def _until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait for ``condition`` (a state the server reaches; never a duration asserted)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


async def _until_async(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


class _Clients:
    """N participants' presence streams and long polls over a few aio channels (each
    its own connection), on the test thread's event loop: no client thread per call."""

    def __init__(self, harness: Harness, port: int) -> None:
        self.harness = harness
        self.channels = [
            grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            for _ in range(CHANNELS)
        ]
        self.pids = list(harness.settings.participants)

    def _channel(self, k: int) -> grpc.aio.Channel:
        return self.channels[k % CHANNELS]

    def presence(self, k: int) -> Any:
        call = self._channel(k).unary_stream(
            f"/{SERVICE_NAME}/Presence",
            request_serializer=pb.HeartbeatRequest.SerializeToString,
            response_deserializer=pb.HeartbeatReply.FromString,
        )
        return call(pb.HeartbeatRequest(caller=self.harness.caller(self.pids[k])), timeout=300)

    def poll(self, k: int) -> Any:
        call = self._channel(k).unary_unary(
            f"/{SERVICE_NAME}/NextInstruction",
            request_serializer=pb.InstructionRequest.SerializeToString,
            response_deserializer=pb.Instruction.FromString,
        )
        request = pb.InstructionRequest(caller=self.harness.caller(self.pids[k]), wait_ms=600_000)
        return call(request, timeout=120)

    async def open_all(self) -> tuple[list[Any], list[Any]]:
        """Every participant's presence stream (its first reply read) and long poll
        (arrived: its caller authenticated)."""
        for channel in self.channels:
            await channel.channel_ready()
        streams = [self.presence(k) for k in range(N)]
        for stream in streams:
            assert isinstance(await stream.read(), pb.HeartbeatReply)
        board = self.harness.federation.board
        parked = board.parked_polls
        polls = [asyncio.ensure_future(self.poll(k)) for k in range(N)]
        await _until_async(
            lambda: board.parked_polls >= parked + N,
            "every long poll evaluated its instruction (Wait) and parked",
        )
        assert not any(poll.done() for poll in polls), "every poll is still waiting"
        return streams, polls

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


def test_waiting_polls_and_presence_streams_hold_no_thread_and_a_wake_up_answers_them(
    served: tuple[Harness, CoordinatorServer, int],
) -> None:
    harness, _, port = served

    async def scenario() -> tuple[set[str], list[Any]]:
        clients = _Clients(harness, port)
        for channel in clients.channels:
            await channel.channel_ready()
        before = set(threading.enumerate())
        streams, polls = await clients.open_all()
        added = {t.name for t in set(threading.enumerate()) - before}
        assert all(harness.registry.member(p).presence == 1 for p in clients.pids)
        # The board changes from another thread (the driver's role): every poll wakes.
        await asyncio.get_running_loop().run_in_executor(
            None, harness.federation.board.finish, "completed", "the test is over"
        )
        answers = await asyncio.gather(*polls)
        for stream in streams:
            stream.cancel()
        await _until_async(
            lambda: all(harness.registry.member(p).presence == 0 for p in clients.pids),
            "the server saw every stream end",
        )
        await clients.close()
        return added, answers

    added, answers = asyncio.run(scenario())
    # 2·N waiting calls; before issue #14 that was 2·N server threads. Now only the
    # long-poll evaluators (a fixed pool) may have started, plus asyncio's default
    # executor thread this test itself used (not yet when counted).
    assert len(added) <= POLL_THREADS, sorted(added)
    assert all(name.startswith("poll") for name in added), sorted(added)
    assert [a.WhichOneof("kind") for a in answers] == ["done"] * N
    assert {a.done.status for a in answers} == {"completed"}


def test_a_poll_is_answered_when_a_task_appears_and_stop_wakes_without_answering(
    served: tuple[Harness, CoordinatorServer, int],
) -> None:
    """``stop`` wakes polls to re-check, but only a changed instruction answers them;
    ``finish`` (what the driver does after a stop) then answers with Done."""
    harness, _, port = served
    board = harness.federation.board

    async def scenario() -> pb.Instruction:
        clients = _Clients(harness, port)
        await clients.channels[0].channel_ready()
        seen = harness.registry.member("p0").last_seen
        poll = asyncio.ensure_future(clients.poll(0))
        await _until_async(
            lambda: harness.registry.member("p0").last_seen > seen, "the poll arrived"
        )
        await _until_async(lambda: board.parked_polls >= 1, "the poll parked")
        parked = board.parked_polls
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, board.stop, "operator")
        await _until_async(
            lambda: board.parked_polls > parked, "the woken poll re-evaluated: still Wait"
        )
        assert not poll.done()
        await loop.run_in_executor(None, board.finish, "failed", "stopped: operator")
        answer = await poll
        await clients.close()
        return answer

    answer = asyncio.run(scenario())
    assert answer.WhichOneof("kind") == "done" and answer.done.status == "failed"


def test_stopping_the_server_ends_every_poll_and_stream_and_marks_participants_gone(
    served: tuple[Harness, CoordinatorServer, int],
) -> None:
    harness, server, port = served
    registry = harness.registry

    async def scenario() -> tuple[list[Any], list[Any]]:
        clients = _Clients(harness, port)
        streams, polls = await clients.open_all()
        await asyncio.get_running_loop().run_in_executor(None, lambda: server.stop(1.0).wait())
        poll_ends = await asyncio.gather(*polls, return_exceptions=True)
        stream_ends = []
        for stream in streams:
            try:
                while True:
                    message = await stream.read()
                    if message is grpc.aio.EOF:
                        stream_ends.append("eof")
                        break
            except grpc.aio.AioRpcError as exc:
                stream_ends.append(exc.code())
        await clients.close()
        return poll_ends, stream_ends

    poll_ends, stream_ends = asyncio.run(scenario())
    assert all(isinstance(end, grpc.aio.AioRpcError) for end in poll_ends), poll_ends[:3]
    assert {end.code() for end in poll_ends} <= {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNAVAILABLE,
    }
    assert len(stream_ends) == N and "eof" not in stream_ends
    assert server.wait_for_termination(timeout=0) is False  # stopped
    assert all(registry.member(p).presence == 0 for p in harness.settings.participants)
    assert not registry.alive()


def test_a_cancelled_presence_stream_marks_its_participant_gone(
    served: tuple[Harness, CoordinatorServer, int],
) -> None:
    harness, _, port = served
    registry = harness.registry
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        presence = channel.unary_stream(
            f"/{SERVICE_NAME}/Presence",
            request_serializer=pb.HeartbeatRequest.SerializeToString,
            response_deserializer=pb.HeartbeatReply.FromString,
        )
        stream = presence(pb.HeartbeatRequest(caller=harness.caller("p0")), timeout=300)
        assert next(stream).phase  # the stream is open on the server
        assert registry.member("p0").presence == 1 and "p0" in registry.alive()
        stream.cancel()
        _until(lambda: registry.member("p0").presence == 0, "the server saw the stream end")
        assert "p0" not in registry.alive()  # gone at once, as with the sync server
        assert "p1" in registry.alive()  # joined and recently heard from: untouched
    finally:
        channel.close()


def _one_message_then_hold(
    port: int, method: str, first: Any
) -> tuple[grpc.Channel, Any, threading.Event]:
    """A client-streamed call of ``method`` that sends ``first`` and then nothing until
    the returned event is set: (its channel, the call's future, that event)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    hold = threading.Event()

    def requests() -> Iterator[Any]:
        yield first
        hold.wait(60)

    upload = channel.stream_unary(
        f"/{SERVICE_NAME}/{method}",
        request_serializer=type(first).SerializeToString,
        response_deserializer=pb.UploadReceipt.FromString,
    )
    return channel, upload.future(requests(), timeout=300), hold


def test_a_cancelled_upload_ends_its_worker_thread(
    served: tuple[Harness, CoordinatorServer, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service consumes an upload on a worker thread; when the client goes away
    mid-stream that thread's waiting read must end (CANCELLED), not leak."""
    harness, _, port = served
    received: list[pb.TensorUpload] = []
    ended: list[BaseException] = []
    done = threading.Event()

    def consume(requests: Iterator[pb.TensorUpload], peer: Peer) -> pb.UploadReceipt:
        try:
            for message in requests:  # fault injection: a consumer that just reads
                received.append(message)
        except BaseException as exc:
            ended.append(exc)
            raise
        finally:
            done.set()
        return pb.UploadReceipt()

    monkeypatch.setattr(harness.service, "upload_tensor", consume)
    channel, call, first = _one_message_then_hold(
        port, "UploadTensor", pb.TensorUpload(data=b"\x00" * 16)
    )
    try:
        _until(lambda: len(received) == 1, "the first chunk reached the consumer")
        call.cancel()
        first.set()
        assert done.wait(60), "the worker thread's read ended"
        # Usually the cancellation reaches the bridge within its _CANCEL_TURNS loop
        # turns and the read raises CANCELLED. On a loaded box gRPC may report the
        # cancel later than that; the read then ends as a short stream, which the
        # spool refuses as incomplete (test_spool.py). Either way
        # the thread ends and nothing else reached the consumer.
        assert len(ended) <= 1 and len(received) == 1
        if ended:
            assert isinstance(ended[0], ServiceError)
            assert ended[0].code is grpc.StatusCode.CANCELLED
    finally:
        channel.close()


def test_an_upload_waiting_without_reading_sees_its_call_cancelled(
    served: tuple[Harness, CoordinatorServer, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A masked upload that waits for a slot reads nothing while it waits
    (``coordinator/driver/upload_queue.py``): its request stream's ``cancelled`` must
    turn true when the client goes away, so the wait ends instead of holding a worker
    thread until a slot frees or the stage closes."""
    harness, _, port = served
    headers: list[pb.MaskedUpload] = []
    saw: list[bool] = []
    done = threading.Event()

    def wait_like_a_queued_upload(
        requests: Iterator[pb.MaskedUpload], peer: Peer
    ) -> pb.UploadReceipt:
        try:
            headers.append(next(iter(requests)))
            deadline = time.monotonic() + 60
            while not getattr(requests, "cancelled", False) and time.monotonic() < deadline:
                time.sleep(0.01)  # what UploadQueue.wait's re-check sees
            saw.append(bool(getattr(requests, "cancelled", False)))
        finally:
            done.set()
        raise ServiceError(grpc.StatusCode.CANCELLED, "cancelled while waiting")

    monkeypatch.setattr(harness.service, "upload_masked", wait_like_a_queued_upload)
    header = pb.MaskedUpload(caller=harness.caller("p0"), job_id=b"j" * 16)
    # the chunks would follow once the upload has its slot
    channel, call, release = _one_message_then_hold(port, "UploadMasked", header)
    try:
        _until(lambda: len(headers) == 1, "the header reached the handler")
        assert not done.is_set()  # waiting, not reading
        call.cancel()
        release.set()
        assert done.wait(60), "the waiting handler ended"
        assert saw == [True]
    finally:
        channel.close()


def test_a_dead_incarnations_poll_does_not_take_the_new_sessions_instruction(
    served: tuple[Harness, CoordinatorServer, int],
) -> None:
    """A participant process killed with a long poll open restarts and joins again
    before that poll ends. When the next task appears, the zombie poll (old session)
    wakes first or together with the new one; the task's instruction must reach the
    new session's poll, and the zombie gets Wait. (Before the fix the zombie claimed
    the once-per-session delivery for the *new* session and the restarted participant
    waited for an instruction that never came: a secure stage stuck until the round
    deadline, seen in the chaos test once restarts became fast.)"""
    harness, _, port = served
    board = harness.federation.board
    registry = harness.registry

    async def scenario() -> tuple[pb.Instruction, pb.Instruction, str]:
        clients = _Clients(harness, port)
        await clients.channels[0].channel_ready()
        seen = registry.member("p0").last_seen
        zombie = asyncio.ensure_future(clients.poll(0))  # the old incarnation's session
        await _until_async(lambda: registry.member("p0").last_seen > seen, "zombie arrived")
        loop = asyncio.get_running_loop()
        new_session = await loop.run_in_executor(None, harness.join, "p0")
        # The task appears while only the zombie waits: it is woken and evaluated
        # first, the restarted participant's poll comes after.
        instruction = pb.Instruction(task_id="t-new", evaluate=pb.EvaluateTask())
        task = Task(
            kind="evaluate",
            expected=frozenset({"p0"}),
            instructions={"p0": instruction},
            task_id="t-new",
        )
        await loop.run_in_executor(None, board.set_task, task, "evaluate")
        got_zombie = await zombie
        got_fresh = await clients.poll(0)  # caller() now carries the new session
        await clients.close()
        return got_zombie, got_fresh, new_session

    got_zombie, got_fresh, new_session = asyncio.run(scenario())
    assert got_fresh.WhichOneof("kind") == "evaluate" and got_fresh.task_id == "t-new"
    assert got_zombie.WhichOneof("kind") == "wait"
    assert got_zombie.wait.reason == "session replaced"
    assert registry.member("p0").session == new_session
