"""Real certificates with chosen validity dates, for the tests of what an expired, not
yet valid or soon ending certificate does.

``spherecal certs`` makes only certificates valid from now (it refuses ``--days`` below
1), so a test takes one it made and has the same CA sign it again with other dates:
everything else — subject, public key, the identity SANs, EKU — stays, so the result is
exactly what that CA would have issued at another time.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["redate"]


def redate(
    ca_dir: Path,
    cert: Path,
    *,
    start_days: float,
    end_days: float,
    out: Path | None = None,
) -> Path:
    """``cert`` signed again by the CA in ``ca_dir`` (``ca.pem``, ``ca.key``), valid
    from ``start_days`` to ``end_days`` days from now (negative: in the past); written
    to ``out`` (default: over ``cert``)."""
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    original = x509.load_pem_x509_certificate(cert.read_bytes())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(original.subject)
        .issuer_name(original.issuer)
        .public_key(original.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + dt.timedelta(days=start_days))
        .not_valid_after(now + dt.timedelta(days=end_days))
    )
    for extension in original.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    target = out or cert
    target.write_bytes(
        builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    )
    return target
