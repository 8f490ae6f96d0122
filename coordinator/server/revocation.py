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
* never goes back to an *older* list, even one the CA signed: a replacement with a
  lower CRL number (RFC 5280 §5.2.3), the same number with other contents, or — for
  lists without numbers — an earlier ``thisUpdate`` than the list in force is not
  applied, and the reason is reported with the ``certs crl --number`` that signs a
  list it takes (:class:`CrlStamp`, kept across restarts). A CRL is signed so that it can
  travel over channels nobody trusts (a distribution point, a copy job); its
  signature says who wrote it, not when, so without this an old copy put back over
  the file un-revoked every certificate revoked since (since 2026-11-27);
* says, at WARNING and once per list, when the list in force is past its
  ``nextUpdate``: it still applies (fail closed — what it revokes stays revoked),
  but the CA promised a newer list by then, and revocations made since may be
  missing (``spherecal certs crl --dir CA`` signs it anew, keeping its entries);
* hands each list it applies — at start and at every reload — to ``on_change``,
  through which a member whose own certificate is on it *leaves* the federation
  (``CoordinatorService.certificates_revoked``): nothing waits for a member that
  cannot come back under its certificate.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

__all__ = ["CrlStamp", "RevocationList", "ca_key_digest", "crl_number", "load_verified_crl"]


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


def crl_number(crl: x509.CertificateRevocationList) -> int | None:
    """The list's CRL number extension (RFC 5280 §5.2.3), None for a list without one."""
    try:
        return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        return None


@dataclass(frozen=True)
class CrlStamp:
    """Where a list stands in its CA's sequence: the CA's key, the list's CRL number
    and its ``thisUpdate``.

    The coordinator stores the stamp of every list it applies (``meta`` key
    ``crl_in_force``) and refuses a list older than it — also at start, so that an old
    copy put back over the file while the coordinator was down is not applied by its
    restart. Lists of two CA keys are not ordered (a CA made anew starts at 1)."""

    ca_key: str
    """SHA-256 of the CA's public key (hex)."""
    number: int | None
    this_update: dt.datetime
    contents: str
    """SHA-256 of the signed part of the list (hex): two lists of one number and date
    with other entries are told apart."""

    def why_older(self, other: CrlStamp) -> str | None:
        """Why ``other`` is older than this stamp (None when it is not, or when the
        two are of different CAs)."""
        if other.ca_key != self.ca_key or other.contents == self.contents:
            return None
        if self.number is not None and other.number is not None:
            if other.number < self.number:
                return f"its CRL number {other.number} is below {self.number}"
            if other.number == self.number:
                # RFC 5280 §5.2.3: numbers only increase; of two lists of one number
                # the coordinator cannot tell which is the CA's newer word
                return f"it repeats CRL number {other.number} with other contents"
            return None
        if other.this_update < self.this_update:
            return (
                f"it was signed at {other.this_update:%Y-%m-%d %H:%M:%S} UTC, before "
                f"{self.this_update:%Y-%m-%d %H:%M:%S} UTC"
            )
        if other.this_update == self.this_update:
            return "it repeats the thisUpdate with other contents"
        return None

    def to_json(self) -> str:
        return json.dumps(
            {
                "ca_key": self.ca_key,
                "number": self.number,
                "this_update": self.this_update.isoformat(),
                "contents": self.contents,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> CrlStamp:
        """ValueError for anything but what :meth:`to_json` writes."""
        try:
            data = json.loads(text)
            ca_key, number, contents = data["ca_key"], data["number"], data["contents"]
            this_update = dt.datetime.fromisoformat(data["this_update"])
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"not a stored CRL stamp: {exc}") from None
        if not isinstance(ca_key, str) or not isinstance(contents, str):
            raise ValueError("not a stored CRL stamp: the CA key and contents are hex text")
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
            raise ValueError(f"not a stored CRL stamp: number {number!r}")
        if this_update.tzinfo is None:
            raise ValueError("not a stored CRL stamp: thisUpdate without a time zone")
        return cls(ca_key, number, this_update, contents)


def ca_key_digest(ca: x509.Certificate) -> str:
    """SHA-256 (hex) of the CA's SubjectPublicKeyInfo: which CA a :class:`CrlStamp` is of."""
    spki = ca.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(spki).hexdigest()


def _resign_hint(newest: CrlStamp) -> str:
    """How the CA signs a list the coordinator takes over ``newest``."""
    if newest.number is None:
        return "`spherecal certs crl --dir CA_DIR` signs one dated now"
    return f"`spherecal certs crl --dir CA_DIR --number {newest.number + 1}` or higher"


@dataclass(frozen=True)
class _ListInForce:
    serials: frozenset[int]
    stamp: CrlStamp
    next_update: dt.datetime | None


class RevocationList:
    """Revoked serial numbers from ``path``, kept current while the file changes."""

    def __init__(
        self,
        path: Path,
        ca_pem: bytes,
        *,
        report: Callable[[str], None] = lambda message: None,
        check_every_s: float = 1.0,
        newest_applied: CrlStamp | None = None,
        on_applied: Callable[[CrlStamp], None] = lambda stamp: None,
    ) -> None:
        """``newest_applied``: the stamp of the newest list applied before (the
        coordinator's store), below which the file may not go — ValueError at start,
        like a list the CA did not sign. ``on_applied`` is handed the stamp of each
        list applied, this one first (under the lock: keep it short)."""
        self.on_change: Callable[[frozenset[int]], None] | None = None
        """Called with the revoked serials each time a changed list is applied (outside
        the lock; set by the server, which also hands it the list at start)."""
        self.path = path
        self._ca = x509.load_pem_x509_certificate(ca_pem)
        self._report = report
        self._on_applied = on_applied
        self._check_every = check_every_s
        self._lock = threading.Lock()
        self._file = self._file_stamp()
        self._list = self._read()  # at start-up a bad CRL is an error
        if newest_applied is not None:
            older = newest_applied.why_older(self._list.stamp)
            if older is not None:
                raise ValueError(
                    f"{path}: {older}, the newest list this coordinator applied, so it may "
                    "un-revoke certificates revoked since; put the current list back, or "
                    f"have the CA sign a newer one ({_resign_hint(newest_applied)})"
                )
        on_applied(self._list.stamp)
        self._stale_reported = False
        self._unreadable_reported = False
        self._checked = time.monotonic()
        self._report_if_stale()

    def _file_stamp(self) -> tuple[int, int]:
        """The file's (mtime, size): a change to look at, not a list's place."""
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    def _read(self) -> _ListInForce:
        try:
            pem = self.path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read CRL {self.path}: {exc}") from None
        try:
            crl = load_verified_crl(pem, self._ca)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        return _ListInForce(
            serials=frozenset(entry.serial_number for entry in crl),
            stamp=CrlStamp(
                ca_key_digest(self._ca),
                crl_number(crl),
                crl.last_update_utc,
                hashlib.sha256(crl.tbs_certlist_bytes).hexdigest(),
            ),
            next_update=crl.next_update_utc,
        )

    def _report_if_stale(self, now: dt.datetime | None = None) -> None:
        """One WARNING per list in force once its ``nextUpdate`` has passed."""
        ends = self._list.next_update
        if self._stale_reported or ends is None:
            return
        now = now or dt.datetime.now(dt.UTC)
        if now < ends:
            return
        self._stale_reported = True
        self._report(
            f"WARNING: CRL {self.path} is past its nextUpdate ({ends:%Y-%m-%d %H:%M} UTC): "
            "it still applies, but revocations made since may be missing; sign it anew "
            "(`spherecal certs crl --dir CA_DIR`) or fetch the PKI's current list"
        )

    def _refresh(self) -> bool:
        """Re-read a changed file; True when a new list was applied."""
        now = time.monotonic()
        if now - self._checked < self._check_every:
            return False
        self._checked = now
        self._report_if_stale()
        try:
            stamp = self._file_stamp()
        except OSError as exc:
            if not self._unreadable_reported:  # once until it is readable again
                self._unreadable_reported = True
                self._report(
                    f"WARNING: CRL {self.path} unreadable ({exc}); keeping the last valid list"
                )
            return False
        self._unreadable_reported = False
        if stamp == self._file:
            return False
        self._file = stamp
        try:
            replacement = self._read()
        except ValueError as exc:
            self._report(f"WARNING: ignoring the changed CRL: {exc}; keeping the last valid list")
            return False
        older = self._list.stamp.why_older(replacement.stamp)
        if older is not None:
            self._report(
                f"WARNING: ignoring the changed CRL {self.path}: {older}, the list in force, "
                "so it may un-revoke certificates revoked since; keeping the last valid list "
                f"(to replace it: {_resign_hint(self._list.stamp)})"
            )
            return False
        added = len(replacement.serials - self._list.serials)
        self._list = replacement
        self._on_applied(replacement.stamp)
        self._stale_reported = False
        self._report(f"reloaded CRL {self.path}: {len(replacement.serials)} revoked ({added} new)")
        self._report_if_stale()
        return True

    @property
    def serials(self) -> frozenset[int]:
        with self._lock:
            changed = self._refresh()
            serials = self._list.serials
        if changed and self.on_change is not None:
            self.on_change(serials)
        return serials

    def is_revoked(self, serial_number: int) -> bool:
        return serial_number in self.serials

    def next_update(self) -> dt.datetime | None:
        """The ``nextUpdate`` of the list in force (after looking for a changed file),
        None for a list without one: what ``spherecal_crl_next_update_timestamp_seconds``
        exports, so that an operator is alerted before the list goes stale."""
        self.serials  # noqa: B018 — a scrape applies a changed list like a call
        with self._lock:
            return self._list.next_update
