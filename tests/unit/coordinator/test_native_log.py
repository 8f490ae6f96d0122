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

import pytest

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
    after :func:`normalise`: the reason OpenSSL gave, in words an operator acts on,
    and — gRPC core's line has no address — that the client's address is not known
    and how to have it named."""
    from spherecal.coordinator.server.native_log import HANDSHAKE_REFUSED, handshake_refusal

    prefix = "I1127 13:36:13.200671   29299 ssl_transport_security.cc:2563] "
    failed = prefix + "Handshake failed with error SSL_ERROR_SSL: error:1000007d:SSL routines:"
    ended = "the client's certificate (or the [tls] client_ca certificate that issued it)"
    cases = {
        "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired": (
            f"{ended} has expired"
        ),
        "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate is not yet valid": (
            f"{ended} is not yet valid"
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
        assert "the client's address is not known" in line, line
        assert "start the coordinator with GRPC_TRACE=handshaker" in line, line
        named = handshake_refusal(normalise(failed + detail), peer="10.0.0.9")
        assert named is not None
        assert named.startswith(f"{HANDSHAKE_REFUSED} from 10.0.0.9: {said} ("), named
    assert handshake_refusal(normalise(prefix + "Some other line")) is None


def test_peer_hosts_and_the_trace_switch() -> None:
    from spherecal.coordinator.server.native_log import handshaker_traced, peer_host

    assert peer_host("ipv4:10.0.0.9:5123") == "10.0.0.9"
    assert peer_host("ipv6:[2001:db8::1]:5123") == "2001:db8::1"
    assert peer_host("ipv6:%5B::1%5D:5123") == "::1"
    assert peer_host("unix:/run/spherecal.sock") == "unix:/run/spherecal.sock"
    assert handshaker_traced({"GRPC_TRACE": "tcp, handshaker"})
    assert handshaker_traced({"GRPC_TRACE": "all"})
    assert not handshaker_traced({"GRPC_TRACE": "all,-handshaker"})
    assert not handshaker_traced({"GRPC_TRACE": "tcp"}) and not handshaker_traced({})


#: Feeds gRPC-core log entries (a JSON list, each written to fd 2 in one write, as gRPC
#: core writes an entry) through a started capture as the coordinator runs it
#: (``info=False``, refusals to ``on_handshake``); prints what ``on_handshake`` got.
FEED = r"""
import json, os, sys, time
from spherecal.coordinator.server.log_limit import RepeatLimiter
from spherecal.coordinator.server.native_log import NativeStderr
entries, trace = json.loads(sys.argv[1]), sys.argv[2] == "1"
said = []
native = NativeStderr(
    RepeatLimiter(window_s=600), info=False, on_handshake=said.append, peer_trace=trace
).start()
for entry in entries:
    os.write(2, (entry + "\n").encode())
physical = sum(1 for e in entries for line in e.split("\n") if line.strip())
deadline = time.monotonic() + 30
while native.lines_in < physical and time.monotonic() < deadline:
    time.sleep(0.02)
native.stop()
print(json.dumps(said))
"""

#: A refused handshake and the handshaker trace's entries after it, as grpcio 1.85.3
#: writes them with ``GRPC_TRACE=handshaker`` (the channel arguments shortened): the
#: trace's report of the failure comes from another thread than the refusal's line.
SSL_LINE = (
    "I1127 15:34:31.742732   19205 ssl_transport_security.cc:2563] Handshake failed with "
    "error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
    "CERTIFICATE_VERIFY_FAILED: certificate has expired"
)
TRACE_ENTRIES = [
    "I1127 15:34:31.742766   19208 handshaker.cc:155] CallNextHandshakerLocked: error=UNKNOWN: "
    "Ssl handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
    "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired: OK\n"
    "=== Source Location Trace: === \n"
    "src/core/util/status_helper.cc:68\n"
    " shutdown=false index=2, args={endpoint=0x7fddec001c00, args={grpc.internal."
    "endpoint_local_address=ipv4:127.0.0.1:44771, grpc.internal.endpoint_peer_address="
    "ipv4:10.0.0.9:32976, grpc.internal.security_connector=0x55b373657db0}}",
    "I1127 15:34:31.742778   19208 channel_trace.h:396] handshake manager 0x7fddec0020a0: "
    "Failed with error: UNKNOWN: Ssl handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
    "error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has "
    "expired: OK\n=== Source Location Trace: === \nsrc/core/util/status_helper.cc:68\n",
]


def _feed(entries: list[str], *, trace: bool) -> tuple[list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", FEED, json.dumps(entries), "1" if trace else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_with_the_handshaker_trace_a_refusal_names_its_peer_and_the_trace_stays_out() -> None:
    """The trace's report of the failed handshake, with the same OpenSSL reason,
    carries the peer's address in a continuation line; the refusal's line names its
    host. The trace's own entries, continuation lines included, stay out of the log."""
    said, stderr = _feed([SSL_LINE, *TRACE_ENTRIES], trace=True)
    assert len(said) == 1, said
    assert said[0].startswith("WARNING: refused a TLS handshake from 10.0.0.9: the client's ")
    assert "certificate has expired" in said[0] and "not known" not in said[0], said
    assert stderr == "", stderr  # nothing of the trace, not even "=== Source Location"


def test_a_refusal_whose_peer_the_trace_does_not_name_is_still_written() -> None:
    """With the trace on but no entry reporting the failure (only other trace
    entries), the refusal is still written, saying the address is not known; without
    the trace, it says how to have it named."""
    other = "I1127 15:34:31.742800   19205 handshaker.cc:80] handshake_manager 0x1: adding"
    said, stderr = _feed([SSL_LINE, other, other, other], trace=True)
    assert len(said) == 1, said
    assert "the client's address is not known (gRPC core's handshaker trace did not" in said[0]
    assert stderr == "", stderr
    said, stderr = _feed([SSL_LINE], trace=True)  # nothing after it: written at the end
    assert len(said) == 1 and "did not name it" in said[0], said
    said, _ = _feed([SSL_LINE], trace=False)
    assert len(said) == 1 and "with GRPC_TRACE=handshaker to have it named" in said[0], said


def test_a_handshake_failure_in_words_not_recognised_is_kept_not_dropped() -> None:
    """A later gRPC that words its refusal otherwise must show in the log: such a line
    is written as gRPC core's, while the other INFO lines are dropped."""
    changed = (
        "I1127 15:34:31.742732   19205 ssl_transport_security.cc:2600] TLS handshake failed: "
        "certificate has expired"
    )
    other = "I1127 15:34:31.742800   19205 chttp2_server.cc:100] some other INFO line"
    said, stderr = _feed([changed, other], trace=False)
    assert said == []
    assert "TLS handshake failed: certificate has expired" in stderr, stderr
    assert "some other INFO line" not in stderr, stderr


#: A real mutual-TLS gRPC server behind the capture, as ``spherecal coordinator`` runs
#: it, and a real client in a process of its own offering an expired certificate.
REAL = r"""
import json, os, subprocess, sys, time
from concurrent import futures
from pathlib import Path
import grpc
from spherecal.certs import init_ca, issue_participant
from spherecal.coordinator.server.log_limit import RepeatLimiter
from spherecal.coordinator.server.native_log import NativeStderr, handshaker_traced
from tests.cert_dates import redate

DIAL = (
    "import sys\n"
    "from pathlib import Path\n"
    "import grpc\n"
    "d, port = Path(sys.argv[1]), sys.argv[2]\n"
    "creds = grpc.ssl_channel_credentials((d / 'ca.pem').read_bytes(),"
    " (d / 'p0.key').read_bytes(), (d / 'p0.pem').read_bytes())\n"
    "channel = grpc.secure_channel(f'127.0.0.1:{port}', creds,"
    " options=[('grpc.ssl_target_name_override', 'localhost')])\n"
    "try:\n"
    "    grpc.channel_ready_future(channel).result(timeout=1.0)\n"
    "except grpc.FutureTimeoutError:\n"
    "    pass\n"
)
d = Path(sys.argv[1])
init_ca(d)
issue_participant(d, "p0")
redate(d, d / "p0.pem", start_days=-30, end_days=-1)
said, raw = [], []


class Recording(NativeStderr):
    def _line(self, line):
        raw.append(line)
        super()._line(line)


native = Recording(
    RepeatLimiter(window_s=600), info=False, on_handshake=said.append,
    peer_trace=handshaker_traced(),
).start()
server = grpc.server(futures.ThreadPoolExecutor(2))
creds = grpc.ssl_server_credentials(
    [((d / "server.key").read_bytes(), (d / "server.pem").read_bytes())],
    root_certificates=(d / "ca.pem").read_bytes(),
    require_client_auth=True,
)
port = server.add_secure_port("127.0.0.1:0", creds)
server.start()
quiet = {k: v for k, v in os.environ.items() if k != "GRPC_TRACE"} | {"GRPC_VERBOSITY": "ERROR"}
subprocess.run([sys.executable, "-c", DIAL, str(d), str(port)], env=quiet, timeout=60)
deadline = time.monotonic() + 10
while not said and time.monotonic() < deadline:
    time.sleep(0.05)
server.stop(0)
native.stop()
print(json.dumps({"said": said, "raw": raw}))
"""


@pytest.mark.parametrize("trace", [False, True], ids=["default", "GRPC_TRACE=handshaker"])
def test_the_installed_grpc_core_words_a_refusal_as_this_reader_expects(
    tmp_path: Path, trace: bool
) -> None:
    """The matching reads gRPC core's log text, which gRPC may reword in any release:
    against the installed grpcio, a refused handshake must become the coordinator's
    line with its reason (and, with the trace, the peer's address). When it does not,
    this fails showing every line gRPC core wrote, the new wording among them."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GRPC_TRACE", "SPHERECAL_GRPC_VERBOSITY_DEFAULT")
    }
    env |= {"GRPC_VERBOSITY": "INFO", "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    if trace:
        env["GRPC_TRACE"] = "handshaker"
    done = subprocess.run(
        [sys.executable, "-c", REAL, str(tmp_path / "certs")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    written = "\n".join(seen["raw"])
    said = [line for line in seen["said"] if "identical in" not in line]
    assert said, f"no refused handshake recognised in gRPC core's lines:\n{written}"
    peer = " from 127.0.0.1" if trace else ""
    expected = (
        f"WARNING: refused a TLS handshake{peer}: the client's certificate (or the [tls] "
        "client_ca certificate that issued it) has expired (CERTIFICATE_VERIFY_FAILED: "
        "certificate has expired)"
    )
    assert said[0].startswith(expected), f"{said[0]}\n{written}"
