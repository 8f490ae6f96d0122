"""Checks a service process runs before it does anything: files it will need exist,
directories it will write are writable, its own certificate and the CA file it trusts
are inside their validity windows.

A coordinator that finds its certificate missing only when it builds the server, or a
participant that learns its ``out_dir`` is unwritable after an hour of federation,
wastes everyone's time and ends in a traceback. These checks name the config key, so
the one-line error says what to fix (``spherecal COMMAND: error: ...``, exit 2).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from spherecal.outputs import check_output_dir

__all__ = [
    "EXPIRY_WARNING_DAYS",
    "PreflightError",
    "ca_window",
    "certificate_window",
    "check_coordinator",
    "check_participant",
]

EXPIRY_WARNING_DAYS = 14
"""A certificate that ends within this many days is valid, but starting with it gets a
``WARNING:`` line with its end date: renewing takes a request, the CA's operator and
a copy back, and a federation of many rounds may outlive it."""

#: What to do about an expired client certificate (a site's or the operator's); NAME
#: is the certificate's own name.
CLIENT_RENEWAL = (
    "ask the CA's operator for a new one: `spherecal certs request {name} --dir DIR` where "
    "its keys are (they are kept, and with them the identity key others pinned), then at "
    "the CA `spherecal certs issue {name} --dir CA --csr {name}.csr`"
)
#: The same for the coordinator's server certificate.
SERVER_RENEWAL = (
    "issue a new server certificate from the federation's CA for the names the sites dial "
    "(`spherecal certs init NEWDIR --host NAME` makes one only with a new CA, whose ca.pem "
    "every site then needs, with certificates it issued)"
)

#: What to do about a CA file with no certificate valid now (or one ending soon).
CA_RENEWAL = (
    "get the federation's current CA certificate from the CA's operator; a new CA means "
    "new certificates for the coordinator and every site (`spherecal certs init NEWDIR`, "
    "then `spherecal certs issue` from each site's request)"
)


class PreflightError(ValueError):
    """A configured file or directory that cannot be used (named by its config key)."""


def _required(source: str, tls: Any, keys: tuple[str, ...], plaintext: str) -> None:
    """Mutual TLS needs every one of ``keys`` in ``[tls]``: one unset used to surface
    only once the process was running (a coordinator had already created its state),
    as a line naming neither the file nor the key."""
    missing = [key for key in keys if getattr(tls, key) is None]
    if missing:
        named = ", ".join(f"[tls] {key}" for key in missing)
        raise PreflightError(
            f"{source}: {named} not set: mutual TLS needs [tls] {', '.join(keys)} (or {plaintext})"
        )


def _roster_fits_secure_aggregation(settings: Any, source: str) -> None:
    """A roster smaller than ``[secure_aggregation] min_participants`` can never run
    a secure job: the coordinator used to wait for every site, then fail each round
    ("too few participants at stage 'create'")."""
    secagg = settings.secagg
    kinds = [k for k in ("updates", "statistics", "evaluation") if getattr(secagg, k)]
    roster = len(settings.participants)
    if kinds and roster < secagg.min_participants:
        raise PreflightError(
            f"{source}: [federation] participants lists {roster} site(s), fewer than "
            f"[secure_aggregation] min_participants = {secagg.min_participants}: no secure "
            f"job ({', '.join(kinds)}) could ever run; list at least "
            f"{secagg.min_participants} sites (participants' default policy refuses jobs "
            "of fewer than 3)"
        )


def _readable(source: str, key: str, path: Path | None) -> None:
    if path is None:
        return
    if not path.exists():
        raise PreflightError(f"{source}: {key} = {str(path)!r}: file does not exist")
    if path.is_dir():
        raise PreflightError(f"{source}: {key} = {str(path)!r}: is a directory, not a file")
    if not os.access(path, os.R_OK):
        raise PreflightError(f"{source}: {key} = {str(path)!r}: permission denied")


def _crl_readable(source: str, path: Path | None) -> None:
    """``[tls] crl`` names the CA's list, which ``spherecal certs init`` writes (empty)
    since 2026-11-27; a CA made before has none until ``certs crl`` (or the first
    ``certs revoke``) writes it. A missing list is refused (a mistyped path must not
    start a coordinator that enforces no revocation), saying how it comes to be."""
    if path is not None and not path.exists():
        raise PreflightError(
            f"{source}: [tls] crl = {str(path)!r}: file does not exist; `spherecal certs "
            "init` writes CA_DIR/crl.pem with the CA, and for a CA without one `spherecal "
            "certs crl --dir CA_DIR` writes it (empty; `certs revoke NAME --dir CA_DIR` "
            "writes it too) — or check the path"
        )
    _readable(source, "[tls] crl", path)


def _ca_bundle(source: str, key: str, path: Path | None) -> None:
    """A CA file must hold at least one PEM certificate (gRPC would only say later that
    the handshake failed, or that the address is not local)."""
    if path is None:
        return
    from cryptography import x509

    try:
        found = x509.load_pem_x509_certificates(path.read_bytes())
    except ValueError as exc:
        raise PreflightError(
            f"{source}: {key} = {str(path)!r}: not a PEM certificate ({exc})"
        ) from None
    if not found:  # pragma: no cover - the loader raises on an empty bundle
        raise PreflightError(f"{source}: {key} = {str(path)!r}: no certificate in the file")


def _key_pair(source: str, section: str, cert: Path | None, key: Path | None) -> None:
    """``cert`` and ``key`` must be PEM and belong together: a key that does not match
    its certificate made gRPC print three C-core lines and then "cannot listen … is the
    address local?" (coordinator), or "cannot reach the coordinator" for ten minutes
    (participant) — both the wrong diagnosis."""
    if cert is None or key is None:
        return
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
    )

    try:
        certificate = x509.load_pem_x509_certificates(cert.read_bytes())[0]
    except ValueError as exc:
        raise PreflightError(
            f"{source}: {section} cert = {str(cert)!r}: not a PEM certificate ({exc})"
        ) from None
    try:
        private = load_pem_private_key(key.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise PreflightError(
            f"{source}: {section} key = {str(key)!r}: not an unencrypted PEM private key ({exc})"
        ) from None

    def spki(public: Any) -> bytes:
        return bytes(public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo))

    if spki(certificate.public_key()) != spki(private.public_key()):
        subject = certificate.subject.rfc4514_string()
        raise PreflightError(
            f"{source}: {section} key = {str(key)!r} does not belong to {section} cert = "
            f"{str(cert)!r} ({subject}): use the key issued with that certificate"
        )


def _current_format(source: str, cert: Path | None) -> None:
    """A participant certificate from before issue #26 (its identity key under an OID
    Go cannot parse) is refused here, at the site, with the line saying to re-issue
    it — not only by the coordinator at join."""
    if cert is None:
        return
    from cryptography import x509

    from spherecal.proto.identity import CertificateError, identity_key_from_certificate

    try:
        identity_key_from_certificate(x509.load_pem_x509_certificates(cert.read_bytes())[0])
    except CertificateError as exc:
        raise PreflightError(f"{source}: [tls] cert = {str(cert)!r}: {exc}") from None


def _when(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def certificate_window(
    what: str, path: Path | None, renewal: str, *, now: dt.datetime | None = None
) -> str | None:
    """Refuse a certificate outside its validity window; return a ``WARNING:`` line
    when it ends within :data:`EXPIRY_WARNING_DAYS`, else ``None``.

    Why at start: a TLS peer refuses an expired (or not yet valid) certificate in the
    handshake, before any call, and says nothing the holder can read — a site retried
    "Socket closed" for ``give_up_s`` and the coordinator's log held nothing. ``what``
    names the setting (``p.toml: [tls] cert``), ``renewal`` says how to get a new one
    (``{name}`` is filled with the certificate's common name)."""
    if path is None:
        return None
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificates(path.read_bytes())[0]
    except (OSError, ValueError):
        return None  # unreadable: the file checks name it
    now = now or dt.datetime.now(dt.UTC)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = str(names[0].value) if names else "NAME"
    todo = renewal.format(name=name)
    label = f"{what} = {str(path)!r}"
    window = f"valid {_when(start)} to {_when(end)}"
    if now > end:
        raise PreflightError(
            f"{label} expired on {_when(end)} ({window}): a TLS peer refuses it in the "
            f"handshake, before any call; {todo}"
        )
    if now < start:
        raise PreflightError(
            f"{label} is not valid until {_when(start)} ({window}; this machine's clock "
            f"says {_when(now)}): a TLS peer refuses it in the handshake; check this "
            f"machine's clock, or {todo}"
        )
    left = end - now
    if left <= dt.timedelta(days=EXPIRY_WARNING_DAYS):
        return (
            f"WARNING: {label} expires on {_when(end)}, in "
            f"{left.total_seconds() / 86400:.1f} days (less than {EXPIRY_WARNING_DAYS}); "
            f"renew it before then: {todo}"
        )
    return None


def _outside(cert: Any, now: dt.datetime) -> str | None:
    """How ``cert`` is outside its validity window at ``now`` (``expired on …``, ``is
    not valid until …``), or ``None`` when it is inside."""
    if now > cert.not_valid_after_utc:
        return f"expired on {_when(cert.not_valid_after_utc)}"
    if now < cert.not_valid_before_utc:
        return f"is not valid until {_when(cert.not_valid_before_utc)}"
    return None


def _window(cert: Any) -> str:
    return f"(valid {_when(cert.not_valid_before_utc)} to {_when(cert.not_valid_after_utc)})"


def ca_window(what: str, path: Path | None, *, now: dt.datetime | None = None) -> list[str]:
    """Refuse a CA file with no certificate that can verify now; return ``WARNING:``
    lines for those of a bundle that cannot while others can, and for a usable one
    that ends within :data:`EXPIRY_WARNING_DAYS`.

    Why at start: TLS verifies a peer's chain up to a CA certificate of this file, and
    an expired (or not yet valid) CA fails every handshake exactly as an expired own
    certificate does — the peer refuses, or this side refuses the peer, and nobody
    reads why. A development CA of ``spherecal certs init`` ends the day its server
    certificate does.

    A bundle (several CA certificates in one file: the old and the new CA while a
    federation changes CA, a PKI's roots) is refused only when *none* of its
    certificates can verify: one that can still verifies what it issued, and an ended
    one beside it is what a change-over leaves until the file is tidied — a warning
    naming it. "Can verify" is the TLS library's rule, not only the dates: gRPC's
    (BoringSSL) looks an issuer up by name and takes the *first* CA certificate of that
    name in the file, expired or not (checked against the installed grpcio in
    ``tests/unit/spherecal/test_preflight.py``) — and every ``certs init`` CA is named
    "spherecal dev CA". So a valid CA after an ended one of the same name verifies
    nothing either; the line says to put it first. ``what`` names the setting
    (``p.toml: [tls] ca``); each certificate is named by its subject and dates."""
    if path is None:
        return []
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return []  # unreadable: the file checks name it
    now = now or dt.datetime.now(dt.UTC)
    label = f"{what} = {str(path)!r}"
    first: dict[bytes, Any] = {}
    for cert in certs:
        first.setdefault(cert.subject.public_bytes(), cert)

    def name(cert: Any) -> str:
        return str(cert.subject.rfc4514_string())

    outside = [f"{name(c)} {how} {_window(c)}" for c in certs if (how := _outside(c, now))]
    valid = [c for c in certs if _outside(c, now) is None]
    usable = [c for c in valid if first[c.subject.public_bytes()] is c]
    shadowed = []
    for cert in valid:
        earlier = first[cert.subject.public_bytes()]
        if earlier is not cert:
            how = _outside(earlier, now)
            shadowed.append(
                f"{name(cert)} {_window(cert)} comes after another CA certificate of that "
                f"name, {'which ' + how if how else 'valid too'}, and TLS takes the first"
            )
    if not usable:
        if shadowed:
            todo = (
                "put the valid CA certificate first in the file, or remove the ended one "
                "(TLS looks an issuer up by name and takes the first of that name)"
            )
        elif any("not valid until" in line for line in outside):
            todo = f"check this machine's clock (it says {_when(now)}), or {CA_RENEWAL}"
        else:
            todo = CA_RENEWAL
        held = (
            "the CA certificate"
            if len(certs) == 1
            else f"none of its {len(certs)} CA certificates can verify now:"
        )
        raise PreflightError(
            f"{label}: {held} {'; '.join(outside + shadowed)}: every TLS handshake "
            f"verified against this file fails, before any call; {todo}"
        )
    warnings: list[str] = []
    if outside:
        one = len(outside) == 1
        warnings.append(
            f"WARNING: {label}: {len(outside)} of its {len(certs)} CA certificates "
            f"{'is' if one else 'are'} outside {'its' if one else 'their'} validity window: "
            f"{'; '.join(outside)}; certificates issued only by {'it' if one else 'them'} "
            f"are refused (remove {'it' if one else 'them'} from the file when no site "
            f"needs {'it' if one else 'them'})"
        )
    if shadowed:
        warnings.append(
            f"WARNING: {label}: CA certificate {'; '.join(shadowed)}: certificates issued "
            "by it are refused unless they name its key (an authority key identifier, which "
            "spherecal certs does not write); put the CA your certificates come from first"
        )
    ending = [
        c for c in usable if c.not_valid_after_utc - now <= dt.timedelta(days=EXPIRY_WARNING_DAYS)
    ]
    if ending:
        named = "; ".join(
            f"{name(c)} expires on {_when(c.not_valid_after_utc)}, in "
            f"{(c.not_valid_after_utc - now).total_seconds() / 86400:.1f} days"
            for c in ending
        )
        them = "it" if len(ending) == 1 else "them"
        then = (
            f"certificates issued only by {them} fail from then on (the file's other CA "
            "certificates stay valid)"
            if len(usable) > len(ending)
            else f"every TLS handshake verified against this file fails from then on; {CA_RENEWAL}"
        )
        warnings.append(
            f"WARNING: {label}: CA certificate {named} (less than {EXPIRY_WARNING_DAYS}); {then}"
        )
    return warnings


def _certified_identity(source: str, settings: Any) -> None:
    """The identity key is the one ``[tls] cert`` binds, for this site (the check
    every start makes, :func:`spherecal.participant.enrolment.check_certified`), run
    before the pinning check: a key that is not the certificate's used to be told to
    share its pin line with the other sites. A key that does not exist is left to
    :func:`~spherecal.participant.enrolment.load_or_enrol`, which says where it comes
    from."""
    from spherecal.participant.enrolment import check_certified
    from spherecal.proto.identity import load_identity_key, public_key_bytes

    try:  # missing or unreadable: named by load_or_enrol and the file checks
        own = public_key_bytes(load_identity_key(settings.identity_path))
    except (OSError, ValueError, TypeError):
        return
    try:
        check_certified(settings, own)
    except ValueError as exc:
        raise PreflightError(f"{source}: {exc}") from None


def _pinning(source: str, settings: Any) -> None:
    """The members a site under TLS pins (``[tls] peer_keys``, well formed and naming
    this site under its identity key when that key exists yet), or its explicit
    ``[policy] trust_ca_for_members``: the site's own start-up check, run here so
    that ``spherecal participant`` says it with the other configuration mistakes."""
    from spherecal.participant.trust import check_pinning
    from spherecal.proto.identity import load_identity_key, public_key_bytes

    try:  # an unreadable key is named by the check of [participant] identity_key
        own: bytes | None = public_key_bytes(load_identity_key(settings.identity_path))
    except (OSError, ValueError):
        own = None
    try:
        check_pinning(settings, own)
    except ValueError as exc:
        raise PreflightError(f"{source}: {exc}") from None


def check_participant(settings: Any, source: str) -> list[str]:
    """TLS files (unless ``insecure``: set, present, parseable, the key matching its
    certificate, inside its validity window, binding this site's identity key; the CA
    file holding a certificate valid now), the members the site pins, the data files
    and ``out_dir``. Returns the ``WARNING:`` lines to log at start (a certificate or
    CA that ends soon, a CA of a bundle that has ended)."""
    warnings: list[str] = []
    if not settings.insecure:
        tls = settings.tls
        _required(
            source,
            tls,
            ("ca", "cert", "key"),
            "[participant] insecure = true, loopback coordinators only",
        )
        for key in ("ca", "cert", "key"):
            _readable(source, f"[tls] {key}", getattr(tls, key))
        _ca_bundle(source, "[tls] ca", tls.ca)
        _key_pair(source, "[tls]", tls.cert, tls.key)
        _current_format(source, tls.cert)
        soon = certificate_window(f"{source}: [tls] cert", tls.cert, CLIENT_RENEWAL)
        warnings += [soon] if soon else []
        warnings += ca_window(f"{source}: [tls] ca", tls.ca)
        _certified_identity(source, settings)
        _pinning(source, settings)
    if settings.identity_key is not None and settings.identity_key.exists():
        _readable(source, "[participant] identity_key", settings.identity_key)
    data = settings.data
    if data.dataset == "npz" and data.root is not None:
        _readable(source, "[data] root", Path(data.root))
    if data.test_root is not None:
        _readable(source, "[data] test_root", Path(data.test_root))
    if settings.out_dir is not None:
        try:
            check_output_dir(settings.out_dir, what="[participant] out_dir")
        except ValueError as exc:
            raise PreflightError(f"{source}: {exc}") from None
    return warnings


def check_coordinator(settings: Any, source: str) -> list[str]:
    """TLS files (unless ``insecure``: set, present, parseable, the key matching its
    certificate, the certificate inside its validity window, ``client_ca`` holding a
    certificate valid now), a roster large enough for secure aggregation, and
    ``out_dir``. Returns the ``WARNING:`` lines to log at start (a server certificate
    or CA that ends soon, a CA of a bundle that has ended)."""
    warnings: list[str] = []
    if not settings.server.insecure:
        tls = settings.tls
        _required(
            source,
            tls,
            ("cert", "key", "client_ca"),
            "[server] insecure = true, loopback addresses only",
        )
        for key in ("cert", "key", "client_ca"):
            _readable(source, f"[tls] {key}", getattr(tls, key))
        _crl_readable(source, tls.crl)
        _ca_bundle(source, "[tls] client_ca", tls.client_ca)
        _key_pair(source, "[tls]", tls.cert, tls.key)
        soon = certificate_window(f"{source}: [tls] cert", tls.cert, SERVER_RENEWAL)
        warnings += [soon] if soon else []
        warnings += ca_window(f"{source}: [tls] client_ca", tls.client_ca)
    _roster_fits_secure_aggregation(settings, source)
    try:
        check_output_dir(settings.out_dir, what="[federation] out_dir")
    except ValueError as exc:
        raise PreflightError(f"{source}: {exc}") from None
    return warnings
