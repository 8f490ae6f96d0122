"""Identity bytes: join proof and the certificate binding of the Ed25519 key."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from spherecal.certs import init_ca, issue_participant
from spherecal.crypto import generate_identity
from spherecal.proto.identity import (
    KEY_URI_PREFIX,
    LEGACY_IDENTITY_EXTENSION_OID,
    CertificateError,
    certificate_identity,
    identity_key_from_certificate,
    identity_uri,
    join_payload,
    key_uri,
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


def _self_signed(cn: str, *extensions: x509.ExtensionType) -> x509.Certificate:
    import datetime as dt

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
    )
    for ext in extensions:
        builder = builder.add_extension(ext, False)
    return builder.sign(key, hashes.SHA256())


def _uris(*uris: str) -> x509.SubjectAlternativeName:
    return x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris])


def test_issued_certificate_names_id_and_key_in_uri_sans(tmp_path: Path) -> None:
    """The binding is in standard fields: the SPIFFE-style id, then the whole key."""
    init_ca(tmp_path)
    issue_participant(tmp_path, "p0")
    cert = x509.load_pem_x509_certificate((tmp_path / "p0.pem").read_bytes())
    key = public_key_bytes(load_identity_key(tmp_path / "p0.identity.key"))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://spherecal/participant/p0",
        "urn:spherecal:ed25519:" + key.hex(),
    ]
    assert not any(e.oid == LEGACY_IDENTITY_EXTENSION_OID for e in cert.extensions)


def test_key_uri_must_be_one_well_formed_key() -> None:
    key = b"\xab" * 32
    good = key_uri(key)
    assert good == "urn:spherecal:ed25519:" + "ab" * 32
    assert identity_key_from_certificate(_self_signed("p0", _uris(identity_uri("p0"), good))) == key
    for bad in (
        good[:-2],
        good.upper().replace("URN:SPHERECAL:ED25519:", KEY_URI_PREFIX),
        good + "00",
    ):
        with pytest.raises(CertificateError, match="malformed"):
            identity_key_from_certificate(_self_signed("p0", _uris(bad)))
    two = _self_signed("p0", _uris(good, key_uri(b"\x02" * 32)))
    with pytest.raises(CertificateError, match="more than one"):
        identity_key_from_certificate(two)


def test_identity_uri_must_agree_with_the_common_name() -> None:
    odd = "site a/ü"
    assert identity_uri(odd) == "spiffe://spherecal/participant/site%20a%2F%C3%BC"
    assert certificate_identity(_self_signed(odd, _uris(identity_uri(odd)))) == odd
    for uri in (identity_uri("p1"), "urn:spherecal:participant:p1"):
        with pytest.raises(CertificateError, match="disagrees"):
            certificate_identity(_self_signed("p0", _uris(uri)))


def test_old_format_certificate_gets_one_line_saying_to_reissue() -> None:
    legacy = x509.UnrecognizedExtension(LEGACY_IDENTITY_EXTENSION_OID, b"\x04\x20" + b"k" * 32)
    cert = _self_signed("p0", legacy, _uris("urn:spherecal:participant:p0"))
    for read in (identity_key_from_certificate, certificate_identity):
        with pytest.raises(CertificateError) as info:
            read(cert)
        message = str(info.value)
        assert "\n" not in message and "re-issue" in message
        assert "spherecal certs issue" in message
