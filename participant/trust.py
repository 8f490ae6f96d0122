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
The CA cannot tell a site who holds its key, so pinning is the default: a site under
TLS without the file refuses to start (:class:`MembersNotPinned`) unless its operator
states that the CA's key is held independently of the coordinator (``[policy]
trust_ca_for_members``, logged as a weakening) — :func:`site_directory_trust`.

Only the entries a participant needs are checked: the coordinator sends each
participant the entries of the parties whose signatures it verifies
(``crypto.keys_needed``), and a directory carrying more (an older coordinator's
whole directory) costs no extra certificate verification.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import (
    CertificateError,
    certificate_binding,
)

if TYPE_CHECKING:
    from spherecal.participant.settings import ParticipantSettings

__all__ = [
    "DirectoryTrust",
    "MembersNotPinned",
    "UntrustedDirectory",
    "check_pinning",
    "load_peer_keys",
    "pin_line",
    "pins_fingerprint",
    "site_directory_trust",
]

PINNING_GUIDE = "docs/deployment.md, 'Pinning the members'"


class UntrustedDirectory(ValueError):
    """A directory entry the participant cannot verify against its trust root."""


class MembersNotPinned(ValueError):
    """A site under TLS was started without ``[tls] peer_keys`` and without the
    explicit ``[policy] trust_ca_for_members`` (or with both): bad configuration,
    refused before the site joins anything."""


def pin_line(participant_id: str, identity_public_key: bytes) -> str:
    """One line of a ``[tls] peer_keys`` file: ``NAME HEX`` (the 32-byte Ed25519 key)."""
    return f"{participant_id} {identity_public_key.hex()}"


def pins_fingerprint(pins: Mapping[str, bytes]) -> str:
    """A short code for a whole member list, for the sites to compare over a second
    channel (read aloud: five groups of four hex digits, 80 bits) instead of every
    64-digit key: two files with the same members and keys, in any order, with any
    comments, have the same code, and a list that differs in one member or one key bit
    has another. SHA-256 over the sorted ``NAME HEX`` lines, domain-separated; 80 bits
    leave finding a second list with a chosen code at ≈ 2^80 hashes."""
    h = hashlib.sha256(b"spherecal peer_keys fingerprint v1\n")
    for name in sorted(pins):
        h.update(pin_line(name, pins[name]).encode() + b"\n")
    code = h.hexdigest()[:20]
    return "-".join(code[i : i + 4] for i in range(0, 20, 4))


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

    @property
    def pinned(self) -> dict[str, bytes] | None:
        """The members and keys pinned in ``[tls] peer_keys`` (``None``: not pinned)."""
        return dict(self._pins) if self._pins is not None else None

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
            named, bound = certificate_binding(cert)
        except CertificateError as exc:
            raise UntrustedDirectory(f"certificate of {pid!r}: {exc}") from None
        if named != pid:
            raise UntrustedDirectory(f"certificate for {named!r} was offered as {pid!r}")
        if bound != key:
            raise UntrustedDirectory(f"directory key of {pid!r} differs from its certificate")


def site_directory_trust(
    settings: ParticipantSettings, own_key: bytes, say: Callable[[str], None]
) -> DirectoryTrust:
    """The trust a site puts in the directory the coordinator hands out, from its
    settings: on loopback ``insecure`` none (the directory as given); under TLS the
    CA and, by default, the members pinned in ``[tls] peer_keys`` — this site among
    them under its own identity key ``own_key``. Without the file the site starts
    only if ``[policy] trust_ca_for_members`` says the CA alone decides. Refusals are
    :func:`check_pinning`'s, raised before any data is loaded or any call is made."""
    if settings.insecure:
        return DirectoryTrust(None)
    pins = check_pinning(settings, own_key)
    ca = settings.tls.ca.read_bytes() if settings.tls.ca else None
    if pins is None:
        say("peers are trusted as the federation's CA issued them ([policy] trust_ca_for_members)")
        return DirectoryTrust(ca)
    say(
        f"peers pinned: {len(pins)} members from {settings.tls.peer_keys} "
        f"(fingerprint {pins_fingerprint(pins)}: the same at every site)"
    )
    return DirectoryTrust(ca, pins=pins)


def check_pinning(settings: ParticipantSettings, own_key: bytes | None) -> dict[str, bytes] | None:
    """The pinned members of a site under TLS (``None``: the CA alone decides, as
    its ``[policy] trust_ca_for_members`` says), or :class:`MembersNotPinned` — no
    ``[tls] peer_keys`` and no such statement, both at once, or a file that does not
    pin this site under ``own_key`` (made for someone else, or before a key change;
    checked when the key is known: the start-up preflight, :mod:`spherecal.preflight`,
    may run before the site's first enrolment) — or the ``ValueError`` of
    :func:`load_peer_keys` for a malformed file."""
    path = settings.tls.peer_keys
    trust_ca = settings.policy.trust_ca_for_members
    pid = settings.participant_id
    if path is None:
        if trust_ca:
            return None
        own = f" (this site's: `{pin_line(pid, own_key)}`)" if own_key is not None else ""
        raise MembersNotPinned(
            "[tls] peer_keys is not set: whoever holds the federation CA's key could "
            "add members whose inputs it knows to this site's jobs and read its input "
            "from the sum. Pin the members the sites agreed on: each site prints its "
            f"line with `spherecal certs pin NAME --identity-key FILE`{own}, every site "
            "writes all of them to one file and sets [tls] peer_keys to it. Only where "
            "the CA's key is held independently of the coordinator's operator, set "
            f"[policy] trust_ca_for_members = true instead ({PINNING_GUIDE})"
        )
    if trust_ca:
        raise MembersNotPinned(
            f"[tls] peer_keys = {str(path)!r} pins the members while [policy] "
            "trust_ca_for_members = true says the CA alone decides: remove one of the two"
        )
    pins = load_peer_keys(path)
    if own_key is not None and pins.get(pid) != own_key:
        raise MembersNotPinned(
            f"[tls] peer_keys = {str(path)!r} does not pin this site ({pid!r}) with its own "
            f"identity key: add the line `{pin_line(pid, own_key)}` and share it with the "
            "other sites"
        )
    return pins
