"""The shared-loop transport against the real coordinator gRPC server on loopback:
the answers and errors of the synchronous transport, presence, cut streams, a
closed channel, and no thread per open stream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from spherecal.coordinator.server.grpc_server import build_server
from spherecal.participant.grpc_transport import GrpcTransport
from spherecal.participant.loop_transport import EventLoopThread, LoopTransport
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.transport import TransportError
from spherecal.proto import spherecal_pb2 as pb

from ..coordinator.service_harness import Harness, settings_for


@contextmanager
def _serve(tmp: Path, *, long_poll_s: float = 0.2) -> Iterator[tuple[Harness, int]]:
    settings = settings_for(tmp, secure=True, n=3)
    settings = replace(
        settings,
        server=replace(settings.server, listen="127.0.0.1:0"),
        timeouts=replace(settings.timeouts, long_poll_s=long_poll_s),
    )
    harness = Harness(settings)
    server, port = build_server(settings, harness.service)
    server.start()
    try:
        yield harness, port
    finally:
        server.stop(grace=None).wait()
        harness.store.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Harness, int]]:
    with _serve(tmp_path) as both:
        yield both


@pytest.fixture
def loop() -> Iterator[EventLoopThread]:
    shared = EventLoopThread()
    yield shared
    shared.stop()


def _participant(pid: str, port: int, tmp: Path) -> ParticipantSettings:
    return ParticipantSettings(
        participant_id=pid,
        coordinator=f"127.0.0.1:{port}",
        insecure=True,
        state_dir=tmp / pid,
        rpc_timeout_s=10.0,
        long_poll_ms=200,
    )


def _outcome(call: object) -> tuple[str, str]:
    try:
        reply = call() if callable(call) else call
    except TransportError as exc:
        return ("error", f"{exc.code.name}: {exc.message}")
    return ("ok", type(reply).__name__)


def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for a state to be reached (never a duration asserted)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def test_the_loop_transport_answers_as_the_sync_transport(
    served: tuple[Harness, int], loop: EventLoopThread, tmp_path: Path
) -> None:
    harness, port = served
    sync = GrpcTransport(_participant("p0", port, tmp_path))
    shared = LoopTransport(_participant("p1", port, tmp_path), loop)
    try:
        joined = {}
        for pid, transport in (("p0", sync), ("p1", shared)):
            reply = transport.join(harness.join_request(pid))
            assert reply.session and reply.plan.federation_id == harness.federation.federation_id
            joined[pid] = reply
        assert joined["p0"].plan.model == joined["p1"].plan.model
        caller = {p: pb.Caller(participant_id=p, session=r.session) for p, r in joined.items()}
        for transport, pid in ((sync, "p0"), (shared, "p1")):
            kind = transport.next_instruction(
                pb.InstructionRequest(caller=caller[pid], wait_ms=200)
            ).WhichOneof("kind")
            assert kind in ("wait", "train")
        # The same refusals, code and message: a stale session, a bad signature,
        # a tensor that does not exist.
        for make in (
            lambda t, p: t.heartbeat(pb.HeartbeatRequest(caller=pb.Caller(participant_id=p))),
            lambda t, p: t.join(replace_signature(harness.join_request(p))),
            lambda t, p: list(
                t.download_tensor(pb.DownloadRequest(caller=caller[p], name="no-such"))
            ),
        ):
            a = _outcome(lambda make=make: make(sync, "p0"))
            b = _outcome(lambda make=make: make(shared, "p1"))
            assert a[0] == b[0] == "error"
            assert a[1].replace("p0", "p?") == b[1].replace("p1", "p?")
    finally:
        sync.close()
        shared.close()


def replace_signature(request: pb.JoinRequest) -> pb.JoinRequest:
    request.signature = bytes(64)
    return request


def test_presence_holds_a_participant_alive_until_cancelled(
    served: tuple[Harness, int], loop: EventLoopThread, tmp_path: Path
) -> None:
    harness, port = served
    transport = LoopTransport(_participant("p2", port, tmp_path), loop)
    session = transport.join(harness.join_request("p2")).session
    member = harness.registry.member("p2")
    stream = transport.presence(
        pb.HeartbeatRequest(caller=pb.Caller(participant_id="p2", session=session))
    )
    ended = threading.Event()

    def read() -> None:
        list(stream)  # yields nothing: blocks until the stream ends
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    _until(lambda: member.presence == 1, "the coordinator holds the stream open")
    assert not ended.is_set()  # the stream is open at both ends: the reader blocks on it
    stream.cancel()
    assert ended.wait(10)  # cancelled: the reader's iteration ends quietly
    _until(lambda: member.presence == 0, "the coordinator saw the stream close")
    transport.close()


def test_a_streamed_upload_cut_by_its_producer_sends_no_receipt(
    served: tuple[Harness, int], loop: EventLoopThread, tmp_path: Path
) -> None:
    harness, port = served
    transport = LoopTransport(_participant("p0", port, tmp_path), loop)
    session = transport.join(harness.join_request("p0")).session
    caller = pb.Caller(participant_id="p0", session=session)

    class Cut(RuntimeError):
        pass

    def messages() -> Iterator[pb.MaskedUpload]:
        yield pb.MaskedUpload(caller=caller, job_id=bytes(16))
        raise Cut("the producer stopped mid-stream")

    with pytest.raises(Cut):
        transport.upload_masked(messages())
    # An upload for a job that does not exist is refused with its code, not hung.
    with pytest.raises(TransportError) as refused:
        transport.upload_masked(iter([pb.MaskedUpload(caller=caller, job_id=bytes(16))]))
    assert refused.value.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
    transport.close()
    with pytest.raises(ValueError, match="closed"):
        transport.get_status(pb.StatusRequest(caller=caller))
    with pytest.raises(ValueError, match="closed"):
        transport.upload_masked(iter([pb.MaskedUpload(caller=caller)]))
    with pytest.raises(ValueError, match="closed"):
        transport.presence(pb.HeartbeatRequest(caller=caller))
    transport.close()  # twice is fine


def test_closing_the_channel_cuts_a_call_in_flight(loop: EventLoopThread, tmp_path: Path) -> None:
    with _serve(tmp_path, long_poll_s=30.0) as (harness, port):
        settings = replace(_participant("p0", port, tmp_path), long_poll_ms=30_000)
        transport = LoopTransport(settings, loop)
        session = transport.join(harness.join_request("p0")).session
        caller = pb.Caller(participant_id="p0", session=session)
        outcome: list[BaseException | object] = []

        def poll() -> None:  # the federation never starts: a 30 s long poll
            try:
                outcome.append(
                    transport.next_instruction(pb.InstructionRequest(caller=caller, wait_ms=30_000))
                )
            except (TransportError, ValueError) as exc:
                outcome.append(exc)

        board = harness.federation.board
        parked = board.parked_polls
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        _until(lambda: board.parked_polls > parked, "the poll is parked at the coordinator")
        assert poller.is_alive() and outcome == []  # waiting on the coordinator
        transport.close()
        poller.join(10)
        assert not poller.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], (TransportError, ValueError))


def test_open_streams_cost_no_thread_each(
    served: tuple[Harness, int], loop: EventLoopThread, tmp_path: Path
) -> None:
    """The point of this transport (see its module docstring): a sync channel starts
    a spin thread per open stream; the shared loop runs them all in its one thread."""
    harness, port = served

    def client_threads() -> int:
        # Not the clients': the coordinator serving in this same process starts its
        # ``rpc_N`` workers as calls come, and gRPC's asyncio poller (``_poll_wrapper``)
        # is one thread per process, started by the first asyncio channel of the process
        # (this test's, when it runs alone).
        return sum(
            1
            for t in threading.enumerate()
            if not t.name.startswith("rpc_") and "_poll_wrapper" not in t.name
        )

    def open_presence() -> int:
        return sum(harness.registry.member(p).presence for p in ("p0", "p1", "p2"))

    def open_streams(make: type, count: int) -> int:
        opened = open_presence()
        before = client_threads()
        transports, streams = [], []
        for k in range(count):
            pid = f"p{k}"  # one live stream per identity (a second would be refused)
            settings = _participant(pid, port, tmp_path)
            t = make(settings, loop) if make is LoopTransport else make(settings)
            session = t.join(harness.join_request(pid)).session
            streams.append(
                t.presence(
                    pb.HeartbeatRequest(caller=pb.Caller(participant_id=pid, session=session))
                )
            )
            transports.append(t)
        _until(
            lambda: open_presence() >= opened + count, "the coordinator holds every stream open"
        )
        added = client_threads() - before
        for s in streams:
            s.cancel()
        for t in transports:
            t.close()
        _until(lambda: open_presence() == opened, "the coordinator saw every stream close")
        return added

    assert open_streams(GrpcTransport, 3) >= 3
    assert open_streams(LoopTransport, 3) == 0
