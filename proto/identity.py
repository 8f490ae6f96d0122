"""Identity bytes both sides must agree on: the join proof and the certificate binding.

Every participant has a long-term Ed25519 identity key (``crypto.generate_identity``)
that signs its secure-aggregation key advertisements. Two things tie that key to a
participant id:

* **Join proof.** ``JoinRequest.signature`` is an Ed25519 signature over
  :func:`join_payload` — a domain label, the id, the public key, a timestamp and a
  nonce — proving possession of the key (a coordinator pins the first key it sees
  for an id and refuses a different one later).
* **Certificate binding (mTLS).** ``spherecal certs issue`` puts the participant id
  and the identity public key into the participant's X.509 certificate as two URI
  subject alternative names (RFC 5280 §4.2.1.6), fields every TLS stack parses (Go's
  ``crypto/x509``, Java, Node/OpenSSL, rustls):

  - ``spiffe://spherecal/participant/ID`` (:data:`IDENTITY_URI_PREFIX`; SPIFFE-style,
    the id percent-encoded outside ``A-Z a-z 0-9 - . _ ~``) — must equal the CN;
  - ``urn:spherecal:ed25519:HEX`` (:data:`KEY_URI_PREFIX`) — the whole 32-byte raw
    Ed25519 public key in lowercase hex, not a fingerprint.

  The coordinator checks the key against the joining key, and — the reason it exists
  — every *participant* checks its peers' keys against their CA-signed certificates
  before running secure aggregation, so a malicious coordinator cannot substitute
  keys (the man-in-the-middle Bonawitz et al. 2017 guard against with signatures
  needs a trust root the coordinator does not control). The binding is exactly as
  strong as before: the CA's signature covers the SAN extension, and the SAN holds
  the full key, so accepting a substituted key means forging the CA's signature.

  Before issue #26 the key was an extension under the UUID OID
  :data:`LEGACY_IDENTITY_EXTENSION_OID`, whose 128-bit arc Go's parser and grpcurl
  reject (``x509: malformed extension OID field``), so no Go tool could load the
  client certificate. A certificate still carrying it is refused with one line
  saying to re-issue it (``spherecal certs issue NAME --dir DIR`` keeps the identity
  key). Because there are two URI SANs, the certificate is SPIFFE-*style*, not a
  strict X509-SVID (which allows exactly one URI).
"""

from __future__ import annotations

import struct
from pathlib import Path
from urllib.parse import quote, unquote

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

__all__ = [
    "IDENTITY_URI_PREFIX",
    "KEY_URI_PREFIX",
    "LEGACY_IDENTITY_EXTENSION_OID",
    "LEGACY_URI_PREFIX",
    "CertificateError",
    "certificate_binding",
    "certificate_identity",
    "identity_key_from_certificate",
    "identity_san",
    "identity_uri",
    "join_payload",
    "key_uri",
    "load_identity_key",
    "public_key_bytes",
    "save_identity_key",
]

#: The pre-#26 key extension (a UUID OID, ITU-T X.667 ``2.25``): recognised only to
#: tell the operator to re-issue the certificate.
LEGACY_IDENTITY_EXTENSION_OID = x509.ObjectIdentifier(
    "2.25.338712815614522320728318247227344775438"
)
#: The pre-#26 identity URI; still accepted as a name (it must agree with the CN).
LEGACY_URI_PREFIX = "urn:spherecal:participant:"
IDENTITY_URI_PREFIX = "spiffe://spherecal/participant/"
KEY_URI_PREFIX = "urn:spherecal:ed25519:"
JOIN_LABEL = b"spherecal/v1/join"
_REISSUE = (
    "certificate uses the old spherecal format (identity key in extension "
    f"{LEGACY_IDENTITY_EXTENSION_OID.dotted_string}, unreadable by Go and other TLS "
    "stacks); re-issue it with `spherecal certs issue NAME --dir CA_DIR` (the identity "
    "key is kept)"
)


class CertificateError(ValueError):
    """A certificate that does not (correctly) bind a participant id and identity key."""


def _field(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def join_payload(participant_id: str, public_key: bytes, timestamp_ms: int, nonce: bytes) -> bytes:
    """The exact bytes a participant signs to join (length-prefixed, unambiguous)."""
    return (
        _field(JOIN_LABEL)
        + _field(participant_id.encode("utf-8"))
        + _field(bytes(public_key))
        + struct.pack(">Q", int(timestamp_ms))
        + _field(bytes(nonce))
    )


def public_key_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def identity_uri(participant_id: str) -> str:
    """``spiffe://spherecal/participant/ID``, the id percent-encoded (RFC 3986)."""
    return IDENTITY_URI_PREFIX + quote(participant_id, safe="")


def key_uri(public_key: bytes) -> str:
    """``urn:spherecal:ed25519:HEX``: the raw 32-byte Ed25519 public key."""
    if len(public_key) != 32:
        raise ValueError("an Ed25519 public key has 32 bytes")
    return KEY_URI_PREFIX + bytes(public_key).hex()


def identity_san(participant_id: str, public_key: bytes) -> x509.SubjectAlternativeName:
    """The subject alternative names binding a participant id and its identity key."""
    return x509.SubjectAlternativeName(
        [
            x509.UniformResourceIdentifier(identity_uri(participant_id)),
            x509.UniformResourceIdentifier(key_uri(public_key)),
        ]
    )


def _uris(cert: x509.Certificate | x509.CertificateSigningRequest) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def _refuse_legacy(cert: x509.Certificate | x509.CertificateSigningRequest) -> None:
    try:
        cert.extensions.get_extension_for_oid(LEGACY_IDENTITY_EXTENSION_OID)
    except x509.ExtensionNotFound:
        return
    raise CertificateError(_REISSUE)


def identity_key_from_certificate(
    cert: x509.Certificate | x509.CertificateSigningRequest,
) -> bytes | None:
    """The Ed25519 identity key a certificate (or a request for one) binds, or None
    when it carries none.

    Exactly one ``urn:spherecal:ed25519:`` URI of 64 lowercase hex digits, else
    :class:`CertificateError` (two keys would let a CA-signed certificate vouch for
    a key of the holder's choosing)."""
    _refuse_legacy(cert)
    keys = [u for u in _uris(cert) if u.startswith(KEY_URI_PREFIX)]
    if not keys:
        return None
    if len(keys) > 1:
        raise CertificateError("certificate binds more than one spherecal identity key")
    digits = keys[0][len(KEY_URI_PREFIX) :]
    if len(digits) != 64 or digits.strip("0123456789abcdef"):
        raise CertificateError("malformed spherecal identity key URI (need 64 lowercase hex)")
    return bytes.fromhex(digits)


def certificate_identity(cert: x509.Certificate | x509.CertificateSigningRequest) -> str:
    """The participant id a certificate (or a request) names: its CN, which must agree with every
    ``spiffe://spherecal/participant/`` (and old ``urn:spherecal:participant:``) URI."""
    _refuse_legacy(cert)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise CertificateError("certificate must have exactly one common name")
    cn = names[0].value
    cn = cn.decode("utf-8") if isinstance(cn, bytes) else str(cn)
    for uri in _uris(cert):
        if uri.startswith(IDENTITY_URI_PREFIX):
            named = unquote(uri[len(IDENTITY_URI_PREFIX) :], errors="strict")
        elif uri.startswith(LEGACY_URI_PREFIX):
            named = uri[len(LEGACY_URI_PREFIX) :]
        else:
            continue
        if named != cn:
            raise CertificateError(f"certificate SAN {uri!r} disagrees with its CN {cn!r}")
    return cn


def certificate_binding(
    cert: x509.Certificate | x509.CertificateSigningRequest,
) -> tuple[str, bytes | None]:
    """``(participant id, identity key or None)`` a certificate or a request binds:
    :func:`certificate_identity` and :func:`identity_key_from_certificate` together,
    each refusal a :class:`CertificateError`."""
    return certificate_identity(cert), identity_key_from_certificate(cert)


def load_identity_key(path: str | Path) -> Ed25519PrivateKey:
    """Load an Ed25519 identity key (PKCS#8 PEM, unencrypted)."""
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key


def save_identity_key(key: Ed25519PrivateKey, path: str | Path) -> None:
    """Write an identity key as PKCS#8 PEM, readable by the owner only."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_bytes(pem)
    tmp.chmod(0o600)
    tmp.replace(target)
