"""A site joins at its first attempt after the coordinator is back, over real gRPC,
whichever transport it runs on.

The site's channel used to be made once and keep gRPC's own connection back-off (1 s
growing to 120 s): attempts made after the coordinator was listening still failed
with "Connection refused" until gRPC's next try (coordinator up at 13:31:38, an
attempt at 13:31:43 refused, the join at 13:31:58). Here a real site dials a loopback
port where nothing listens until its back-off has run long enough for gRPC's own to
grow; then the coordinator's gRPC server (``build_server`` over the service core, on
that port) starts *before* the site's next attempt — from the site's log line
announcing it — and the lines after that are checked: no failed attempt, the
coordinator reached. Each test runs for both transports: a site process
(``run_participant`` over :class:`GrpcTransport`) and a virtual participant of the
Ray engine's hosts (:class:`ParticipantHost`: :class:`LoopTransport` on the host's
shared event loop), which kept its failed channel until 2026-11-27.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from spherecal.coordinator.server.aio_server import CoordinatorServer
from spherecal.coordinator.server.grpc_server import build_server
from spherecal.engines.virtual import ParticipantHost, VirtualParticipant
from spherecal.participant.grpc_transport import (
    GrpcTransport,
    channel_options,
    reconnect_backoff_options,
)
from spherecal.participant.loop_transport import EventLoopThread, LoopTransport
from spherecal.participant.main import run_participant
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.participant.transport import TransportError
from tests.joins import signed_join
from tests.unit.coordinator.service_harness import Harness, settings_for

LISTENING = "<the coordinator is listening>"

#: The attempt before which the coordinator starts. The site's waits are 0.1–0.5 s
#: (reconnect_max_s = 0.5), so by then it has failed for about 7 s: a channel that
#: kept gRPC's default back-off (tries after about 1, 2.6, 5.2 and 9.4 s) is then
#: most likely inside a wait of several seconds, and its next calls fail at once;
#: one whose back-off is held to the site's (``reconnect_backoff_options``) but that
#: is not replaced fails where the attempt falls inside gRPC's wait of up to 0.5 s.
ATTEMPT = 20

TRANSPORTS = ("process", "virtual")
"""A site process (``GrpcTransport``) and a Ray host's virtual participant (``LoopTransport``)."""


def _as_process(settings: ParticipantSettings, log: Callable[[str], None]) -> int | None:
    """The site as ``spherecal participant`` runs it; its exit status."""
    return run_participant(settings, log=log).code


def _as_virtual(settings: ParticipantSettings, log: Callable[[str], None]) -> int | None:
    """The site as the Ray engine runs it: a thread of a :class:`ParticipantHost`
    (its transport a ``LoopTransport`` on the host's one event loop), every line it
    logs also handed to ``log``."""

    class Host(ParticipantHost):
        def log(self, pid: str, message: str) -> None:
            super().log(pid, message)
            log(message)

    host = Host(log_path=settings.state_dir.parent / "host.log", threads=0)
    try:
        host.start([VirtualParticipant(settings)])
        report = host.wait(timeout_s=120.0)
    finally:
        host.close()
    assert not report.errors, report.errors
    return report.exit_codes[settings.participant_id]


@pytest.fixture
def loop() -> Iterator[EventLoopThread]:
    shared = EventLoopThread()
    yield shared
    shared.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _site(tmp_path: Path, port: int) -> ParticipantSettings:
    return ParticipantSettings(
        participant_id="p0",
        coordinator=f"127.0.0.1:{port}",
        insecure=True,
        state_dir=tmp_path / "p0",
        data=DataSettings(slice_index=0, slice_of=3),
        reconnect_max_s=0.5,
        give_up_s=300.0,
        rpc_timeout_s=10.0,
        long_poll_ms=200,
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_the_first_attempt_after_the_coordinator_listens_joins(tmp_path: Path, kind: str) -> None:
    run_site = _as_process if kind == "process" else _as_virtual
    port = _free_port()
    coordinator = settings_for(tmp_path / "coordinator", secure=False)
    coordinator = replace(
        coordinator, server=replace(coordinator.server, listen=f"127.0.0.1:{port}")
    )
    harness = Harness(coordinator)  # its state and plan, before anything listens
    servers: list[CoordinatorServer] = []
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if not servers and line.startswith(f"reconnect attempt {ATTEMPT} in "):
            # the attempt this line announces is made after this returns
            server, bound = build_server(coordinator, harness.service)
            assert bound == port
            server.start()
            servers.append(server)
            lines.append(LISTENING)
        elif line.startswith("joined federation"):
            harness.federation.board.finish("completed", "reconnect test over")  # not relayed

    try:
        code = run_site(_site(tmp_path, port), log)
    finally:
        for server in servers:
            server.stop(grace=None).wait()
        harness.store.close()
    assert servers, "the site never announced the attempt: " + "\n".join(lines[-5:])
    before, after = lines[: lines.index(LISTENING)], lines[lines.index(LISTENING) + 1 :]
    assert sum(line.startswith("reconnect attempt") for line in before) == ATTEMPT
    # the attempt made after the coordinator started listening is the one that joins
    assert not [line for line in after if line.startswith("reconnect attempt")], after
    assert after[0].startswith("joined federation")
    assert after[1] == f"reached the coordinator at 127.0.0.1:{port} again"
    assert code == 0 and "coordinator says done (completed): federation completed" in after


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_channel_is_replaced_only_after_its_connection_failed(
    tmp_path: Path, kind: str, loop: EventLoopThread
) -> None:
    port = _free_port()
    site = _site(tmp_path, port)
    transport = GrpcTransport(site) if kind == "process" else LoopTransport(site, loop)
    try:
        for opened in (1, 2, 3):  # nothing listens: each call after a failure is a new channel
            with pytest.raises(TransportError) as refused:
                transport.join(signed_join("p0"))
            assert refused.value.code.name == "UNAVAILABLE"
            assert transport.channels_opened == opened
        coordinator = settings_for(tmp_path / "coordinator", secure=False)
        coordinator = replace(
            coordinator, server=replace(coordinator.server, listen=f"127.0.0.1:{port}")
        )
        harness = Harness(coordinator)
        server, _ = build_server(coordinator, harness.service)
        server.start()
        try:
            transport.join(signed_join("p0"))  # the failed channel replaced: it connects
            assert transport.channels_opened == 4
            transport.join(signed_join("p1"))  # a connected channel is kept
            transport.join(signed_join("p2"))
            assert transport.channels_opened == 4
        finally:
            server.stop(grace=None).wait()
            harness.store.close()
    finally:
        transport.close()


def test_grpc_back_off_is_held_to_the_sites_own() -> None:
    site = ParticipantSettings(participant_id="p0", reconnect_max_s=10.0)
    assert reconnect_backoff_options(site) == [
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 10_000),
    ]
    short = ParticipantSettings(participant_id="p0", reconnect_max_s=0.05)
    assert dict(reconnect_backoff_options(short)) == {
        "grpc.initial_reconnect_backoff_ms": 50,
        "grpc.max_reconnect_backoff_ms": 50,
    }
    options = dict(channel_options(site))
    assert options["grpc.max_reconnect_backoff_ms"] == 10_000
    # gRPC reads this one as the least time a connection attempt gets (20 s): a slow
    # TLS handshake must not be cut short, so it is left at gRPC's default
    assert "grpc.min_reconnect_backoff_ms" not in options
