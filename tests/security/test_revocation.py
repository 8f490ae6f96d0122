"""Certificate revocation and identity-key recovery.

``spherecal certs revoke`` writes a CA-signed CRL; a coordinator with ``[tls] crl``
refuses a revoked certificate over real mutual-TLS gRPC — also one revoked while the
coordinator runs — and never applies a list its CA did not sign. ``--unpin`` lets an
operator give a participant a new identity key after a compromise."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from spherecal.certs import init_ca, issue_participant, revoke_participant, write_crl
from spherecal.cli.app import main
from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.server.grpc_server import CRL_STAMP_KEY, build_server
from spherecal.coordinator.server.revocation import (
    CrlStamp,
    RevocationList,
    crl_number,
    load_verified_crl,
)
from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.server.traffic import Traffic
from spherecal.coordinator.settings import CoordinatorSettings, ServerSettings, TLSSettings
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.store import Store
from spherecal.crypto import generate_identity
from spherecal.preflight import check_coordinator
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import load_identity_key, public_key_bytes
from spherecal.proto.services import grpc_services
from tests.joins import signed_join
from tests.unit.coordinator.service_harness import settings_for


def _serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def _revoked(ca: Path) -> set[int]:
    crl = load_verified_crl(
        (ca / "crl.pem").read_bytes(), x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    )
    return {entry.serial_number for entry in crl}


@pytest.fixture()
def ca(tmp_path: Path) -> Path:
    directory = tmp_path / "ca"
    init_ca(directory)
    for name in ("p0", "p1", "p2"):
        issue_participant(directory, name)
    return directory


def test_revoke_accumulates_a_ca_signed_list(ca: Path) -> None:
    revoke_participant(ca, "p0")
    assert _revoked(ca) == {_serial(ca / "p0.pem")}
    revoke_participant(ca, "p1")
    revoke_participant(ca, "p1")  # idempotent: no duplicate entry
    assert _revoked(ca) == {_serial(ca / "p0.pem"), _serial(ca / "p1.pem")}
    # Re-issuing gives a new serial that is not revoked; the old one stays revoked.
    old = _serial(ca / "p0.pem")
    issue_participant(ca, "p0")
    assert _serial(ca / "p0.pem") != old and old in _revoked(ca)
    with pytest.raises(FileNotFoundError, match="no certificate"):
        revoke_participant(ca, "nobody")


def test_certs_revoke_command(ca: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "revoke", "p2", "--dir", str(ca)]) == 0
    assert capsys.readouterr().out.strip() == str(ca / "crl.pem")
    assert _revoked(ca) == {_serial(ca / "p2.pem")}
    assert main(["certs", "revoke", "ghost", "--dir", str(ca)]) == 2


def test_a_list_the_ca_did_not_sign_is_never_applied(ca: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-ca"
    init_ca(other)
    issue_participant(other, "p0")
    revoke_participant(other, "p0")
    ca_pem = (ca / "ca.pem").read_bytes()
    with pytest.raises(ValueError, match="does not verify against the client CA"):
        RevocationList(other / "crl.pem", ca_pem)
    # A running list keeps its last valid state when the file is replaced badly.
    revoke_participant(ca, "p0")
    messages: list[str] = []
    crl = RevocationList(ca / "crl.pem", ca_pem, report=messages.append, check_every_s=0.0)
    assert crl.is_revoked(_serial(ca / "p0.pem"))
    (ca / "crl.pem").write_bytes((other / "crl.pem").read_bytes())
    assert crl.is_revoked(_serial(ca / "p0.pem"))
    assert any("keeping the last valid list" in m for m in messages)
    (ca / "crl.pem").write_bytes(b"-----BEGIN X509 CRL-----\ngarbage\n-----END X509 CRL-----\n")
    assert crl.is_revoked(_serial(ca / "p0.pem"))
    (ca / "crl.pem").unlink()  # the CA's list lost: its numbers start again
    revoke_participant(ca, "p1")  # CRL number 1, without p0
    p0, p1 = _serial(ca / "p0.pem"), _serial(ca / "p1.pem")
    assert crl.is_revoked(p0) and not crl.is_revoked(p1)
    assert any("CRL number 1 is below 2, the list in force" in m for m in messages)
    revoke_participant(ca, "p0")  # number 2 again, but not the list in force
    assert crl.is_revoked(p0) and not crl.is_revoked(p1)
    assert any("repeats" in m for m in messages)
    write_crl(ca)  # number 3: newer than the list in force
    assert crl.is_revoked(p0) and crl.is_revoked(p1)
    assert any("reloaded CRL" in m and "2 revoked (1 new)" in m for m in messages)


def _signed_list(
    ca: Path,
    serials: list[int],
    *,
    signed: dt.datetime,
    ends: dt.datetime,
    number: int | None = None,
) -> bytes:
    """A PEM CRL the CA in ``ca`` signed, as another PKI's tool could write it: any
    dates, with or without a CRL number."""
    ca_cert = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(signed)
        .next_update(ends)
    )
    for serial in serials:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(signed).build()
        )
    if number is not None:
        builder = builder.add_extension(x509.CRLNumber(number), False)
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def test_certs_number_each_list_and_name_the_ca_key(ca: Path) -> None:
    """RFC 5280 §5.2: a conforming CRL carries a CRL number, one above the list it
    replaces, and the issuer's key identifier (both checked again by Go's parser in
    ``tests/interop``)."""
    ca_cert = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest

    def stamped() -> tuple[int | None, bytes | None]:
        crl = x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())
        aki = crl.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
        return crl_number(crl), aki.key_identifier

    assert stamped() == (1, ski)  # init's empty list
    revoke_participant(ca, "p0")
    assert stamped() == (2, ski)
    write_crl(ca)
    assert stamped() == (3, ski)
    # a list written before lists were numbered counts as 0
    (ca / "crl.pem").write_bytes(
        _signed_list(
            ca,
            [_serial(ca / "p0.pem")],
            signed=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5),
            ends=dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
        )
    )
    revoke_participant(ca, "p1")
    assert stamped() == (1, ski) and _revoked(ca) == {
        _serial(ca / "p0.pem"),
        _serial(ca / "p1.pem"),
    }


def test_certs_crl_number_goes_above_a_lost_lists(
    ca: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CA whose ``crl.pem`` was lost starts again at 1; ``--number`` signs the list
    above what a coordinator applied (its refusal names the number), never at or below
    the list in the CA directory."""
    revoke_participant(ca, "p0")  # number 2
    (ca / "crl.pem").unlink()
    assert main(["certs", "crl", "--dir", str(ca), "--number", "9"]) == 0
    capsys.readouterr()
    assert crl_number(x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())) == 9
    for bad, why in (("9", "numbers only increase"), ("0", "from 1 to 2^159 - 1")):
        assert main(["certs", "crl", "--dir", str(ca), "--number", bad]) == 2
        assert why in capsys.readouterr().err
    assert crl_number(x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())) == 9
    write_crl(ca)
    assert crl_number(x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())) == 10


def test_an_older_list_the_ca_signed_is_never_applied_again(ca: Path, tmp_path: Path) -> None:
    """A CRL is signed so that it can travel over channels nobody trusts; its signature
    says who wrote it, not when. Before 2026-11-27 an old copy of the CA's own list put
    back over ``[tls] crl`` verified, was applied, and un-revoked every certificate
    revoked since."""
    ca_pem = (ca / "ca.pem").read_bytes()
    served = tmp_path / "served-crl.pem"
    first = (ca / "crl.pem").read_bytes()  # init's: CRL number 1, nothing revoked
    revoke_participant(ca, "p0")  # number 2
    served.write_bytes((ca / "crl.pem").read_bytes())
    messages: list[str] = []
    crl = RevocationList(served, ca_pem, report=messages.append, check_every_s=0.0)
    p0 = _serial(ca / "p0.pem")
    assert crl.is_revoked(p0)
    served.write_bytes(first)
    assert crl.is_revoked(p0)
    refused = [m for m in messages if "CRL number 1 is below 2, the list in force" in m]
    assert len(refused) == 1 and refused[0].startswith("WARNING: "), messages
    assert "(to replace it: `spherecal certs crl --dir CA_DIR --number 3` or higher)" in refused[0]
    # Lists without a CRL number (another PKI's tool) are ordered by their thisUpdate.
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    later = now + dt.timedelta(days=30)
    served.write_bytes(_signed_list(ca, [p0], signed=now - dt.timedelta(hours=1), ends=later))
    other = RevocationList(served, ca_pem, report=messages.append, check_every_s=0.0)
    assert other.is_revoked(p0)
    served.write_bytes(_signed_list(ca, [], signed=now - dt.timedelta(hours=2), ends=later))
    assert other.is_revoked(p0)
    assert any("before" in m and "keeping the last valid list" in m for m in messages)
    served.write_bytes(_signed_list(ca, [], signed=now, ends=later))  # newer: the CA's word
    assert not other.is_revoked(p0)


def test_a_restarted_coordinator_refuses_a_list_older_than_it_applied(
    ca: Path, tmp_path: Path
) -> None:
    """The newest list applied is kept in the state database, so an old copy put back
    while the coordinator was down stops its restart, like a list the CA did not sign
    (the operator puts the current list back or has the CA sign a newer one)."""
    first = (ca / "crl.pem").read_bytes()  # number 1
    revoke_participant(ca, "p0")  # number 2
    with _serving(ca, tmp_path) as served:
        kept = CrlStamp.from_json(served.store.get_meta(CRL_STAMP_KEY) or "")
        assert kept.number == 2
    (ca / "crl.pem").write_bytes(first)
    with pytest.raises(ValueError) as refused, _serving(ca, tmp_path):
        pass
    assert "CRL number 1 is below 2, the newest list this coordinator" in str(refused.value)
    assert "`spherecal certs crl --dir CA_DIR --number 3` or higher" in str(refused.value)
    write_crl(ca)  # the CA signs anew: number 2 is not enough (other contents) ...
    repeated = pytest.raises(ValueError, match="repeats CRL number 2 with other contents")
    with repeated, _serving(ca, tmp_path):
        pass
    write_crl(ca)  # ... number 3 is
    with _serving(ca, tmp_path) as served:
        assert CrlStamp.from_json(served.store.get_meta(CRL_STAMP_KEY) or "").number == 3
    # A CA made anew starts its numbers again: its lists are not ordered against the
    # old CA's (the operator changed ``client_ca`` too).
    init_ca(tmp_path / "new-ca")
    for name in ("server.pem", "server.key", "ca.pem", "ca.key", "crl.pem"):
        (ca / name).write_bytes((tmp_path / "new-ca" / name).read_bytes())
    with _serving(ca, tmp_path) as served:
        assert CrlStamp.from_json(served.store.get_meta(CRL_STAMP_KEY) or "").number == 1


def test_a_new_federation_in_the_state_directory_keeps_the_newest_list_applied(
    ca: Path, tmp_path: Path
) -> None:
    """``--new-federation`` sets the finished federation's database aside and starts an
    empty one: the newest list applied went with it, so an old copy put back before
    the new start was applied again (found 2026-11-27). It is carried over."""
    from spherecal.coordinator.main import run_coordinator

    first = (ca / "crl.pem").read_bytes()  # number 1
    revoke_participant(ca, "p0")  # number 2
    with _serving(ca, tmp_path) as served:
        served.store.set_meta("status", "completed")  # the federation ended
    (ca / "crl.pem").write_bytes(first)
    said: list[str] = []
    settings = _tls_settings(ca, tmp_path, join_s=1.0)  # the old code: nobody joins, it ends
    with pytest.raises(ValueError, match="CRL number 1 is below 2, the newest list"):
        run_coordinator(settings, say=said.append, new_federation=True)
    assert any("carried over from the federation set aside: crl_in_force" in m for m in said)
    (aside,) = sorted(settings.state_dir.glob("set-aside-*"))
    store = Store(settings.state_dir / "state.db")
    try:
        kept = CrlStamp.from_json(store.get_meta(CRL_STAMP_KEY) or "")
        assert kept.number == 2 and store.get_meta("federation_id") is not None
    finally:
        store.close()
    assert (aside / "state.db").is_file()


def test_a_list_past_its_next_update_still_applies_and_is_reported_once(ca: Path) -> None:
    """Fail closed: what an expired list revokes stays revoked; the WARNING says that
    revocations made since may be missing, once per list."""
    now = dt.datetime.now(dt.UTC)
    p0 = _serial(ca / "p0.pem")
    (ca / "crl.pem").write_bytes(
        _signed_list(
            ca, [p0], signed=now - dt.timedelta(days=3), ends=now - dt.timedelta(days=1), number=7
        )
    )
    messages: list[str] = []
    crl = RevocationList(
        ca / "crl.pem", (ca / "ca.pem").read_bytes(), report=messages.append, check_every_s=0.0
    )
    assert crl.is_revoked(p0) and crl.is_revoked(p0)
    stale = [m for m in messages if "past its nextUpdate" in m]
    assert len(stale) == 1 and stale[0].startswith("WARNING: "), messages
    assert "revocations made since may be missing" in stale[0]
    revoke_participant(ca, "p1")  # signed anew: number 8, valid for a year
    assert crl.is_revoked(p0) and crl.is_revoked(_serial(ca / "p1.pem"))
    assert len([m for m in messages if "past its nextUpdate" in m]) == 1


def test_crl_stamps_order_only_lists_of_one_ca() -> None:
    t = dt.datetime(2026, 11, 27, 12, tzinfo=dt.UTC)
    a = "a" * 64
    kept = CrlStamp(a, 5, t, "1" * 64)
    assert kept.why_older(CrlStamp(a, 4, t + dt.timedelta(days=1), "2" * 64)) is not None
    assert kept.why_older(CrlStamp(a, 5, t, "2" * 64)) is not None  # one number, two lists
    assert kept.why_older(CrlStamp(a, 6, t - dt.timedelta(days=1), "2" * 64)) is None
    assert kept.why_older(CrlStamp(a, 5, t, "1" * 64)) is None  # the same list
    assert kept.why_older(CrlStamp("b" * 64, 1, t - dt.timedelta(days=9), "2" * 64)) is None
    unnumbered = CrlStamp(a, None, t, "1" * 64)
    assert unnumbered.why_older(CrlStamp(a, None, t, "2" * 64)) is not None
    assert unnumbered.why_older(CrlStamp(a, None, t - dt.timedelta(seconds=1), "2" * 64))
    assert unnumbered.why_older(CrlStamp(a, None, t + dt.timedelta(seconds=1), "2" * 64)) is None
    assert CrlStamp.from_json(kept.to_json()) == kept
    for bad in (
        "",
        "{}",
        '{"ca_key": "a", "number": true, "this_update": "2026-11-27T00:00:00+00:00", '
        '"contents": "1"}',
        '{"ca_key": "a", "number": 1, "this_update": "2026-11-27T00:00:00", "contents": "1"}',
        '{"ca_key": "a", "number": 1, "this_update": "2026-11-27T00:00:00+00:00"}',
    ):
        with pytest.raises(ValueError, match="not a stored CRL stamp"):
            CrlStamp.from_json(bad)


def _join_request(pid: str, key_path: Path) -> pb.JoinRequest:
    return signed_join(pid, load_identity_key(key_path))


@dataclass
class Served:
    port: int
    ca: Path
    service: CoordinatorService
    store: Store
    said: list[str]


def _tls_settings(ca: Path, tmp_path: Path, *, join_s: float = 600.0) -> CoordinatorSettings:
    """A coordinator's settings over real mutual TLS whose ``[tls] crl`` is ``ca/crl.pem``."""
    base = settings_for(tmp_path, secure=False)
    return replace(
        base,
        timeouts=replace(base.timeouts, join_s=join_s),
        server=ServerSettings(listen="127.0.0.1:0"),
        tls=TLSSettings(
            cert=ca / "server.pem",
            key=ca / "server.key",
            client_ca=ca / "ca.pem",
            crl=ca / "crl.pem",
        ),
    )


@contextmanager
def _serving(ca: Path, tmp_path: Path, *, run: bool = False) -> Iterator[Served]:
    """A coordinator over real mutual TLS whose ``[tls] crl`` is ``ca/crl.pem``, after
    the same start-up checks as ``spherecal coordinator`` (``check_coordinator``);
    with ``run`` its federation runs too (a join window of 600 s)."""
    settings = _tls_settings(ca, tmp_path)
    check_coordinator(settings, "coordinator.toml")
    store = Store(settings.state_dir / "state.db")
    registry = Registry(
        settings.participants,
        store,
        require_certificates=True,
        heartbeat_timeout_s=30,
        clock_skew_s=60,
    )
    said: list[str] = []
    federation = Federation(settings, store, registry, say=said.append)
    federation.prepare()
    service = CoordinatorService(settings, registry, federation, store, Traffic())
    try:
        grpc_server, port = build_server(settings, service)
    except BaseException:
        store.close()
        raise
    grpc_server.start()
    driver = threading.Thread(target=federation.run, daemon=True)
    if run:
        driver.start()
    try:
        yield Served(port, ca, service, store, said)
    finally:
        if run:
            federation.stop("test over")
            driver.join(timeout=10)
            assert not driver.is_alive()
        grpc_server.stop(grace=None).wait()
        store.close()


@pytest.fixture()
def server(ca: Path, tmp_path: Path) -> Iterator[Served]:
    revoke_participant(ca, "p0")
    with _serving(ca, tmp_path) as served:
        yield served


def _stub(port: int, ca: Path, name: str) -> Any:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(ca / "ca.pem").read_bytes(),
        private_key=(ca / f"{name}.key").read_bytes(),
        certificate_chain=(ca / f"{name}.pem").read_bytes(),
    )
    return grpc_services().CoordinatorStub(grpc.secure_channel(f"127.0.0.1:{port}", creds))


def test_revoked_certificates_are_refused_over_mtls(server: Served) -> None:
    port, ca = server.port, server.ca
    p0, p1 = _stub(port, ca, "p0"), _stub(port, ca, "p1")
    for _ in range(3):  # a revoked site retrying
        with pytest.raises(grpc.RpcError) as info:
            p0.Join(_join_request("p0", ca / "p0.identity.key"), timeout=10)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (info.value.details() or "")
    # the operator sees it: counted (each), logged and in events (once a minute per reason)
    assert server.service.refusals.snapshot() == {"UNAUTHENTICATED": 3}
    lines = [m for m in server.said if "refused a call from ipv4:127.0.0.1:" in m]
    assert len(lines) == 1 and "the client certificate of 'p0'" in lines[0], server.said
    assert "is revoked" in lines[0]
    events = server.store.query("SELECT level, message FROM events WHERE message LIKE '%revoked%'")
    assert len(events) == 1 and events[0][0] == "warning"
    session = p1.Join(_join_request("p1", ca / "p1.identity.key"), timeout=10).session
    caller = pb.Caller(participant_id="p1", session=session)
    assert p1.GetStatus(pb.StatusRequest(caller=caller), timeout=10) is not None
    # Revoked while connected and joined: refused from a following call on.
    revoke_participant(ca, "p1")
    deadline = time.monotonic() + 20
    while True:
        try:
            p1.GetStatus(pb.StatusRequest(caller=caller), timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAUTHENTICATED, exc.details()
            assert "revoked" in (exc.details() or "")
            break
        assert time.monotonic() < deadline, "the changed CRL was never applied"
        time.sleep(0.2)
    # p2, never revoked, is unaffected.
    p2 = _stub(port, ca, "p2")
    assert p2.Join(_join_request("p2", ca / "p2.identity.key"), timeout=10).session


def _refused_soon(call: Any, what: str) -> grpc.RpcError:
    """``call()`` until it is refused (the list is re-read at most once a second): the
    refusal, which must say UNAUTHENTICATED and "revoked"."""
    deadline = time.monotonic() + 20
    while True:
        try:
            call()
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAUTHENTICATED, exc.details()
            assert "revoked" in (exc.details() or "")
            return exc
        assert time.monotonic() < deadline, f"never refused: {what}"
        time.sleep(0.2)


def test_the_list_init_wrote_revokes_without_a_restart(tmp_path: Path) -> None:
    """docs/deployment.md from the first day: ``certs init`` wrote an empty ``crl.pem``
    and the coordinator names it in ``[tls] crl`` from its start; a site joins and
    calls, the operator runs ``spherecal certs revoke``, and — the coordinator still the
    same process — the site's next call and its next handshake are refused. Before,
    ``[tls] crl`` could not name a list until the first revocation wrote one, and
    setting it then took a restart."""
    ca = tmp_path / "ca"
    assert main(["certs", "init", str(ca)]) == 0
    for name in ("p0", "p1"):
        assert main(["certs", "issue", name, "--dir", str(ca)]) == 0
    with _serving(ca, tmp_path) as served:
        p0, p1 = _stub(served.port, ca, "p0"), _stub(served.port, ca, "p1")
        session = p0.Join(_join_request("p0", ca / "p0.identity.key"), timeout=10).session
        caller = pb.Caller(participant_id="p0", session=session)
        assert p0.GetStatus(pb.StatusRequest(caller=caller), timeout=10) is not None
        assert p1.Join(_join_request("p1", ca / "p1.identity.key"), timeout=10).session
        assert main(["certs", "revoke", "p0", "--dir", str(ca)]) == 0
        _refused_soon(lambda: p0.GetStatus(pb.StatusRequest(caller=caller), timeout=10), "call")
        # a new connection (a new TLS handshake) with the revoked certificate: refused too
        again = _stub(served.port, ca, "p0")
        _refused_soon(
            lambda: again.Join(_join_request("p0", ca / "p0.identity.key"), timeout=10), "join"
        )
        assert any("reloaded CRL" in line and "(1 new)" in line for line in served.said)
        # p1, not revoked, is answered as before
        assert p1.Join(_join_request("p1", ca / "p1.identity.key"), timeout=10).session


def test_a_revoked_member_is_not_waited_for(tmp_path: Path) -> None:
    """Over real mutual TLS, the coordinator running its join window (600 s): p2
    joins, is revoked through the CLI, and its next call is refused — by then the
    coordinator has reloaded the list, and p2, whose own certificate is on it, has
    left; the window closes as soon as p0 and p1 have joined. Until 2026-11-27 it
    waited the whole window for p2, which cannot come back under that certificate.
    Then, the coordinator stopped, p1 is revoked: the restarted coordinator knows at
    its start that p1 left (the serial p1 joined with is in its store)."""
    ca = tmp_path / "ca"
    assert main(["certs", "init", str(ca)]) == 0
    for name in ("p0", "p1", "p2"):
        assert main(["certs", "issue", name, "--dir", str(ca)]) == 0
    p2_left = (
        f"has a revoked certificate (serial {_serial(ca / 'p2.pem'):x}) and can join again "
        "only with a new one"
    )
    with _serving(ca, tmp_path, run=True) as served:
        federation = served.service.federation
        p0, p1, p2 = (_stub(served.port, ca, name) for name in ("p0", "p1", "p2"))
        session = p2.Join(_join_request("p2", ca / "p2.identity.key"), timeout=10).session
        caller = pb.Caller(participant_id="p2", session=session)
        assert main(["certs", "revoke", "p2", "--dir", str(ca)]) == 0
        _refused_soon(lambda: p2.GetStatus(pb.StatusRequest(caller=caller), timeout=10), "p2")
        assert served.service.registry.left() == {"p2": p2_left}
        assert f"WARNING: p2 left the federation: it {p2_left}" in served.said
        assert federation.phase == "waiting for participants"
        for name, stub in (("p0", p0), ("p1", p1)):
            assert stub.Join(_join_request(name, ca / f"{name}.identity.key"), timeout=10).session
        closed = (
            "every participant that has not left joined: continuing with 2 of 3 "
            f"participants, without ['p2'] (p2 {p2_left})"
        )
        deadline = time.monotonic() + 60
        while closed not in federation.warnings:  # not after 600 s
            assert time.monotonic() < deadline, federation.warnings
            time.sleep(0.05)
    p1_serial = _serial(ca / "p1.pem")
    revoke_participant(ca, "p1")  # while the coordinator is down
    with _serving(ca, tmp_path) as served:  # before any call
        left = served.service.registry.left()
        assert left["p1"].startswith(f"has a revoked certificate (serial {p1_serial:x})")
        assert left["p2"] == p2_left


def test_unpin_lets_a_participant_rejoin_with_a_new_identity_key(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    old, new = generate_identity(), generate_identity()
    store.record_join("p0", 0, public_key_bytes(old), None)
    assert store.pinned_keys() == {"p0": public_key_bytes(old)}
    store.record_join("p0", 0, public_key_bytes(new), None)  # never overwrites a pin
    assert store.pinned_keys() == {"p0": public_key_bytes(old)}
    assert store.unpin("p0") and not store.unpin("p0")
    assert store.pinned_keys() == {}
    store.record_join("p0", 0, public_key_bytes(new), None)  # the next join re-pins
    assert store.pinned_keys() == {"p0": public_key_bytes(new)}
    events = store.query("SELECT level, message FROM events")
    assert ("warning", "operator unpinned the identity key of p0") in events
    store.close()


def test_coordinator_unpin_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[federation]\nparticipants = ["a", "b"]\nstate_dir = "state"\n'
        '[model]\nextractor = "mlp"\n[server]\ninsecure = true\n'
    )
    assert main(["coordinator", "--config", str(config), "--unpin", "a"]) == 2
    assert "no coordinator state" in capsys.readouterr().err
    (tmp_path / "state").mkdir()
    store = Store(tmp_path / "state" / "state.db")
    store.record_join("a", 0, public_key_bytes(generate_identity()), None)
    store.close()
    assert main(["coordinator", "--config", str(config), "--unpin", "zed"]) == 2
    assert "not on the roster" in capsys.readouterr().err
    assert main(["coordinator", "--config", str(config), "--unpin", "a"]) == 0
    assert "unpinned the identity key of a" in capsys.readouterr().out
    store = Store(tmp_path / "state" / "state.db")
    assert store.pinned_keys() == {}
    store.close()


@pytest.mark.parametrize("status", ["completed", "degraded", "failed"])
def test_unpin_refuses_an_ended_federation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], status: str
) -> None:
    """An ended federation's database is read-only to the coordinator (a restart
    reports it and changes nothing); ``--unpin`` wrote into it all the same, a pin no
    join could use. Refused with one line (exit 2) saying why and what to do; the
    database is left as it was, byte for byte."""
    config = tmp_path / "c.toml"
    config.write_text(
        '[federation]\nparticipants = ["a", "b"]\nstate_dir = "state"\n'
        '[model]\nextractor = "mlp"\n[server]\ninsecure = true\n'
    )
    (tmp_path / "state").mkdir()
    store = Store(tmp_path / "state" / "state.db")
    key = public_key_bytes(generate_identity())
    store.record_join("a", 0, key, None)
    store.set_meta("federation_id", "f00dfeed")
    store.set_meta("status", status)
    store.close()
    before = {p.name: p.read_bytes() for p in (tmp_path / "state").iterdir()}
    assert main(["coordinator", "--config", str(config), "--unpin", "a"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0 and captured.out == "", err
    assert f"federation f00dfeed in {tmp_path / 'state'} already ended {status}" in err, err
    assert "read-only (nothing changed)" in err and "--new-federation" in err, err
    assert {p.name: p.read_bytes() for p in (tmp_path / "state").iterdir()} == before
    store = Store(tmp_path / "state" / "state.db")
    assert store.pinned_keys() == {"a": key}
    store.close()
