"""Identity bytes: join proof and the certificate binding of the Ed25519 key."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from spherecal.certs import init_ca, issue_participant
from spherecal.crypto import generate_identity
from spherecal.proto.identity import (
    CertificateError,
    certificate_identity,
    identity_key_from_certificate,
    join_payload,
    load_identity_key,
    public_key_bytes,
    save_identity_key,
)


def test_join_payload_is_unambiguous() -> None:
    key = b"k" * 32
    a = join_payload("ab", key, 1, b"n" * 16)
    b = join_payload("a", key, 1, b"n" * 16)
    assert a != b
    assert join_payload("ab", key, 2, b"n" * 16) != a


def test_identity_key_file_round_trip_is_owner_only(tmp_path: Path) -> None:
    key = generate_identity()
    path = tmp_path / "id.key"
    save_identity_key(key, path)
    assert path.stat().st_mode & 0o077 == 0
    assert public_key_bytes(load_identity_key(path)) == public_key_bytes(key)


def test_issued_certificate_binds_id_and_identity_key(tmp_path: Path) -> None:
    init_ca(tmp_path)
    issue_participant(tmp_path, "hospital-a")
    cert = x509.load_pem_x509_certificate((tmp_path / "hospital-a.pem").read_bytes())
    key = load_identity_key(tmp_path / "hospital-a.identity.key")
    assert certificate_identity(cert) == "hospital-a"
    assert identity_key_from_certificate(cert) == public_key_bytes(key)
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    assert identity_key_from_certificate(server) is None
    with pytest.raises(FileExistsError):
        init_ca(tmp_path)  # never silently replace a CA


def test_reissuing_keeps_the_identity_key(tmp_path: Path) -> None:
    init_ca(tmp_path)
    issue_participant(tmp_path, "p0")
    first = (tmp_path / "p0.identity.key").read_bytes()
    issue_participant(tmp_path, "p0")
    assert (tmp_path / "p0.identity.key").read_bytes() == first


def test_malformed_extension_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from spherecal.proto.identity import IDENTITY_EXTENSION_OID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p0")])
    import datetime as dt

    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.UnrecognizedExtension(IDENTITY_EXTENSION_OID, b"\x04\x01x"), False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier("urn:spherecal:participant:p1")]
            ),
            False,
        )
        .sign(key, hashes.SHA256())
    )
    with pytest.raises(CertificateError, match="malformed"):
        identity_key_from_certificate(cert)
    with pytest.raises(CertificateError, match="disagrees"):
        certificate_identity(cert)
