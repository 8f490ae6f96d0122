"""Checking the identity directory the coordinator hands out with every job.

``crypto.SecAggParticipant`` verifies its peers' key advertisements with their
long-term Ed25519 keys, and its docstring is blunt about where those keys must come
from: the deployment's trust root, *not* the coordinator — otherwise a malicious
coordinator substitutes its own keys and strips a participant's masks.

Under mutual TLS the trust root is the federation CA: each directory entry carries
the participant's certificate, and this module accepts an entry only if the
certificate is signed by the CA this participant trusts, is currently valid, names
the entry's participant id, and binds exactly the entry's Ed25519 key (its
``urn:spherecal:ed25519:`` URI SAN, ``spherecal.proto.identity``; a certificate in
the old format is refused with a line saying to re-issue it). On loopback
``--insecure`` simulations there is no CA and the directory is taken as given —
acceptable only because everything runs on one host.

Whoever holds the CA key can issue a certificate for any name, and so add members to
a job, or replace one, whose inputs it knows; the sum of such a job less their inputs
is one site's input. Where the CA key sits with the coordinator's operator (the
deployment guide's development CA), the CA alone is no independent trust root. A
site closes that with ``[tls] peer_keys``: the federation's members and their
Ed25519 identity keys, exchanged among the sites outside the coordinator
(``spherecal certs pin``). Every directory entry this participant checks must then
name a pinned member and carry exactly its pinned key (:func:`load_peer_keys`).

Only the entries a participant needs are checked: the coordinator sends each
participant the entries of the parties whose signatures it verifies
(``crypto.keys_needed``), and a directory carrying more (an older coordinator's
whole directory) costs no extra certificate verification.
"""

from __future__ import annotations

import datetime as dt
import hmac
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import (
    CertificateError,
    certificate_identity,
    identity_key_from_certificate,
)

__all__ = ["DirectoryTrust", "UntrustedDirectory", "load_peer_keys", "pin_line"]


class UntrustedDirectory(ValueError):
    """A directory entry the participant cannot verify against its trust root."""


def pin_line(participant_id: str, identity_public_key: bytes) -> str:
    """One line of a ``[tls] peer_keys`` file: ``NAME HEX`` (the 32-byte Ed25519 key)."""
    return f"{participant_id} {identity_public_key.hex()}"


def load_peer_keys(path: Path) -> dict[str, bytes]:
    """The ``[tls] peer_keys`` file: ``{participant id: Ed25519 public key}``.

    One member per line, ``NAME HEX`` (as :func:`pin_line` writes it; what
    ``spherecal certs pin`` prints); blank lines and ``#`` comments are skipped. A
    malformed line, a key of another length or a name listed twice is a
    ``ValueError`` naming the file and the line."""
    pins: dict[str, bytes] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"[tls] peer_keys = {str(path)!r}: cannot read it ({exc})") from None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"[tls] peer_keys = {str(path)!r}, line {number}"
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{where}: expected `NAME HEX` (what `spherecal certs pin` prints)")
        name, hexed = parts
        try:
            key = bytes.fromhex(hexed)
        except ValueError:
            raise ValueError(f"{where}: the key of {name!r} is not hexadecimal") from None
        if len(key) != 32:
            raise ValueError(f"{where}: the key of {name!r} has {len(key)} bytes, not 32 (Ed25519)")
        if name in pins:
            raise ValueError(f"{where}: {name!r} is listed twice")
        pins[name] = key
    if not pins:
        raise ValueError(f"[tls] peer_keys = {str(path)!r}: no member listed")
    return pins


class DirectoryTrust:
    def __init__(self, ca_pem: bytes | None, *, pins: Mapping[str, bytes] | None = None) -> None:
        self._ca = x509.load_pem_x509_certificate(ca_pem) if ca_pem else None
        self._pins = dict(pins) if pins is not None else None
        """``[tls] peer_keys``: the only members and keys accepted (``None``: any the
        CA issued)."""

    @property
    def verifies_certificates(self) -> bool:
        return self._ca is not None

    def verify(
        self, entries: Sequence[pb.DirectoryEntry], participants: Collection[str]
    ) -> dict[str, bytes]:
        """``{participant: Ed25519 public key}`` for every id in ``participants``,
        verified — the ids whose signatures this participant checks in the job
        (``crypto.keys_needed``: on a Harary graph its 2-hop neighbourhood, O(log n)
        of the n). A needed entry that is missing, listed twice or fails its
        certificate check is :class:`UntrustedDirectory`; entries for anyone else
        are ignored — not verified (no certificate parsed) and not returned."""
        wanted = participants if isinstance(participants, (set, frozenset)) else set(participants)
        by_id: dict[str, pb.DirectoryEntry] = {}
        for entry in entries:
            pid = entry.participant_id
            if pid not in wanted:
                continue
            if pid in by_id:
                raise UntrustedDirectory(f"directory lists {pid!r} twice")
            by_id[pid] = entry
        out: dict[str, bytes] = {}
        for pid in sorted(wanted):
            found = by_id.get(pid)
            if found is None:
                raise UntrustedDirectory(
                    f"directory has no entry for job participant {pid!r}, whose signatures "
                    "this participant checks"
                )
            key = bytes(found.identity_public_key)
            if len(key) != 32:
                raise UntrustedDirectory(f"directory key of {pid!r} is not an Ed25519 key")
            if self._ca is not None:
                self._check_certificate(pid, key, bytes(found.certificate_pem))
            if self._pins is not None:
                self._check_pinned(pid, key)
            out[pid] = key
        return out

    def _check_pinned(self, pid: str, key: bytes) -> None:
        assert self._pins is not None
        pinned = self._pins.get(pid)
        if pinned is None:
            raise UntrustedDirectory(
                f"{pid!r} is not a member pinned in [tls] peer_keys: a job with a member "
                "the sites did not agree on may be one whose other inputs the coordinator "
                "knows"
            )
        if not hmac.compare_digest(pinned, key):
            raise UntrustedDirectory(
                f"the identity key of {pid!r} is not the one pinned for it in [tls] "
                "peer_keys (a certificate for that name with another key)"
            )

    def _check_certificate(self, pid: str, key: bytes, pem: bytes) -> None:
        assert self._ca is not None
        if not pem:
            raise UntrustedDirectory(f"directory entry of {pid!r} carries no certificate")
        try:
            cert = x509.load_pem_x509_certificate(pem)
            cert.verify_directly_issued_by(self._ca)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise UntrustedDirectory(
                f"certificate of {pid!r} is not issued by this federation's CA ({exc})"
            ) from None
        now = dt.datetime.now(dt.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise UntrustedDirectory(f"certificate of {pid!r} is expired or not yet valid")
        try:
            named = certificate_identity(cert)
            bound = identity_key_from_certificate(cert)
        except CertificateError as exc:
            raise UntrustedDirectory(f"certificate of {pid!r}: {exc}") from None
        if named != pid:
            raise UntrustedDirectory(f"certificate for {named!r} was offered as {pid!r}")
        if bound != key:
            raise UntrustedDirectory(f"directory key of {pid!r} differs from its certificate")
