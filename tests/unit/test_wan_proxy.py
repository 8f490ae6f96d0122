"""The WAN proxy used by ``tests/integration/test_wan.py``: its link model and that it
forwards bytes intact, cuts on a partition and refuses until healed."""

from __future__ import annotations

import random
import socket
import threading

import pytest

from tests.wan_proxy import LinkProfile, WanProxy, _Link


def test_a_link_serialises_chunks_at_its_rate_then_delays_them_in_order() -> None:
    link = _Link(LinkProfile(delay_s=0.04, jitter_s=0.0, bits_per_s=8e6), random.Random(0))
    # 1 MB at 8 Mbit/s is 1 s on the wire; a second chunk waits for the first.
    assert link.due(0.0, 1_000_000) == pytest.approx(1.04)
    assert link.due(0.0, 1_000_000) == pytest.approx(2.04)
    assert link.due(5.0, 0) == pytest.approx(5.04)  # an idle wire: only the delay


def test_jitter_never_reorders() -> None:
    link = _Link(LinkProfile(delay_s=0.04, jitter_s=0.03, bits_per_s=1e9), random.Random(1))
    dues = [link.due(k * 0.001, 100) for k in range(200)]
    assert dues == sorted(dues)
    assert min(d - k * 0.001 for k, d in enumerate(dues)) >= 0.01 - 1e-9


@pytest.fixture
def echo() -> tuple[int, threading.Event]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], stop


def test_bytes_cross_intact_and_a_partition_cuts_then_refuses(
    echo: tuple[int, threading.Event],
) -> None:
    port, stop = echo
    proxy = WanProxy(port, LinkProfile(delay_s=0.005, jitter_s=0.002, bits_per_s=50e6))
    try:
        payload = bytes(random.Random(2).getrandbits(8) for _ in range(200_000))
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            s.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += s.recv(65536)
            assert got == payload
            proxy.partition()
            s.settimeout(10)
            with pytest.raises(OSError):  # reset by the partition
                s.sendall(b"x" * 10)
                if not s.recv(10):
                    raise ConnectionResetError("closed")
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            s.settimeout(10)
            with pytest.raises(OSError):  # refused while partitioned
                if not s.recv(10):
                    raise ConnectionResetError("closed")
        proxy.heal()
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            s.sendall(b"back")
            assert s.recv(10) == b"back"
        assert proxy.stats.cut >= 1 and proxy.stats.refused == 1
        # Every byte sent was counted each way (the 10 bytes sent into the cut may
        # or may not have been read before it).
        assert len(payload) + 4 <= proxy.stats.bytes_up <= len(payload) + 14
        assert proxy.stats.bytes_down == len(payload) + 4
    finally:
        proxy.close()
        stop.set()
