"""A site's keys made at the site: ``certs request`` there, ``certs issue --csr`` at
the CA.

The sites pin each other's identity keys so that whoever holds the CA key cannot
seat members of its own beside them (``[tls] peer_keys``). Where the CA's holder also
*made* every site's identity key (``certs issue NAME`` alone), it could sign as any
site under its pinned key, and the pins would hold nothing. With a request, only the
public keys reach the CA: the certificate binds the site's own identity key and TLS
key, nothing private is written in the CA's directory, and a request that does not
verify, names another participant or binds no (or two) identity keys is refused.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from spherecal.certs import init_ca, issue_participant, request_participant
from spherecal.cli.app import main
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import (
    certificate_identity,
    identity_key_from_certificate,
    identity_uri,
    key_uri,
    load_identity_key,
    public_key_bytes,
)


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    directory = tmp_path / "ca"
    init_ca(directory)
    return directory


def _public(path: Path) -> bytes:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_a_requested_certificate_binds_the_sites_own_keys(tmp_path: Path, ca: Path) -> None:
    site = tmp_path / "site"
    csr, key, identity = request_participant(site, "hospital-b")
    assert (csr, key, identity) == (
        site / "hospital-b.csr",
        site / "hospital-b.key",
        site / "hospital-b.identity.key",
    )
    for private in (key, identity):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    before = set(ca.iterdir())
    (pem,) = issue_participant(ca, "hospital-b", csr=csr)
    assert pem == ca / "hospital-b.pem"
    assert set(ca.iterdir()) - before == {pem}  # nothing private made or kept at the CA

    cert = x509.load_pem_x509_certificate(pem.read_bytes())
    root = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    cert.verify_directly_issued_by(root)
    own_identity = public_key_bytes(load_identity_key(identity))
    assert certificate_identity(cert) == "hospital-b"
    assert identity_key_from_certificate(cert) == own_identity
    assert cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == _public(key)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    # what a peer checks: the directory entry verifies against the CA
    entry = pb.DirectoryEntry(
        participant_id="hospital-b",
        identity_public_key=own_identity,
        certificate_pem=pem.read_bytes(),
    )
    trust = DirectoryTrust((ca / "ca.pem").read_bytes())
    assert trust.verify([entry], ["hospital-b"]) == {"hospital-b": own_identity}

    # a renewal keeps both keys (the other sites pinned the identity)
    again, _, _ = request_participant(site, "hospital-b")
    (renewed,) = issue_participant(ca, "hospital-b", csr=again)
    second = x509.load_pem_x509_certificate(renewed.read_bytes())
    assert identity_key_from_certificate(second) == own_identity
    assert second.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == _public(key)
    assert second.serial_number != cert.serial_number


def _csr(
    path: Path,
    name: str,
    uris: list[str],
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None,
) -> Path:
    signer = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
    )
    if uris:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), False
        )
    path.write_bytes(builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return path


def test_a_request_that_does_not_hold_is_refused(tmp_path: Path, ca: Path) -> None:
    site = tmp_path / "site"
    good, _, _ = request_participant(site, "p0")
    k1, k2 = b"\x01" * 32, b"\x02" * 32
    cases = {
        "for another participant": (
            good,
            "p1",
            "requests a certificate for 'p0', not 'p1'",
        ),
        "no identity key": (
            _csr(tmp_path / "a.csr", "p0", [identity_uri("p0")]),
            "p0",
            "names no identity key",
        ),
        "two identity keys": (
            _csr(tmp_path / "b.csr", "p0", [identity_uri("p0"), key_uri(k1), key_uri(k2)]),
            "p0",
            "more than one spherecal identity key",
        ),
        "a SAN naming someone else": (
            _csr(tmp_path / "c.csr", "p0", [identity_uri("p9"), key_uri(k1)]),
            "p0",
            "disagrees with its CN",
        ),
        "a short RSA key": (
            _csr(
                tmp_path / "d.csr",
                "p0",
                [identity_uri("p0"), key_uri(k1)],
                rsa.generate_private_key(public_exponent=65537, key_size=1024),
            ),
            "p0",
            "RSA key of 1024 bits",
        ),
        "not a request": (tmp_path / "e.csr", "p0", "is not a PEM certificate request"),
        "no file": (tmp_path / "missing.csr", "p0", "no such file"),
    }
    (tmp_path / "e.csr").write_text("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n")
    tampered = tmp_path / "f.csr"
    der = bytearray(
        x509.load_pem_x509_csr(good.read_bytes()).public_bytes(serialization.Encoding.DER)
    )
    der[-3] ^= 0x01  # inside the signature
    tampered.write_bytes(
        x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    )
    cases["a signature that does not verify"] = (tampered, "p0", "signature does not verify")
    for what, (path, name, message) in cases.items():
        with pytest.raises(ValueError, match=message):
            issue_participant(ca, name, csr=path)
        assert not (ca / f"{name}.pem").exists(), what
    with pytest.raises(ValueError, match="with --csr the site makes it"):
        issue_participant(ca, "p0", csr=good, new_identity=True)


def test_the_commands(tmp_path: Path, ca: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site"
    assert main(["certs", "request", "p0", "--dir", str(site)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(site / "p0.csr")
    assert "stay here" in err and str(site / "p0.identity.key") in err
    assert main(["certs", "issue", "p0", "--dir", str(ca), "--csr", str(site / "p0.csr")]) == 0
    assert capsys.readouterr().out.strip() == str(ca / "p0.pem")
    assert not (ca / "p0.key").exists() and not (ca / "p0.identity.key").exists()
    assert main(["certs", "issue", "p1", "--dir", str(ca), "--csr", str(site / "p0.csr")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not 'p1'" in err, err
