"""The virtual-participant host and the ray engine's pieces that need no cluster."""

from __future__ import annotations

import stat
import threading
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from spherecal.engines.virtual import (
    ComputeSlots,
    KillableTransport,
    ParticipantKilled,
    VirtualParticipant,
)
from spherecal.participant.loop_transport import EventLoopThread
from spherecal.participant.settings import ClientTLS, ParticipantSettings
from spherecal.participant.transport import TransportError
from spherecal.proto import spherecal_pb2 as pb


def _settings(tmp_path: Path, port: int = 1) -> ParticipantSettings:
    return ParticipantSettings(
        participant_id="p0",
        coordinator=f"127.0.0.1:{port}",
        insecure=True,
        state_dir=tmp_path / "state",
        rpc_timeout_s=2.0,
    )


def test_shipped_files_land_private_in_the_state_dir(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    files = {"ca": b"CA", "cert": b"CERT", "key": b"KEY", "identity": b"ID", "peers": b"p0 00"}
    settings = replace(settings, tls=ClientTLS(server_name="coordinator.example"))
    out = VirtualParticipant(settings, files).materialise()
    assert out.tls == ClientTLS(
        ca=tmp_path / "state/tls/ca.pem",
        cert=tmp_path / "state/tls/cert.pem",
        key=tmp_path / "state/tls/key.pem",
        server_name="coordinator.example",  # what was not shipped is kept
        peer_keys=tmp_path / "state/tls/peers.txt",  # the pins travel with the site
    )
    assert out.identity_path == tmp_path / "state/tls/identity.pem"
    names = {"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem", "identity": "identity.pem"}
    for name, content in files.items():
        path = tmp_path / "state" / "tls" / names.get(name, "peers.txt")
        assert path.read_bytes() == content
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert VirtualParticipant(settings).materialise() == settings  # nothing shipped


def test_unknown_shipped_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown shipped file"):
        VirtualParticipant(_settings(tmp_path), {"passwd": b"x"}).materialise()


def test_a_killed_transport_sends_nothing_more(tmp_path: Path) -> None:
    loop = EventLoopThread()
    transport = KillableTransport(_settings(tmp_path), loop)  # nothing listens on port 1
    request = pb.HeartbeatRequest(caller=pb.Caller(participant_id="p0"))
    with pytest.raises(TransportError) as failed:
        transport.heartbeat(request)
    assert failed.value.code is grpc.StatusCode.UNAVAILABLE  # alive: a normal failure
    transport.kill()
    assert transport.killed
    with pytest.raises(ParticipantKilled):
        transport.heartbeat(request)
    with pytest.raises(ParticipantKilled):
        list(transport.download_tensor(pb.DownloadRequest(name="model")))
    assert list(transport.presence(request)) == []  # its presence ends at once
    transport.close()
    loop.stop()


def test_contiguous_blocks_cover_the_roster_once() -> None:
    pytest.importorskip("ray")
    from spherecal.engines.ray import _contiguous

    for n, parts in ((10, 3), (3, 3), (1000, 7)):
        blocks = _contiguous(n, parts)
        assert len(blocks) == parts
        assert [k for b in blocks for k in b] == list(range(n))
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def test_engine_settings_are_checked() -> None:
    pytest.importorskip("ray")
    from spherecal.engines.ray import RayEngineSettings

    with pytest.raises(ValueError, match="--workers"):
        RayEngineSettings(workers=0)
    with pytest.raises(ValueError, match="--worker-cpus"):
        RayEngineSettings(worker_cpus=0)
    assert RayEngineSettings(workers=8).worker_count(3) == 3
    assert RayEngineSettings(workers=2).worker_count(100) == 2


def test_ray_flags_need_the_ray_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spherecal.cli.app import main

    code = main(["simulate", "--out", str(tmp_path), "--workers", "2", "--participants", "2"])
    assert code != 0
    assert "--workers only apply to --engine ray" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


class _CountingSemaphore:
    """The slots' semaphore, counting acquire attempts (made before blocking)."""

    def __init__(self, inner: threading.BoundedSemaphore) -> None:
        self.inner = inner
        self.tries = 0
        self.cond = threading.Condition()

    def acquire(self) -> bool:
        with self.cond:
            self.tries += 1
            self.cond.notify_all()
        return self.inner.acquire()

    def release(self) -> None:
        self.inner.release()

    def tried_more_than(self, tries: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.tries > tries, timeout)


def test_compute_slots_bound_computing_threads_and_are_given_back_while_waiting() -> None:
    slots = ComputeSlots(1)
    semaphore = _CountingSemaphore(slots._semaphore)
    slots._semaphore = semaphore  # type: ignore[assignment]
    inside_wait, b_done, a_may_go = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def a() -> None:
        with slots.hold():
            order.append("a computes")
            with slots.waiting():  # a round trip to the coordinator
                inside_wait.set()
                a_may_go.wait(10)
            order.append("a computes again")

    def b() -> None:
        with slots.hold():
            order.append("b computes")
        b_done.set()

    first = threading.Thread(target=a)
    first.start()
    assert inside_wait.wait(10)
    second = threading.Thread(target=b)
    second.start()
    assert b_done.wait(10)  # b got the one slot while a waited
    # a cannot compute again while someone holds the slot
    with slots.hold():
        tries = semaphore.tries
        a_may_go.set()
        # a is now inside acquire(), which cannot return while this thread holds the
        # one slot: a has not computed again (an event, not a sleep, says it tried)
        assert semaphore.tried_more_than(tries, timeout=10)
        assert order == ["a computes", "b computes"]
    first.join(10)
    second.join(10)
    assert order == ["a computes", "b computes", "a computes again"]
    with slots.hold(), slots.hold():  # nested holds count once (no self-deadlock)
        pass
    with slots.waiting():  # not holding: nothing to give back
        pass
    with pytest.raises(ValueError, match="compute slot"):
        ComputeSlots(0)
