"""Independent implementations check a live coordinator under mutual TLS (issue #26).

One coordinator process with mutual TLS and the metrics listener, waiting for its
participants (a fresh federation). Against it:

- Go's standard library (``certcheck.go``, ``go run``, no modules) loads every
  certificate/key pair ``spherecal certs`` issued, verifies the identity binding
  itself, completes a mutual-TLS handshake with each client pair and calls gRPC
  health, then lists the services over reflection v1 and v1alpha; and reads the CA's
  revocation list's number and issuer key identifier;
- ``promtool check metrics`` on the live ``/metrics``;
- ``curl -f`` on ``/healthz`` and ``/readyz`` — no client certificate;
- ``spherecal status --json | jq .refusals`` prints ``0``;
- grpcio-reflection's own client lists the services over v1alpha.

Each tool is installed by ``make test`` (root on Debian: ``apt-get install
golang-go prometheus``); where one is missing its test skips and says so.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from spherecal.certs import init_ca, issue_participant, request_participant, revoke_participant
from spherecal.proto.identity import LEGACY_IDENTITY_EXTENSION_OID
from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CERTCHECK = HERE / "certcheck.go"
SERVICES = {
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "spherecal.v1.Coordinator",
}


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(
            f"{tool} is not installed; `make test` installs it as root on Debian "
            "(apt-get install golang-go prometheus)"
        )
    return path


class Live:
    def __init__(self, sim: Simulation, port: int, metrics_port: int) -> None:
        self.sim, self.port, self.metrics_port = sim, port, metrics_port
        self.certs = sim.out / "certs"
        self.status_json = ""

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.metrics_port}{path}"


def _metrics_port(log: Path, deadline: float) -> int:
    """The metrics port the coordinator logged (it listens on port 0)."""
    pattern = re.compile(r"metrics and probes on http://127\.0\.0\.1:(\d+)/metrics")
    while time.monotonic() < deadline:
        found = pattern.search(log.read_text(errors="replace")) if log.exists() else None
        if found:
            return int(found.group(1))
        time.sleep(0.05)
    raise AssertionError(f"no metrics line in {log}")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    out = tmp_path_factory.mktemp("interop")
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=1),
        out=out,
        calibration=("ffc",),
        tls=True,
        timeout_s=240,
        extra_coordinator={
            "admin": {"allow": ["operator"]},
            "metrics": {"listen": "127.0.0.1:0"},
        },
    )
    sim = Simulation(settings)
    try:
        port = sim.start_coordinator()
        # the operator's keys made as a site makes its own (`certs request`), certified
        # from the request: Go loads that pair too
        csr, _, _ = request_participant(out / "certs", "operator")
        issue_participant(out / "certs", "operator", csr=csr)
        metrics_port = _metrics_port(out / "logs" / "coordinator.log", time.monotonic() + 120)
        live = Live(sim, port, metrics_port)
        # first, while nothing else has been asked: the fresh coordinator's status
        live.status_json = _spherecal(
            "status",
            "--config",
            str(out / "coordinator.toml"),
            "--cert",
            str(live.certs / "operator.pem"),
            "--key",
            str(live.certs / "operator.key"),
            "--json",
        ).stdout
        yield live
    finally:
        sim.close()


def _spherecal(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "spherecal.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def _go(*args: str) -> subprocess.CompletedProcess[str]:
    go = _need("go")
    # standard library only: no module downloads, whatever the environment says
    env = {**os.environ, "GOFLAGS": "", "GOPROXY": "off", "GOTOOLCHAIN": "local"}
    env.setdefault("GOCACHE", str(Path.home() / ".cache" / "go-build"))
    return subprocess.run(
        [go, "run", str(CERTCHECK), *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_go_loads_every_pair_and_completes_mutual_tls(live: Live) -> None:
    done = _go("-dir", str(live.certs), "-addr", f"127.0.0.1:{live.port}", "-reflect")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    pairs = {d["pair"]: d for d in lines if "pair" in d}
    assert set(pairs) == {"server", "operator", "p0", "p1", "p2"}
    assert all(d["parsed"] and d["verified"] for d in pairs.values())
    # Go checked the binding itself: URI id == CN, URI key == NAME.identity.key
    assert all(pairs[n]["identity_key_bound"] for n in ("operator", "p0", "p1", "p2"))
    handshakes = {d["handshake"]: d["health"] for d in lines if "handshake" in d}
    assert handshakes == dict.fromkeys(("operator", "p0", "p1", "p2"), "SERVING")
    listed = {d["reflection"]: set(d["services"]) for d in lines if "reflection" in d}
    assert listed == {"v1": SERVICES, "v1alpha": SERVICES}


def _legacy_certificate(directory: Path) -> None:
    """A participant certificate in the pre-#26 format, signed by the CA in
    ``directory``: the identity key under the 128-bit-arc UUID OID."""
    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        .add_extension(
            x509.UnrecognizedExtension(LEGACY_IDENTITY_EXTENSION_OID, b"\x04\x20" + b"k" * 32),
            False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "old.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "old.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def test_go_refuses_the_old_certificate_format(tmp_path: Path) -> None:
    """Mutation check: the Go check fails on what ``certs issue`` wrote before #26."""
    init_ca(tmp_path)
    issue_participant(tmp_path, "p0")
    assert _go("-dir", str(tmp_path)).returncode == 0
    _legacy_certificate(tmp_path)
    done = _go("-dir", str(tmp_path))
    assert done.returncode == 1 and "old:" in done.stderr
    assert "malformed" in done.stderr or "integer too large" in done.stderr, done.stderr


def test_go_reads_each_revocation_list_number_and_its_ca_key(tmp_path: Path) -> None:
    """RFC 5280 §5.2, checked by Go's parser: every list ``spherecal certs`` signs
    names the CA's key and carries a CRL number one above the last (before
    2026-11-27 neither: Go read the number as nil)."""

    def crl_line() -> dict[str, object]:
        done = _go("-dir", str(tmp_path))
        assert done.returncode == 0, done.stderr
        (line,) = [d for d in map(json.loads, done.stdout.splitlines()) if "crl" in d]
        return dict(line)

    init_ca(tmp_path)
    issue_participant(tmp_path, "p0")
    assert crl_line() == {"crl": "crl.pem", "revoked": 0, "number": "1", "authority_key_id": True}
    revoke_participant(tmp_path, "p0")
    assert crl_line() == {"crl": "crl.pem", "revoked": 1, "number": "2", "authority_key_id": True}


def test_promtool_check_metrics_on_the_live_endpoint(live: Live) -> None:
    promtool = _need("promtool")
    curl = _need("curl")
    text = subprocess.run(
        [curl, "-fsS", live.url("/metrics")], capture_output=True, check=True, timeout=60
    ).stdout
    assert b"spherecal_participants" in text and b"process_resident_memory_bytes" in text
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout + done.stderr == b"", done


def test_curl_probes_need_no_client_certificate(live: Live) -> None:
    curl = _need("curl")
    for path, body in (("/healthz", "ok\n"), ("/readyz", "ready\n")):
        done = subprocess.run(
            [curl, "-fsS", live.url(path)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0 and done.stdout == body, done.stderr
    head = subprocess.run(
        [curl, "-fsS", "-I", live.url("/metrics")], capture_output=True, text=True, timeout=60
    )
    assert head.returncode == 0 and head.stdout.startswith("HTTP/1.0 200"), head
    missing = subprocess.run([curl, "-fsS", live.url("/")], capture_output=True, timeout=60)
    assert missing.returncode == 22  # curl -f: HTTP error (404)


def test_status_json_refusals_is_zero_through_jq(live: Live) -> None:
    jq = _need("jq")
    out = json.loads(live.status_json)
    assert out["refusals"] == 0 and out["privacy_enabled"] is False
    done = subprocess.run(
        [jq, ".refusals"], input=live.status_json, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "0\n"
    roster = subprocess.run(
        [jq, "-c", "[.roster[].index]"],
        input=live.status_json,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert roster.stdout == "[0,1,2]\n"


def test_python_reflection_client_lists_services(live: Live) -> None:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    creds = grpc.ssl_channel_credentials(
        root_certificates=(live.certs / "ca.pem").read_bytes(),
        private_key=(live.certs / "operator.key").read_bytes(),
        certificate_chain=(live.certs / "operator.pem").read_bytes(),
    )
    with grpc.secure_channel(f"127.0.0.1:{live.port}", creds) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) == SERVICES
        v1 = database.FindFileContainingSymbol("grpc.reflection.v1.ServerReflection")
        assert v1.package == "grpc.reflection.v1"


def test_a_site_with_an_old_certificate_is_told_to_reissue(tmp_path: Path) -> None:
    """The participant's own preflight names the old format in one line, before it
    dials the coordinator (which would refuse the join with the same reason)."""
    from spherecal.participant.settings import ClientTLS, ParticipantSettings
    from spherecal.participant.trust import pin_line
    from spherecal.preflight import PreflightError, check_participant
    from spherecal.proto.identity import load_identity_key, public_key_bytes

    init_ca(tmp_path)
    issue_participant(tmp_path, "p0")
    _legacy_certificate(tmp_path)

    own = public_key_bytes(load_identity_key(tmp_path / "p0.identity.key"))
    (tmp_path / "peers.txt").write_text(pin_line("p0", own) + "\n")

    def site(name: str) -> ParticipantSettings:
        return ParticipantSettings(
            participant_id=name,
            tls=ClientTLS(
                ca=tmp_path / "ca.pem",
                cert=tmp_path / f"{name}.pem",
                key=tmp_path / f"{name}.key",
                peer_keys=tmp_path / "peers.txt",
            ),
            state_dir=tmp_path / f"state-{name}",
            out_dir=tmp_path / "out",
        )

    check_participant(site("p0"), "p0.toml")
    with pytest.raises(PreflightError) as info:
        check_participant(site("old"), "old.toml")
    message = str(info.value)
    assert message.startswith("old.toml: [tls] cert = ") and "\n" not in message
    assert "re-issue it with `spherecal certs issue" in message
