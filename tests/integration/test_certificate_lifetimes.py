"""A certificate outside its validity window is said, not retried in silence; a site's
identity key is the one its certificate binds.

What the operator walkthrough found: a site whose client certificate had expired logged
only ``cannot reach the coordinator … Socket closed; retrying with back-off`` for
``give_up_s`` and exited 3, and the coordinator logged nothing (the TLS handshake is
refused below its code, and gRPC core's line about it is INFO, below the
``GRPC_VERBOSITY=ERROR`` the CLI sets). And a site under TLS told to create its missing
identity key with ``--init`` got a key its certificate does not bind, then was told
to share a pin line for it.

Every case here is a real ``spherecal`` process on real files: a CA and a site's
request made by ``spherecal certs``, certificates dated by that CA
(``tests/cert_dates.py``), a real mutual-TLS coordinator for the handshake log.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from spherecal.certs import init_ca, issue_participant, request_participant
from spherecal.crypto import generate_identity, identity_public_bytes
from spherecal.participant.trust import pin_line
from spherecal.proto.identity import (
    identity_key_from_certificate,
    load_identity_key,
    save_identity_key,
)
from tests.cert_dates import redate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    """The environment of a process started by an operator: gRPC's log level is the
    CLI's to choose (a level set by an earlier test in this process is not)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GRPC_VERBOSITY", "SPHERECAL_GRPC_VERBOSITY_DEFAULT")
    }
    return env | {"PYTHONPATH": str(REPO)}


def _spherecal(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spherecal.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _when(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """Machine A's CA in ``certs/``, site-a's keys made at the site in ``keys/`` and
    certified from its request, the members pinned, and ``site-a.toml`` as the guide
    writes it — with a coordinator that is not there."""
    init_ca(tmp_path / "certs")
    csr, _, identity = request_participant(tmp_path / "keys", "site-a")
    issue_participant(tmp_path / "certs", "site-a", csr=csr)
    public = identity_public_bytes(load_identity_key(identity))
    (tmp_path / "peers.txt").write_text(pin_line("site-a", public) + "\n")
    _participant_config(tmp_path, identity_key="keys/site-a.identity.key")
    return tmp_path


def _participant_config(site: Path, *, identity_key: str) -> Path:
    config = site / "site-a.toml"
    config.write_text(
        "[participant]\n"
        'id = "site-a"\n'
        f'coordinator = "127.0.0.1:{_closed_port()}"\n'
        'state_dir = "state"\n'
        f'identity_key = "{identity_key}"\n'
        "reconnect_max_s = 0.2\n"
        "give_up_s = 1.0\n"
        "rpc_timeout_s = 2.0\n"
        "[tls]\n"
        'ca = "certs/ca.pem"\n'
        'cert = "certs/site-a.pem"\n'
        'key = "keys/site-a.key"\n'
        'peer_keys = "peers.txt"\n'
        "[data]\n"
        'dataset = "digits"\n'
    )
    return config


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("start_days", "end_days", "said"),
    [(-30, -1, "expired on"), (2, 30, "is not valid until")],
)
def test_a_site_outside_its_certificates_window_exits_2_saying_so(
    site: Path, start_days: float, end_days: float, said: str
) -> None:
    cert = redate(
        site / "certs", site / "certs" / "site-a.pem", start_days=start_days, end_days=end_days
    )
    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    done = _spherecal("participant", "--config", "site-a.toml", cwd=site)
    assert done.returncode == 2, done.stderr
    line = _one_line(done)
    assert line.startswith("spherecal participant: error: site-a.toml: [tls] cert = "), line
    assert "certs/site-a.pem" in line and said in line, line
    window = f"valid {_when(loaded.not_valid_before_utc)} to {_when(loaded.not_valid_after_utc)}"
    assert window in line, line
    # what to do: a new certificate from a request made where the keys are
    assert "spherecal certs request site-a" in line and "spherecal certs issue site-a" in line
    assert "cannot reach" not in done.stderr  # it never dialled
    assert not (site / "state").exists() or not any((site / "state").iterdir())


def test_a_certificate_that_ends_soon_is_a_warning_at_start(site: Path) -> None:
    cert = redate(site / "certs", site / "certs" / "site-a.pem", start_days=-1, end_days=3)
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    done = _spherecal("participant", "--config", "site-a.toml", cwd=site)
    assert done.returncode == 3, done.stderr  # it ran: the coordinator is not there
    warnings = [ln for ln in done.stderr.splitlines() if "WARNING" in ln and "[tls] cert" in ln]
    assert len(warnings) == 1, done.stderr
    assert f"expires on {_when(end)}" in warnings[0] and "less than 14" in warnings[0]
    assert done.stderr.splitlines()[0] == warnings[0]  # the first thing it says


def test_status_with_an_expired_operator_certificate_exits_2(site: Path) -> None:
    issue_participant(site / "certs", "operator")
    certs = site / "certs"
    argv: list[str | Path] = [
        "status",
        "--address",
        f"127.0.0.1:{_closed_port()}",
        "--ca",
        certs / "ca.pem",
        "--cert",
        certs / "operator.pem",
        "--key",
        certs / "operator.key",
        "--timeout",
        "2",
    ]
    redate(certs, certs / "operator.pem", start_days=-30, end_days=-1)
    done = _spherecal(*argv, cwd=site)
    assert done.returncode == 2, done.stderr  # not 4: it is not an outage
    line = _one_line(done)
    assert "--cert = " in line and "operator.pem" in line and "expired on" in line, line
    assert "spherecal certs request operator" in line, line
    redate(certs, certs / "operator.pem", start_days=-1, end_days=3)
    done = _spherecal(*argv, cwd=site)
    assert done.returncode == 4, done.stderr  # dialled, and nobody answered
    assert done.stderr.startswith("spherecal status: WARNING: --cert = "), done.stderr
    assert "expires on" in done.stderr.splitlines()[0]


def _coordinator_config(site: Path, *, port_file: str = "port") -> Path:
    config = site / "coordinator.toml"
    config.write_text(
        "[federation]\n"
        'participants = ["site-a", "site-b", "site-c"]\n'
        'state_dir = "state-coordinator"\n'
        'out_dir = "out-coordinator"\n'
        "[model]\n"
        'extractor = "mlp"\n'
        "[server]\n"
        'listen = "127.0.0.1:0"\n'
        f'port_file = "{port_file}"\n'
        "[tls]\n"
        'cert = "certs/server.pem"\n'
        'key = "certs/server.key"\n'
        'client_ca = "certs/ca.pem"\n'
        "[timeouts]\n"
        "join_s = 600\n"
    )
    return config


def test_the_coordinator_refuses_its_own_expired_certificate(site: Path) -> None:
    _coordinator_config(site)
    redate(site / "certs", site / "certs" / "server.pem", start_days=-30, end_days=-1)
    done = _spherecal("coordinator", "--config", "coordinator.toml", cwd=site)
    assert done.returncode == 2, done.stderr
    line = _one_line(done)
    assert "coordinator.toml: [tls] cert = 'certs/server.pem' expired on" in line, line
    assert "server certificate" in line, line
    assert not (site / "state-coordinator").exists()  # nothing was started


def test_an_ended_ca_file_is_refused_at_start_by_each_side(site: Path) -> None:
    """The CA file itself, the trust anchor each side loads: once it has ended, every
    handshake fails both ways with nothing said (a site: "Socket closed", or the
    coordinator's certificate "does not verify"). Each process refuses it at start in
    one line naming the file, the CA's subject and its dates; ``spherecal status``
    likewise. The CA is the one that issued everything here, re-dated."""
    certs = site / "certs"
    issue_participant(certs, "operator")  # for `status --cert`, before the CA ended
    ca = redate(certs, certs / "ca.pem", start_days=-400, end_days=-1)
    loaded = x509.load_pem_x509_certificate(ca.read_bytes())
    said = (
        "'certs/ca.pem': the CA certificate CN=spherecal dev CA,O=spherecal federation "
        f"expired on {_when(loaded.not_valid_after_utc)} (valid "
        f"{_when(loaded.not_valid_before_utc)} to {_when(loaded.not_valid_after_utc)})"
    )
    done = _spherecal("participant", "--config", "site-a.toml", cwd=site)
    assert done.returncode == 2, done.stderr
    line = _one_line(done)
    assert line.startswith(f"spherecal participant: error: site-a.toml: [tls] ca = {said}"), line
    assert "cannot reach" not in done.stderr  # it never dialled
    _coordinator_config(site)
    done = _spherecal("coordinator", "--config", "coordinator.toml", cwd=site)
    assert done.returncode == 2, done.stderr
    line = _one_line(done)
    assert f"error: coordinator.toml: [tls] client_ca = {said}" in line, line
    assert not (site / "state-coordinator").exists()  # nothing was started
    done = _spherecal(
        "status",
        "--address",
        f"127.0.0.1:{_closed_port()}",
        "--ca",
        "certs/ca.pem",
        "--cert",
        certs / "operator.pem",
        "--key",
        certs / "operator.key",
        "--timeout",
        "2",
        cwd=site,
    )
    assert done.returncode == 2, done.stderr  # not 4: no outage, a file to replace
    assert _one_line(done).startswith(f"spherecal status: error: --ca = {said}"), done.stderr


def test_a_bundle_with_an_ended_ca_beside_the_current_one_is_a_warning(site: Path) -> None:
    """A file that holds the ended CA of a change-over after the current one still
    verifies what the current CA issued: the site starts, and its first line names the
    ended CA. Before it (both are "spherecal dev CA", and TLS takes the first of a
    name), the current one verifies nothing: refused at start, saying to reorder."""
    certs = site / "certs"
    old = site / "old"
    init_ca(old)
    ended = redate(old, old / "ca.pem", start_days=-400, end_days=-10)
    current = (certs / "ca.pem").read_bytes()
    (certs / "ca.pem").write_bytes(ended.read_bytes() + current)
    done = _spherecal("participant", "--config", "site-a.toml", cwd=site)
    assert done.returncode == 2, done.stderr
    line = _one_line(done)
    assert "[tls] ca = 'certs/ca.pem': none of its 2 CA certificates can verify now" in line
    assert "put the valid CA certificate first in the file" in line, line
    (certs / "ca.pem").write_bytes(current + ended.read_bytes())
    done = _spherecal("participant", "--config", "site-a.toml", cwd=site)
    assert done.returncode == 3, done.stderr  # it ran: the coordinator is not there
    first = done.stderr.splitlines()[0]
    assert "WARNING: site-a.toml: [tls] ca = 'certs/ca.pem': 1 of its 2 CA " in first, first
    end = x509.load_pem_x509_certificate(ended.read_bytes()).not_valid_after_utc
    assert f"expired on {_when(end)}" in first, first


def _dial(port: int, cert: Path, key: Path, ca: Path) -> None:
    """One client that offers ``cert`` and waits a moment for the channel: the handshake
    fails (it would hang on for ever otherwise)."""
    credentials = grpc.ssl_channel_credentials(ca.read_bytes(), key.read_bytes(), cert.read_bytes())
    channel = grpc.secure_channel(
        f"127.0.0.1:{port}", credentials, options=[("grpc.ssl_target_name_override", "localhost")]
    )
    try:
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=1.5)
    finally:
        channel.close()


@pytest.mark.parametrize("trace", [False, True], ids=["default", "GRPC_TRACE=handshaker"])
def test_the_coordinator_logs_a_refused_handshake_by_its_reason(site: Path, trace: bool) -> None:
    """A site that skips its own start check (an older version, another client) with an
    expired certificate, and one with a certificate from another CA: the coordinator's
    log says why each handshake was refused, in its own line format; gRPC core's raw
    lines, and its other INFO lines, stay out. Who was refused: by default the line
    says the address is not known and how to have it named; with gRPC's handshaker
    trace on, as it says, the line names the client's host."""
    certs = site / "certs"
    expired = redate(certs, certs / "site-a.pem", start_days=-30, end_days=-1, out=site / "old.pem")
    init_ca(site / "other")
    request_participant(site / "other-keys", "site-a")
    foreign = issue_participant(site / "other", "site-a", csr=site / "other-keys" / "site-a.csr")[0]
    _coordinator_config(site)
    log = site / "coordinator.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spherecal.cli", "coordinator", "--config", "coordinator.toml"],
            cwd=site,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env=_env() | ({"GRPC_TRACE": "handshaker"} if trace else {}),
        )
    try:
        deadline = time.monotonic() + 120
        while not (site / "port").is_file() or not (site / "port").read_text().strip():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        port = int((site / "port").read_text())
        wanted = {
            "the client's certificate (or the [tls] client_ca certificate that issued it) "
            "has expired": (expired, site / "keys" / "site-a.key"),
            "the client's certificate does not verify against [tls] client_ca": (
                foreign,
                site / "other-keys" / "site-a.key",
            ),
        }
        seen: dict[str, str] = {}
        while len(seen) < len(wanted):
            for reason, (cert, key) in wanted.items():
                if reason not in seen:
                    _dial(port, cert, key, certs / "ca.pem")
            refused = "WARNING: refused a TLS handshake" + (" from 127.0.0.1" if trace else "")
            for line in log.read_text().splitlines():
                for reason in wanted:
                    if f"{refused}: {reason}" in line:
                        seen.setdefault(reason, line)
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    text = log.read_text()
    for line in seen.values():
        assert " WARNING coordinator: " in line, line  # the coordinator's own format
        if trace:
            assert "not known" not in line, line
        else:
            assert "the client's address is not known" in line, line
            assert "start the coordinator with GRPC_TRACE=handshaker" in line, line
    assert "ssl_transport_security" not in text and "Handshake failed" not in text, text
    assert "Log level INFO" not in text, text
    assert "CallNextHandshakerLocked" not in text and "Source Location" not in text, text


def test_a_site_under_tls_gets_no_new_identity_key(site: Path) -> None:
    """The walkthrough's path: a mistyped ``identity_key``, the hint followed, the
    next start. The hint names the key ``certs request`` wrote, ``--init`` makes none,
    and a key made anyway is refused at start naming both keys — not sent on to the
    pinning check that would have asked to share its line."""
    typo = "keys/site-a.identiy.key"
    _participant_config(site, identity_key=typo)
    done = _spherecal("participant", "--config", "site-a.toml", cwd=site)
    assert done.returncode == 2, done.stderr
    line = _one_line(done)
    assert typo in line and "spherecal certs request site-a" in line, line
    assert "site-a.identity.key" in line and "--init would" in line.replace("`", ""), line
    done = _spherecal("participant", "--config", "site-a.toml", "--init", cwd=site)
    assert done.returncode == 2, done.stderr
    assert "--init makes no key" in _one_line(done)
    assert not (site / typo).exists()

    made = generate_identity()  # what following the old hint made
    save_identity_key(made, site / typo)
    done = _spherecal("participant", "--config", "site-a.toml", cwd=site)
    assert done.returncode == 2, done.stderr
    line = _one_line(done)
    bound = identity_key_from_certificate(
        x509.load_pem_x509_certificate((site / "certs" / "site-a.pem").read_bytes())
    )
    assert bound is not None
    assert f"is key {identity_public_bytes(made).hex()[:16]}…" in line, line
    assert f"binds key {bound.hex()[:16]}…" in line, line
    assert "add the line" not in line and "peer_keys" not in line, line
    done = _spherecal("participant", "--config", "site-a.toml", "--init", cwd=site)
    assert done.returncode == 2 and "binds key" in _one_line(done), done.stderr

    _participant_config(site, identity_key="keys/site-a.identity.key")  # the right one
    done = _spherecal("participant", "--config", "site-a.toml", "--init", cwd=site)
    assert done.returncode == 0, done.stderr
    assert "kept the existing identity key" in done.stdout
