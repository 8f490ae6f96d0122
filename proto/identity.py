"""Identity bytes both sides must agree on: the join proof and the certificate binding.

Every participant has a long-term Ed25519 identity key (``crypto.generate_identity``)
that signs its secure-aggregation key advertisements. Two things tie that key to a
participant id:

* **Join proof.** ``JoinRequest.signature`` is an Ed25519 signature over
  :func:`join_payload` — a domain label, the id, the public key, a timestamp and a
  nonce — proving possession of the key (a coordinator pins the first key it sees
  for an id and refuses a different one later).
* **Certificate binding (mTLS).** ``spherecal certs issue`` puts the identity public
  key into the participant's X.509 certificate as a private extension
  (:data:`IDENTITY_EXTENSION_OID`). The coordinator checks it against the joining key,
  and — the reason it exists — every *participant* checks its peers' keys against
  their CA-signed certificates before running secure aggregation, so a malicious
  coordinator cannot substitute keys (the man-in-the-middle Bonawitz et al. 2017
  guard against with signatures needs a trust root the coordinator does not control).
"""

from __future__ import annotations

import struct
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

__all__ = [
    "IDENTITY_EXTENSION_OID",
    "SAN_URI_PREFIX",
    "CertificateError",
    "certificate_identity",
    "identity_extension",
    "identity_key_from_certificate",
    "join_payload",
    "load_identity_key",
    "public_key_bytes",
    "save_identity_key",
]

#: UUID-derived OID (ITU-T X.667 ``2.25``): needs no registration, collides with nothing.
IDENTITY_EXTENSION_OID = x509.ObjectIdentifier("2.25.338712815614522320728318247227344775438")
SAN_URI_PREFIX = "urn:spherecal:participant:"
JOIN_LABEL = b"spherecal/v1/join"


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


def identity_extension(public_key: bytes) -> x509.UnrecognizedExtension:
    """The certificate extension carrying a raw Ed25519 public key (DER OCTET STRING)."""
    if len(public_key) != 32:
        raise ValueError("an Ed25519 public key has 32 bytes")
    return x509.UnrecognizedExtension(IDENTITY_EXTENSION_OID, b"\x04\x20" + bytes(public_key))


def identity_key_from_certificate(cert: x509.Certificate) -> bytes | None:
    """The Ed25519 identity key a certificate binds, or None when it carries none."""
    try:
        ext = cert.extensions.get_extension_for_oid(IDENTITY_EXTENSION_OID)
    except x509.ExtensionNotFound:
        return None
    value = ext.value
    raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
    if len(raw) != 34 or raw[:2] != b"\x04\x20":
        raise CertificateError("malformed spherecal identity extension")
    return raw[2:]


def certificate_identity(cert: x509.Certificate) -> str:
    """The participant id a certificate names: its CN, which must agree with any
    ``urn:spherecal:participant:`` SAN URI."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise CertificateError("certificate must have exactly one common name")
    cn = names[0].value
    cn = cn.decode("utf-8") if isinstance(cn, bytes) else str(cn)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
    except x509.ExtensionNotFound:
        uris = []
    for uri in uris:
        if uri.startswith(SAN_URI_PREFIX) and uri[len(SAN_URI_PREFIX) :] != cn:
            raise CertificateError(f"certificate SAN {uri!r} disagrees with its CN {cn!r}")
    return cn


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
