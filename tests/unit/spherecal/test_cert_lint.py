"""A certificate linter over everything ``spherecal certs`` writes (issue #26).

Go's ``crypto/x509`` (and grpcurl, ``grpc_health_probe``, Java's and rustls'
parsers) refuse an OBJECT IDENTIFIER arc that does not fit their integer type; the
old identity extension's 128-bit UUID arc made every participant certificate
unreadable to them. This walks the DER of each certificate and CRL — every nested
TLV, including DER inside OCTET STRINGs such as extension values — decodes every
OID strictly (minimal base-128, X.690 §8.19) and requires each arc < 2**31. The
strict-parser half is Python's ``cryptography`` (rust-asn1, DER only) here and Go's
standard library in ``tests/interop/`` where Go is installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from spherecal.certs import init_ca, issue_participant, request_participant, revoke_participant
from spherecal.proto.identity import LEGACY_IDENTITY_EXTENSION_OID

ARC_LIMIT = 2**31


class DerError(ValueError):
    pass


def _tlv(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the TLV at ``at`` (DER lengths)."""
    if at + 2 > len(data):
        raise DerError("truncated TLV")
    tag = data[at]
    if tag & 0x1F == 0x1F:
        raise DerError("high tag numbers do not occur in X.509")
    first = data[at + 1]
    at += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or at + count > len(data):
            raise DerError("bad length")
        length = int.from_bytes(data[at : at + count], "big")
        if length < 0x80 or data[at] == 0:
            raise DerError("non-minimal length")
        at += count
    if at + length > len(data):
        raise DerError("content runs past its parent")
    return tag, at, at + length


def _oid_arcs(content: bytes) -> list[int]:
    if not content or content[-1] & 0x80:
        raise DerError("truncated OID")
    values, value, fresh = [], 0, True
    for byte in content:
        if fresh and byte == 0x80:
            raise DerError("non-minimal OID subidentifier")
        value = (value << 7) | (byte & 0x7F)
        fresh = not byte & 0x80
        if fresh:
            values.append(value)
            value = 0
    first = values[0]
    head = [min(first // 40, 2), first - 40 * min(first // 40, 2)]
    return head + values[1:]


def oids(der: bytes, nested: bool = False) -> Iterator[list[int]]:
    """Every OID in ``der``: a sequence of TLVs, walked recursively. An OCTET STRING
    is read as DER once (an extension's value); inside that, OCTET STRINGs are opaque
    bytes (a key identifier), never guessed at."""
    at = 0
    while at < len(der):
        tag, start, end = _tlv(der, at)
        content = der[start:end]
        if tag == 0x06:
            yield _oid_arcs(content)
        elif tag & 0x20:  # constructed: SEQUENCE, SET, [n] EXPLICIT
            yield from oids(content, nested)
        elif tag == 0x04 and not nested:  # an extension value is DER itself
            yield from oids(content, True)
        at = end


def _pem_blocks(path: Path) -> list[bytes]:
    import base64

    text = path.read_text()
    blocks = []
    for part in text.split("-----BEGIN ")[1:]:
        body = part.split("-----", 1)[1].split("-----END", 1)[0]
        blocks.append(base64.b64decode("".join(body.split())))
    return blocks


def lint(path: Path) -> list[str]:
    """Problems in the PEM file at ``path`` (empty: clean)."""
    problems = []
    for der in _pem_blocks(path):
        for arcs in oids(der):
            if any(a >= ARC_LIMIT for a in arcs):
                problems.append(f"{path.name}: OID {'.'.join(map(str, arcs))} has an arc >= 2^31")
    return problems


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    init_ca(tmp_path, hosts=("localhost", "127.0.0.1", "::1"))
    for name in ("p0", "operator", "site-with.dots_and~tilde"):
        issue_participant(tmp_path, name)
    revoke_participant(tmp_path, "operator")
    issue_participant(tmp_path, "operator")
    csr, _, _ = request_participant(tmp_path / "site", "requested")  # keys made at a site
    issue_participant(tmp_path, "requested", csr=csr)
    return tmp_path


def test_every_file_certs_writes_is_lint_clean_and_strictly_parsed(ca_dir: Path) -> None:
    pems = sorted(p for p in ca_dir.glob("*.pem"))
    assert {p.name for p in pems} >= {"ca.pem", "server.pem", "p0.pem", "crl.pem", "requested.pem"}
    for path in pems:
        assert lint(path) == [], path
        found = list(oids(_pem_blocks(path)[0]))
        assert [1, 2, 840, 10045, 4, 3, 2] in found  # ecdsa-with-SHA256: the walk sees OIDs
        data = path.read_bytes()
        if path.name == "crl.pem":
            x509.load_pem_x509_crl(data)
        else:
            cert = x509.load_pem_x509_certificate(data)
            x509.load_der_x509_certificate(cert.public_bytes(Encoding.DER))
            assert cert.version is x509.Version.v3


def test_the_linter_catches_the_old_identity_extension(tmp_path: Path) -> None:
    """Mutation check: a certificate with the pre-#26 extension fails the lint."""
    import datetime as dt

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p0")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.UnrecognizedExtension(LEGACY_IDENTITY_EXTENSION_OID, b"\x04\x20" + b"k" * 32),
            False,
        )
        .sign(key, hashes.SHA256())
    )
    path = tmp_path / "old.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (problem,) = lint(path)
    assert LEGACY_IDENTITY_EXTENSION_OID.dotted_string in problem


def test_der_walker_refuses_non_minimal_encodings() -> None:
    with pytest.raises(DerError):
        list(oids(bytes([0x06, 0x03, 0x2A, 0x80, 0x01])))  # 0x80 leading subidentifier
    with pytest.raises(DerError):
        list(oids(bytes([0x30, 0x81, 0x01, 0x05])))  # long form for a short length
    assert list(oids(bytes([0x06, 0x03, 0x55, 0x1D, 0x11]))) == [[2, 5, 29, 17]]
