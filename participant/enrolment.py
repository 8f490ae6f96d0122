"""A site's identity key: loaded, or created once — never silently replaced.

Why strict: the coordinator pins each participant's Ed25519 identity key at its first
join, and with mutual TLS the certificate binds it. A key created anew because a
configured path has a typo (or a state directory lost its key) is a *different*
identity: the site is refused later with a message that names neither the path nor
the key. So a key is created only

- by ``spherecal participant --config FILE --init`` (first enrolment, explicit), or
- on the very first start of a site that configured no ``identity_key`` and whose
  ``state_dir`` holds no history yet (the default ``state_dir/identity.key``: what a
  simulation's throwaway sites and a first ``spherecal participant`` run need);

and a configured ``identity_key`` that does not exist, or a missing default key beside
an existing history, is a one-line error naming the path and the config key.

Under mutual TLS neither creates a key: the site's certificate binds its identity key
(a ``urn:spherecal:ed25519:`` URI SAN), and that key is the one ``spherecal certs
request`` wrote beside the TLS key when it made the certificate's request. A key made
here would be a different one — the coordinator refuses its joins, and the pinning
check told the engineer to share a pin line for it. So under TLS a missing key says
where the right one comes from, ``--init`` refuses to make one, and every start checks
that the key is the one the certificate binds (:func:`check_certified`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal.crypto import generate_identity
from spherecal.participant.settings import ParticipantSettings
from spherecal.proto.identity import (
    certificate_binding,
    load_identity_key,
    public_key_bytes,
    save_identity_key,
)

__all__ = [
    "IdentityMissing",
    "IdentityNotCertified",
    "check_certified",
    "enrol",
    "key_fingerprint",
    "load_or_enrol",
]

#: Files a site writes into its state directory once it has taken part in anything.
HISTORY = ("jobs.db", "privacy.db")


class IdentityMissing(ValueError):
    """The identity key a site must already have is not there (exit status 2)."""


class IdentityNotCertified(ValueError):
    """Under mutual TLS, the site's identity key is not the one its certificate binds
    (or the certificate is not this site's): every join would be refused (exit
    status 2)."""


def key_fingerprint(public_key: bytes) -> str:
    """The first 16 hex digits of an Ed25519 public key, as ``spherecal certs pins``
    shows it: enough to tell two keys apart in a one-line error."""
    return f"{public_key.hex()[:16]}…"


def _uses_tls(settings: ParticipantSettings) -> bool:
    """A site with a client certificate: the certificate binds its identity key (a
    site under TLS without ``[tls] cert`` is refused by the start-up checks anyway)."""
    return not settings.insecure and settings.tls.cert is not None


def _key_setting(settings: ParticipantSettings) -> str:
    """How the configuration names the key: the key, or the default it falls back to."""
    path = str(settings.identity_path)
    if settings.identity_key is not None:
        return f"[participant] identity_key = {path!r}"
    return f"the identity key {path!r} ([participant] identity_key unset: state_dir/identity.key)"


def _from_request(settings: ParticipantSettings) -> str:
    """Where a TLS site's identity key comes from (the hint of every refusal here)."""
    pid = settings.participant_id
    return (
        f"the {pid}.identity.key that `spherecal certs request {pid} --dir DIR` wrote "
        f"beside {pid}.key — the key [tls] cert binds"
    )


def check_certified(settings: ParticipantSettings, public_key: bytes) -> None:
    """Under mutual TLS: ``[tls] cert`` is issued for this participant and binds exactly
    ``public_key`` (the coordinator refuses a join otherwise, as UNAUTHENTICATED or
    PERMISSION_DENIED the site could only retry), else :class:`IdentityNotCertified`
    naming both keys. Nothing to check without TLS or without a certificate."""
    cert_path = settings.tls.cert
    if not _uses_tls(settings) or cert_path is None:
        return
    cert = x509.load_pem_x509_certificates(cert_path.read_bytes())[0]
    named, bound = certificate_binding(cert)  # CertificateError: the old format
    where = f"[tls] cert = {str(cert_path)!r}"
    pid = settings.participant_id
    if named != pid:
        raise IdentityNotCertified(
            f"{where} is issued for {named!r}, not for this site {pid!r}: use this site's "
            f"certificate ({pid}.pem, from `spherecal certs issue {pid} --csr {pid}.csr`)"
        )
    if bound is None:
        raise IdentityNotCertified(
            f"{where} binds no spherecal identity key (no urn:spherecal:ed25519: URI SAN), "
            "so the coordinator refuses it; have it issued from this site's request "
            f"(`spherecal certs request {pid}`, then `spherecal certs issue {pid} --csr`)"
        )
    if bound != public_key:
        raise IdentityNotCertified(
            f"{_key_setting(settings)} is key {key_fingerprint(public_key)}, but {where} "
            f"binds key {key_fingerprint(bound)}: the coordinator would refuse every join. "
            f"Point [participant] identity_key at {_from_request(settings)}, not a key made "
            "by --init; if that key is lost, request a certificate for a new one and ask the "
            "coordinator's operator to unpin this site"
        )


def _has_history(state_dir: Path) -> bool:
    return any((state_dir / name).exists() for name in HISTORY)


def enrol(settings: ParticipantSettings) -> tuple[Path, bool]:
    """Create the site's identity key if it has none (``--init``); returns its path and
    whether it was created. An existing key is kept, never overwritten. Under mutual
    TLS nothing is created (:class:`IdentityMissing`: the key comes with the
    certificate's request), and an existing key must be the one the certificate binds
    (:class:`IdentityNotCertified`): ``--init`` gets no site past the start check."""
    path = settings.identity_path
    if path.exists():
        key = load_identity_key(path)  # a damaged file is an error here, not at the first join
        check_certified(settings, public_key_bytes(key))
        return path, False
    if _uses_tls(settings):
        raise IdentityMissing(
            f"{_key_setting(settings)} does not exist, and --init makes no key for a site "
            "under mutual TLS (its certificate would not bind it): set [participant] "
            f"identity_key to {_from_request(settings)}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    save_identity_key(generate_identity(), path)
    return path, True


def load_or_enrol(settings: ParticipantSettings, say: Callable[[str], None]) -> Ed25519PrivateKey:
    """The site's identity for a run (see the module docstring for when one is created);
    under mutual TLS, checked against the certificate (:func:`check_certified`)."""
    path = settings.identity_path
    if path.exists():
        identity = load_identity_key(path)
        check_certified(settings, public_key_bytes(identity))
        return identity
    if _uses_tls(settings):
        raise IdentityMissing(
            f"{_key_setting(settings)} does not exist: under mutual TLS set it to "
            f"{_from_request(settings)} (`spherecal participant --init` would make another "
            "key, one the certificate does not bind)"
        )
    if settings.identity_key is not None:
        raise IdentityMissing(
            f"identity_key {path} does not exist ([participant] identity_key); correct the "
            "path, or create this site's identity once with "
            "`spherecal participant --config FILE --init`"
        )
    if _has_history(settings.state_dir):
        raise IdentityMissing(
            f"{path} is missing but {settings.state_dir} holds this site's history: the "
            "coordinator has pinned its old key. Restore identity.key from a backup, or "
            "enrol anew with `spherecal participant --config FILE --init` and ask the "
            "coordinator's operator to unpin this participant"
        )
    identity = generate_identity()
    save_identity_key(identity, path)
    say(f"first start: created identity key {path}")
    return identity
