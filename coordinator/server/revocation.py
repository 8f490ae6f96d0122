"""Certificate revocation: a CRL from the federation's CA, enforced on every call.

Pinned identity keys stop a *different* key from taking over a participant id, but
they cannot help when a participant's own certificate and key are stolen. The
operator then revokes the certificate (``spherecal certs revoke NAME --dir CA``, or
the federation PKI's own CRL) and points ``[tls] crl`` at the CRL file. The
coordinator:

* refuses to start on a CRL that is not signed by ``[tls] client_ca`` (a forged or
  foreign list would otherwise silently decide who may connect);
* refuses every RPC whose client certificate's serial number is on the list, with
  UNAUTHENTICATED — including calls of a participant that joined before it was
  revoked, from its next call on;
* re-reads the file when it changes (checked at most once a second), so revoking
  needs no restart. A replacement that does not verify is *not* applied: the last
  valid list stays in force and the reason is reported (fail closed, never open);
* hands each list it applies — at start and at every reload — to ``on_change``,
  through which a member whose own certificate is on it *leaves* the federation
  (``CoordinatorService.certificates_revoked``): nothing waits for a member that
  cannot come back under its certificate.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

__all__ = ["RevocationList", "load_verified_crl"]


def load_verified_crl(pem: bytes, ca: x509.Certificate) -> x509.CertificateRevocationList:
    """Parse a PEM CRL and check that ``ca`` issued and signed it (ValueError if not)."""
    try:
        crl = x509.load_pem_x509_crl(pem)
    except ValueError as exc:
        raise ValueError(f"not a PEM certificate revocation list: {exc}") from None
    if crl.issuer != ca.subject:
        raise ValueError(
            f"CRL issuer {crl.issuer.rfc4514_string()!r} is not the client CA "
            f"{ca.subject.rfc4514_string()!r}"
        )
    public = ca.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise ValueError("the client CA's key type cannot sign CRLs here (EC or RSA)")
    if not crl.is_signature_valid(public):
        raise ValueError("CRL signature does not verify against the client CA")
    return crl


class RevocationList:
    """Revoked serial numbers from ``path``, kept current while the file changes."""

    def __init__(
        self,
        path: Path,
        ca_pem: bytes,
        *,
        report: Callable[[str], None] = lambda message: None,
        check_every_s: float = 1.0,
    ) -> None:
        self.on_change: Callable[[frozenset[int]], None] | None = None
        """Called with the revoked serials each time a changed list is applied (outside
        the lock; set by the server, which also hands it the list at start)."""
        self.path = path
        self._ca = x509.load_pem_x509_certificate(ca_pem)
        self._report = report
        self._check_every = check_every_s
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._serials = self._read()  # at start-up a bad CRL is an error
        self._checked = time.monotonic()

    def _file_stamp(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    def _read(self) -> frozenset[int]:
        try:
            pem = self.path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read CRL {self.path}: {exc}") from None
        try:
            crl = load_verified_crl(pem, self._ca)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        return frozenset(entry.serial_number for entry in crl)

    def _refresh(self) -> bool:
        """Re-read a changed file; True when a new list was applied."""
        now = time.monotonic()
        if now - self._checked < self._check_every:
            return False
        self._checked = now
        try:
            stamp = self._file_stamp()
        except OSError as exc:
            self._report(f"CRL {self.path} unreadable ({exc}); keeping the last valid list")
            return False
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            serials = self._read()
        except ValueError as exc:
            self._report(f"ignoring the changed CRL: {exc}; keeping the last valid list")
            return False
        added = len(serials - self._serials)
        self._serials = serials
        self._report(f"reloaded CRL {self.path}: {len(serials)} revoked ({added} new)")
        return True

    @property
    def serials(self) -> frozenset[int]:
        with self._lock:
            changed = self._refresh()
            serials = self._serials
        if changed and self.on_change is not None:
            self.on_change(serials)
        return serials

    def is_revoked(self, serial_number: int) -> bool:
        return serial_number in self.serials
