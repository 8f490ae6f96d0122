"""A coordinator certificate that fails verification is a configuration mistake, not an
outage: gRPC reports it as UNAVAILABLE ("failed to connect to all addresses"), so a
site said "cannot reach the coordinator" for ten minutes and ``spherecal status``
exited 4 ("unreachable") — with nothing saying what to fix. The guide's certificates
(``certs init --host coord.example.org --host 10.0.0.5``) do not name 127.0.0.1,
where ``spherecal status --config`` on the coordinator's machine dials a wildcard
listener. A TLS server on a real socket, presenting such a certificate, plays the
coordinator."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from spherecal.certs import init_ca, issue_participant
from spherecal.cli.app import main
from spherecal.participant.grpc_transport import client_certificate_hint
from spherecal.participant.main import run_participant
from spherecal.participant.policy import PolicySettings
from spherecal.participant.settings import ClientTLS, ParticipantSettings


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    init_ca(directory, hosts=["coord.example.org", "10.0.0.5"])
    for name in ("p0", "operator"):
        issue_participant(directory, name)
    other = directory / "other"
    init_ca(other)
    for name in ("p0", "operator"):
        issue_participant(other, name)  # the same names, from another CA
    return directory


@pytest.fixture(scope="module")
def port(certs: Path) -> Iterator[int]:
    """A mutual-TLS gRPC server with the coordinator's certificate and no services."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    credentials = grpc.ssl_server_credentials(
        [((certs / "server.key").read_bytes(), (certs / "server.pem").read_bytes())],
        root_certificates=(certs / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    bound = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield bound
    server.stop(None)


def _site(
    tmp_path: Path, certs: Path, port: int, ca: Path, *, server_name: str | None = None
) -> list[str]:
    lines: list[str] = []
    end = run_participant(
        ParticipantSettings(
            participant_id="p0",
            coordinator=f"127.0.0.1:{port}",
            tls=ClientTLS(
                ca=ca, cert=certs / "p0.pem", key=certs / "p0.key", server_name=server_name
            ),
            state_dir=tmp_path / "state",
            identity_key=certs / "p0.identity.key",  # the key its certificate binds
            reconnect_max_s=0.2,
            give_up_s=0.5,
            rpc_timeout_s=2.0,
            policy=PolicySettings(trust_ca_for_members=True),  # pins: test_peer_keys.py
        ),
        log=lines.append,
    )
    assert end.code == 3, lines
    return [line for line in lines if line.startswith("cannot reach the coordinator")]


def test_a_site_is_told_what_to_fix(tmp_path: Path, certs: Path, port: int) -> None:
    (first,) = _site(tmp_path / "name", certs, port, certs / "ca.pem")
    assert "does not name the address dialled: set [tls] server_name" in first, first
    (first,) = _site(tmp_path / "ca", certs, port, certs / "other" / "ca.pem")
    assert "does not verify against [tls] ca = " in first and "other/ca.pem" in first, first


def test_a_site_whose_ca_ended_while_it_ran_is_not_told_to_use_another_ca(
    tmp_path: Path, certs: Path, port: int
) -> None:
    """The site's CA file, valid at its start-up check, has ended since (the same CA
    key, its certificate's dates past): OpenSSL reports "certificate has expired" for
    the chain, which used to read as a certificate from another CA ("use the CA that
    issued it"). The line says that the coordinator's certificate or the CA one ended."""
    from tests.cert_dates import redate

    ended = redate(certs, certs / "ca.pem", start_days=-30, end_days=-1, out=tmp_path / "ca.pem")
    (first,) = _site(tmp_path, certs, port, ended, server_name="coord.example.org")
    assert f"or the CA certificate in [tls] ca = {ended} that issued it, is expired" in first
    assert "does not verify against" not in first, first


def test_a_site_whose_certificate_another_ca_issued_is_told_so(
    tmp_path: Path, certs: Path, port: int
) -> None:
    """The coordinator refuses the client certificate and closes the handshake; gRPC
    says only "Socket closed". The site checks its own certificate against the CA it
    trusts and names the mismatch."""
    (first,) = _site(
        tmp_path, certs / "other", port, certs / "ca.pem", server_name="coord.example.org"
    )
    assert "Socket closed" in first, first
    assert "closed the connection during the TLS handshake" in first, first
    assert "other/p0.pem" in first and "is not issued by [tls] ca = " in first, first


def test_the_certificate_hint_is_for_a_mismatch_alone(tmp_path: Path, certs: Path) -> None:
    closed = "UNAVAILABLE: ipv4:127.0.0.1:1: Socket closed"

    def hint(details: str, cert: Path | None, ca: Path) -> str:
        return client_certificate_hint(
            details, cert=cert, ca=ca, cert_name="[tls] cert", ca_name="[tls] ca"
        )

    foreign, ca = certs / "other" / "p0.pem", certs / "ca.pem"
    assert hint(closed, foreign, ca).startswith(
        "the coordinator closed the connection during the TLS handshake"
    )
    # issued by that CA: the closed socket has another cause, and no hint guesses one
    assert hint(closed, certs / "p0.pem", ca) == ""
    # another failure, no certificate, or a file that cannot be read now: nothing
    assert hint("UNAVAILABLE: ipv4:127.0.0.1:1: Connection refused", foreign, ca) == ""
    assert hint(closed, None, ca) == ""
    assert hint(closed, certs / "missing.pem", ca) == ""
    # a bundle that holds the issuing CA among others verifies
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(ca.read_bytes() + (certs / "other" / "ca.pem").read_bytes())
    assert hint(closed, foreign, bundle) == ""


def _status(certs: Path, *target: str) -> list[str]:
    return [
        "status",
        *target,
        "--cert",
        str(certs / "operator.pem"),
        "--key",
        str(certs / "operator.key"),
        "--timeout",
        "5",
    ]


def test_status_names_the_certificate_not_an_outage(
    certs: Path, port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_status(certs, "--address", f"127.0.0.1:{port}", "--ca", str(certs / "ca.pem")))
    err = capsys.readouterr().err.strip()
    assert code == 2, err  # bad input, not 4 (unreachable)
    assert err.count("\n") == 0 and "set --server-name to a name it was issued for" in err


def test_status_with_an_operator_certificate_from_another_ca_says_so(
    certs: Path, port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _status(certs / "other", "--address", f"127.0.0.1:{port}")
    argv += ["--ca", str(certs / "ca.pem"), "--server-name", "coord.example.org"]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err  # bad input, not 4 (unreachable)
    assert err.count("\n") == 0 and "is not issued by --ca" in err, err


def test_status_on_the_coordinator_machine_checks_the_name_in_its_certificate(
    tmp_path: Path, certs: Path, port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config`` with ``listen = "0.0.0.0:PORT"`` dials 127.0.0.1 and checks a name
    the coordinator's own ``[tls] cert`` holds: the handshake passes (the bare server
    then answers UNIMPLEMENTED)."""
    config = tmp_path / "coordinator.toml"
    config.write_text(
        '[federation]\nparticipants = ["p0", "p1", "p2"]\n'
        f'[server]\nlisten = "0.0.0.0:{port}"\n'
        f'[tls]\ncert = "{certs / "server.pem"}"\nkey = "{certs / "server.key"}"\n'
        f'client_ca = "{certs / "ca.pem"}"\n'
    )
    code = main(_status(certs, "--config", str(config)))
    err = capsys.readouterr().err
    assert code == 2 and "UNIMPLEMENTED" in err and "Hostname" not in err, err
