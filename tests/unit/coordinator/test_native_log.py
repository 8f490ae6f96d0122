"""gRPC core's own lines go through the coordinator's rate limit (issue #20).

A real TLS gRPC server in a child process, hit by garbage TCP connections: gRPC's C
core writes one "Handshake failed" line per connection to fd 2. Without the capture
every one reaches stderr (the flood — the mutation check); with it, the first one
and a count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from spherecal.coordinator.server.log_limit import RepeatLimiter
from spherecal.coordinator.server.native_log import normalise

CHILD = r"""
import json, socket, sys, time
from concurrent import futures
from pathlib import Path
import grpc
from spherecal.certs import init_ca
from spherecal.coordinator.server.log_limit import RepeatLimiter
from spherecal.coordinator.server.native_log import NativeStderr

d, n, capture = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
init_ca(d)
native = NativeStderr(RepeatLimiter(window_s=600)).start() if capture else None
server = grpc.server(futures.ThreadPoolExecutor(2))
pair = ((d / "server.key").read_bytes(), (d / "server.pem").read_bytes())
port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([pair]))
server.start()
for _ in range(n):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"\x16\x03\x01\x00\x05not a TLS client hello\r\n\r\n")
        s.settimeout(10)
        try:
            s.recv(100)  # the server closes the connection after its handshake fails
        except OSError:
            pass
deadline = time.monotonic() + 30
while native is not None and native.lines_in < n and time.monotonic() < deadline:
    time.sleep(0.05)
server.stop(0)
if native is not None:
    native.stop()
print(json.dumps({"lines_in": None if native is None else native.lines_in}))
"""

N = 20


def _run(tmp_path: Path, capture: bool) -> tuple[dict[str, int | None], list[str]]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path / f"certs{int(capture)}"),
            str(N),
            "1" if capture else "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        # gRPC core's own default verbosity (the CLI quiets it to ERROR, and a CLI run
        # earlier in this test process may have set that for its children)
        env={k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"},
    )
    handshakes = [ln for ln in done.stderr.splitlines() if "Handshake failed" in ln]
    return json.loads(done.stdout.strip().splitlines()[-1]), handshakes


def test_without_the_capture_every_garbage_connection_writes_a_line(tmp_path: Path) -> None:
    _, lines = _run(tmp_path, capture=False)
    assert len(lines) == N


def test_with_the_capture_the_first_line_and_a_count_reach_stderr(tmp_path: Path) -> None:
    seen, lines = _run(tmp_path, capture=True)
    assert seen["lines_in"] == N  # every native line was read, none lost
    assert len(lines) == 2, lines
    assert "grpc-core: " in lines[0] and "identical" not in lines[0]
    assert f"(+{N - 1} identical in " in lines[1] and lines[1].endswith("then stopped)")


def test_normalise_strips_what_differs_between_repeats() -> None:
    a = "E1125 15:51:07.740533    5202 ssl_transport_security.cc:2563] Handshake failed"
    b = "E1125 15:52:09.000001      77 ssl_transport_security.cc:2563] Handshake failed"
    assert normalise(a) == normalise(b) == "E ssl_transport_security.cc:2563] Handshake failed"
    assert normalise("peer ipv4:10.0.0.1:5123 at 0xdeadbeef\n") == "peer ipv4:… at 0x…"


def test_expired_counts_are_flushed_without_a_new_line() -> None:
    now = [0.0]
    limiter = RepeatLimiter(window_s=10, clock=lambda: now[0])
    assert limiter.check("x") == ([], "x")
    assert limiter.check("x") == ([], None)
    assert limiter.expired() == []  # window not over
    now[0] = 11.0
    assert limiter.expired() == ["x (+1 identical in 11s, then stopped)"]
    assert limiter.expired() == []  # counted once
    assert limiter.check("y") == ([], "y")
    assert limiter.check("y") == ([], None)
    assert limiter.expired_all() == ["y (+1 identical in 0s, then stopped)"]


def test_a_refused_handshake_becomes_a_line_that_says_why() -> None:
    """gRPC core's INFO lines for refused TLS handshakes (as grpcio 1.85 writes them),
    after :func:`normalise`: the reason OpenSSL gave, in words an operator acts on."""
    from spherecal.coordinator.server.native_log import HANDSHAKE_REFUSED, handshake_refusal

    prefix = "I1127 13:36:13.200671   29299 ssl_transport_security.cc:2563] "
    failed = prefix + "Handshake failed with error SSL_ERROR_SSL: error:1000007d:SSL routines:"
    cases = {
        "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired": (
            "the client's certificate has expired"
        ),
        "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate is not yet valid": (
            "the client's certificate is not yet valid"
        ),
        "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate": (
            "the client's certificate does not verify against [tls] client_ca"
        ),
        "OPENSSL_internal:BAD_SIGNATURE: certificate signature failure": (
            "the client's certificate does not verify against [tls] client_ca"
        ),
        "OPENSSL_internal:PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client presented no certificate",
        "OPENSSL_internal:WRONG_VERSION_NUMBER": "the client's TLS handshake failed",
    }
    for detail, said in cases.items():
        line = handshake_refusal(normalise(failed + detail))
        assert line is not None and line.startswith(f"{HANDSHAKE_REFUSED}: {said} ("), line
        assert "OPENSSL_internal" not in line and detail.split(":", 1)[1] in line
    assert handshake_refusal(normalise(prefix + "Some other line")) is None
