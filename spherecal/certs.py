"""A throwaway certificate authority for trying spherecal with mutual TLS.

``spherecal certs init DIR`` makes a CA and a coordinator (server) certificate;
``spherecal certs request NAME --dir DIR``, run *at the site*, makes the site's TLS
key and Ed25519 identity key there and a certificate request naming both public keys;
``spherecal certs issue NAME --dir CA --csr FILE`` certifies such a request, and
``spherecal certs issue NAME --dir CA`` alone makes the keys at the CA (a quick trial:
the CA's holder then holds every site's keys). The certificate binds the two: its CN (and a
``spiffe://spherecal/participant/NAME`` URI SAN) is the participant id, and a second
URI SAN ``urn:spherecal:ed25519:HEX`` carries the identity public key
(``spherecal.proto.identity``), so every participant can check its peers'
secure-aggregation keys against the CA instead of trusting the coordinator. Only
standard fields and OIDs with small arcs: Go, Java, Node and rustls load every file
this module writes (``tests/interop/`` checks it with Go's standard library).

Why requests: a site's identity key signs its secure-aggregation keys, and the sites
pin each other's identity keys (``[tls] peer_keys``) so that whoever holds the CA key
cannot seat members of its own beside them. That holds only if nobody else ever held
a site's identity private key — so a site makes its keys itself and sends the CA only
the request (its public keys, signed by its TLS key); the CA's holder, often the
coordinator's operator, never sees them. For production, issue the same shape of
certificates from the federation's own PKI; the CA private key (``ca.key``) never
needs to leave the operator's machine.

Files (private keys are written with mode 0600):

``ca.pem``/``ca.key``           the CA (give ``ca.pem`` to everyone)
``server.pem``/``server.key``   the coordinator, valid for the given host names / IPs
``NAME.pem``/``NAME.key``       participant NAME's TLS client certificate and key
``NAME.identity.key``           participant NAME's Ed25519 identity key
``NAME.csr``                    participant NAME's certificate request (``request``)
``crl.pem``                     the CA's revocation list: empty from ``init``, each
                                ``spherecal certs revoke`` adds a certificate

A certificate never outlives the CA that signs it: TLS verifies the whole chain at
each handshake, so past the CA's end a certificate it issued verifies nowhere, and an
expired (or not yet valid) CA signs only certificates every peer refuses. ``issue``,
``revoke`` and ``crl`` therefore refuse a CA outside its validity window (one line naming
``ca.pem`` and its dates), and ``issue`` refuses a ``--days`` that would end after the
CA does, naming the longest ``--days`` possible; without ``--days`` a certificate is
valid for :data:`DEFAULT_DAYS`, or until the CA ends if that is sooner.

Revoking (a stolen key, a participant leaving): ``spherecal certs revoke NAME --dir
DIR`` adds NAME's current certificate to ``crl.pem``, signed by the CA; a coordinator
with ``[tls] crl`` pointing at it refuses that certificate from its next call on.
``init`` writes an empty ``crl.pem`` beside the CA (2026-11-27), so that the
coordinator's ``[tls] crl`` can name it from the first day: the coordinator re-reads
the file when it changes, and the first revocation then needs no restart (before, the
file came to be only at the first ``revoke``, and a coordinator refuses to start on a
``[tls] crl`` that does not exist). ``spherecal certs crl --dir DIR`` writes the list
anew, keeping its entries — an empty one for a CA made before ``init`` wrote it, or a
fresh lifetime for a list about to end. Each list carries a CRL number one above the
list it replaces and the CA's key identifier (RFC 5280 §5.2, since 2026-11-27): the
number is how a coordinator refuses an older list put back over the file. To
give NAME a fresh identity after a compromise: at the site, move its keys away and
``certs request`` again, then ``certs issue NAME --csr`` (for keys made here, ``certs
issue NAME --new-identity``), then ``spherecal coordinator --config FILE --unpin
NAME`` (coordinator stopped) so the new key can be pinned at its next join; the
other sites pin its new line.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from spherecal.crypto import generate_identity
from spherecal.proto.identity import (
    CertificateError,
    certificate_binding,
    identity_san,
    load_identity_key,
    public_key_bytes,
    save_identity_key,
)

__all__ = [
    "DEFAULT_DAYS",
    "MAX_CRL_NUMBER",
    "init_ca",
    "issue_participant",
    "request_participant",
    "revoke_participant",
    "write_crl",
]

DEFAULT_HOSTS = ("localhost", "127.0.0.1")

DEFAULT_DAYS = 365
"""``--days`` when none is given (for ``issue``: or until the CA ends, if sooner)."""


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(pem)
    tmp.chmod(0o600)
    tmp.replace(path)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "spherecal federation"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no CA in {directory}: run `spherecal certs init {directory}` first"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca.key'} is not an EC private key")
    return cert, key


CLOCK_SKEW = dt.timedelta(minutes=5)
"""How far back a certificate's (or CRL's) validity starts, so that a peer whose clock
runs a little behind accepts it at once. It is not part of ``--days``: with ``days``
counted from the issuing instant, ``--days 0`` used to give a certificate valid only
for these five minutes before its issue (expired as it was written)."""


def _validity(
    days: int, what: str = "a certificate", *, now: dt.datetime | None = None
) -> tuple[dt.datetime, dt.datetime]:
    """``(notBefore, notAfter)`` of something valid for ``days`` whole days from ``now``
    (default: the current time).

    ``days`` below 1 is refused here, naming ``--days`` (the only way a user sets it):
    0 made an already-expired certificate that every handshake refused in silence,
    and a negative value reached the library as "The not valid after date must be
    after the not valid before date"."""
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(
            f"--days {days}: {what} must be valid for at least 1 day (--days N: N whole "
            "days from now)"
        )
    now = now or dt.datetime.now(dt.UTC)
    try:
        end = now + dt.timedelta(days=days)
    except OverflowError:
        raise ValueError(f"--days {days}: past the year 9999, the last date X.509 holds") from None
    return now - CLOCK_SKEW, end


def _when(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _ca_window(ca_cert: x509.Certificate, directory: Path, now: dt.datetime, doing: str) -> None:
    """Refuse a CA outside its validity window, in one line naming ``ca.pem`` and its
    dates, before anything is signed or written.

    Why: TLS checks every certificate of a chain at each handshake, the CA's too. An
    expired CA (a development CA of ``certs init`` ends with its ``--days``) signed
    certificates, and revocation lists, that every peer refused — without a word at
    issue time, and then only ``Socket closed`` at the site. ``doing`` says what was
    asked (``issue a certificate``, ``sign a revocation list``)."""
    start, end = ca_cert.not_valid_before_utc, ca_cert.not_valid_after_utc
    window = f"(valid {_when(start)} to {_when(end)})"
    where = f"the CA {directory / 'ca.pem'}"
    if now > end:
        raise ValueError(
            f"{where} expired on {_when(end)} {window}: it cannot {doing} that verifies; "
            "make a new CA (`spherecal certs init NEWDIR`: a new ca.pem for the "
            "coordinator and every site, and a new server certificate) and issue each "
            "site's certificate from it"
        )
    if now < start:
        raise ValueError(
            f"{where} is not valid until {_when(start)} {window}: what it signs now is "
            f"refused until then; check this machine's clock (it says {_when(now)})"
        )


def _within_ca(
    ca_cert: x509.Certificate, directory: Path, name: str, days: int | None, now: dt.datetime
) -> tuple[dt.datetime, dt.datetime]:
    """``(notBefore, notAfter)`` of NAME's certificate: ``days`` whole days from ``now``,
    refused when that would end after the CA does (naming the longest ``--days`` that
    does not); with ``days`` None, :data:`DEFAULT_DAYS` or until the CA ends, if sooner.

    Why refuse rather than shorten: an operator who asked for ``--days 400`` and got a
    certificate ending in 200 would learn it only when the site stops at the CA's end;
    the line says what is possible (or that a new CA is needed). Without ``--days`` no
    lifetime was asked for, so ending with the CA is the natural default — ``certs
    init`` and ``certs issue`` both default to 365 days, and an issue an hour after the
    init would otherwise be refused."""
    ca_end = ca_cert.not_valid_after_utc
    if days is None:
        start, end = _validity(DEFAULT_DAYS, now=now)
        return start, min(end, ca_end)
    start, end = _validity(days, now=now)
    if end > ca_end:
        longest = (ca_end - now) // dt.timedelta(days=1)
        then = (
            f"the longest possible now is --days {longest} (or leave --days out: the "
            "certificate then ends with the CA)"
            if longest >= 1
            else "the CA ends in less than a day: make a new CA (`spherecal certs init "
            "NEWDIR`) and issue from it"
        )
        seconds = "%Y-%m-%d %H:%M:%S UTC"  # `init --days 30` then `issue --days 30`: seconds
        raise ValueError(
            f"--days {days}: {name}.pem would end on {end:{seconds}}, after the CA "
            f"{directory / 'ca.pem'} does ({ca_end:{seconds}}); a certificate is refused "
            f"by every TLS peer once its CA has ended; {then}"
        )
    return start, end


def init_ca(
    directory: Path, hosts: Sequence[str] = DEFAULT_HOSTS, days: int = DEFAULT_DAYS
) -> list[Path]:
    """Create ``ca.*``, ``server.*`` and an empty ``crl.pem`` (valid as long as the CA)
    in ``directory``, refusing to overwrite a CA."""
    start, end = _validity(days)  # before anything is written
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "ca.key").exists():
        raise FileExistsError(f"{directory / 'ca.key'} exists; refusing to replace a CA")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("spherecal dev CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(ca_key, directory / "ca.key")
    _write_cert(ca_cert, directory / "ca.pem")
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0] if hosts else "localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(server_key, directory / "server.key")
    _write_cert(server_cert, directory / "server.pem")
    _write_crl(ca_cert, ca_key, [], start, end, directory / "crl.pem")
    return [directory / n for n in ("ca.pem", "ca.key", "server.pem", "server.key", "crl.pem")]


def _check_name(name: str) -> None:
    if not name or not name.isprintable() or "/" in name or len(name.encode()) > 64:
        raise ValueError(f"invalid participant id {name!r}")


def _identity(path: Path, *, fresh: bool = False) -> Ed25519PrivateKey:
    """The identity key at ``path``, kept if there (the key the other sites pinned),
    else (or with ``fresh``) a new one written there, mode 0600."""
    if path.exists() and not fresh:
        return load_identity_key(path)
    identity = generate_identity()
    save_identity_key(identity, path)
    return identity


def request_participant(directory: Path, name: str) -> list[Path]:
    """At the site: ``NAME.identity.key`` and ``NAME.key`` (each kept if present: a
    renewal keeps the site's identity, which the other sites pinned) and
    ``NAME.csr``, a PKCS#10 request for participant NAME's certificate that names the
    TLS public key (and is signed by it) and the identity public key (in the same URI
    SANs the certificate will carry). Only the request leaves the site."""
    _check_name(name)
    directory.mkdir(parents=True, exist_ok=True)
    identity_path = directory / f"{name}.identity.key"
    identity = _identity(identity_path)
    key_path = directory / f"{name}.key"
    if key_path.exists():
        loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path} is not an EC private key")
        key = loaded
    else:
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(key, key_path)
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_name(name))
        .add_extension(identity_san(name, public_key_bytes(identity)), critical=False)
        .sign(key, hashes.SHA256())
    )
    csr_path = directory / f"{name}.csr"
    csr_path.write_bytes(request.public_bytes(serialization.Encoding.PEM))
    return [csr_path, key_path, identity_path]


def _requested_keys(
    name: str, csr: Path
) -> tuple[ec.EllipticCurvePublicKey | rsa.RSAPublicKey, bytes]:
    """The TLS public key and the identity key a site's request names, after checking
    it: a PKCS#10 request whose signature verifies (the site holds the TLS key), for
    participant ``name`` (CN and URI SAN agree), binding exactly one identity key."""
    try:
        request = x509.load_pem_x509_csr(csr.read_bytes())
    except FileNotFoundError:
        raise ValueError(f"--csr {str(csr)!r}: no such file") from None
    except ValueError:
        raise ValueError(
            f"--csr {str(csr)!r} is not a PEM certificate request (make it at the site "
            "with `spherecal certs request NAME --dir DIR`)"
        ) from None
    if not request.is_signature_valid:
        raise ValueError(f"--csr {str(csr)!r}: its signature does not verify")
    try:
        named, identity = certificate_binding(request)
    except CertificateError as exc:
        raise ValueError(f"--csr {str(csr)!r}: {exc}") from None
    if named != name:
        raise ValueError(f"--csr {str(csr)!r} requests a certificate for {named!r}, not {name!r}")
    if identity is None:
        raise ValueError(
            f"--csr {str(csr)!r} names no identity key (make it with `spherecal certs request`)"
        )
    public = request.public_key()
    if isinstance(public, rsa.RSAPublicKey) and public.key_size < 2048:
        raise ValueError(f"--csr {str(csr)!r}: an RSA key of {public.key_size} bits (need 2048+)")
    if not isinstance(public, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey)):
        raise ValueError(f"--csr {str(csr)!r}: a TLS key must be EC or RSA")
    return public, identity


def issue_participant(
    directory: Path,
    name: str,
    days: int | None = None,
    *,
    new_identity: bool = False,
    csr: Path | None = None,
) -> list[Path]:
    """Create ``NAME.pem``: from the site's request ``csr`` (its public keys; nothing
    private is made or kept here), or else with ``NAME.key`` and (unless present, or
    with ``new_identity``) ``NAME.identity.key`` made here.

    Valid for ``days`` whole days from now — refused when that outlives the CA — or,
    with ``days`` None, :data:`DEFAULT_DAYS` or until the CA ends, if sooner. A CA
    outside its validity window is refused. Every refusal comes before anything is
    written."""
    _check_name(name)
    now = dt.datetime.now(dt.UTC)
    if days is not None:
        _validity(days, now=now)  # --days 0 is named as such, before the CA is read
    ca_cert, ca_key = _load_ca(directory)
    _ca_window(ca_cert, directory, now, "issue a certificate")
    start, end = _within_ca(ca_cert, directory, name, days, now)
    written: list[Path] = []
    public: ec.EllipticCurvePublicKey | rsa.RSAPublicKey
    if csr is not None:
        if new_identity:
            raise ValueError("--new-identity makes the key here; with --csr the site makes it")
        public, identity_public = _requested_keys(name, csr)
    else:
        identity_path = directory / f"{name}.identity.key"
        identity = _identity(identity_path, fresh=new_identity)
        identity_public = public_key_bytes(identity)
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(key, directory / f"{name}.key")
        public = key.public_key()
        written = [directory / f"{name}.key", identity_path]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(identity_san(name, identity_public), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_cert(cert, directory / f"{name}.pem")
    return [directory / f"{name}.pem", *written]


def revoke_participant(directory: Path, name: str, days: int = DEFAULT_DAYS) -> Path:
    """Add participant NAME's current certificate (``NAME.pem``) to ``crl.pem``.

    The new CRL keeps every earlier entry (after checking the old list's CA
    signature), is signed by the CA and valid for ``days``; it is written atomically,
    so a coordinator re-reading it never sees half a file. A CA outside its validity
    window is refused (a list it signs does not verify), before anything is written.
    """
    _check_name(name)
    now = dt.datetime.now(dt.UTC)
    last_update, next_update = _validity(days, "a revocation list", now=now)
    ca_cert, ca_key = _load_ca(directory)
    _ca_window(ca_cert, directory, now, "sign a revocation list")
    cert_path = directory / f"{name}.pem"
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except FileNotFoundError:
        raise FileNotFoundError(f"no certificate {cert_path} to revoke") from None
    if cert.issuer != ca_cert.subject:
        raise ValueError(f"{cert_path} was not issued by the CA in {directory}")
    crl_path = directory / "crl.pem"
    held, number = _crl_entries(crl_path, ca_cert)
    entries = [e for e in held if e.serial_number != cert.serial_number]
    entries.append(
        x509.RevokedCertificateBuilder()
        .serial_number(cert.serial_number)
        .revocation_date(now)
        .build()
    )
    _write_crl(ca_cert, ca_key, entries, last_update, next_update, crl_path, number + 1)
    return crl_path


MAX_CRL_NUMBER = 2**159 - 1
"""The largest CRL number RFC 5280 §5.2.3 allows (20 octets, non-negative)."""


def write_crl(directory: Path, days: int = DEFAULT_DAYS, number: int | None = None) -> Path:
    """Write the CA's ``crl.pem`` anew: every entry it holds (after checking the old
    list's CA signature; none when there is no list), signed by the CA now, valid for
    ``days``, written atomically.

    Why: ``init`` writes an empty list so that the coordinator's ``[tls] crl`` can name
    it before anything is revoked (the coordinator re-reads it when it changes, and
    refuses to start on a file that does not exist). A CA made before ``init`` did so
    gets its empty list here, with no certificate revoked; and a list about to end
    gets a new lifetime, keeping what it revokes. Refused, before anything is written,
    for a CA outside its validity window (as ``revoke``).

    ``number``: the new list's CRL number (default: one above the list in
    ``directory``), above that list's. Why: a CA whose ``crl.pem`` was lost starts its
    numbers again at 1, and a coordinator that applied a higher number refuses every
    lower one (``coordinator.server.revocation``) — its refusal names the number to
    give here."""
    now = dt.datetime.now(dt.UTC)
    last_update, next_update = _validity(days, "a revocation list", now=now)
    if number is not None and (
        isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_CRL_NUMBER
    ):
        raise ValueError(f"--number {number}: a CRL number is a whole number from 1 to 2^159 - 1")
    ca_cert, ca_key = _load_ca(directory)
    _ca_window(ca_cert, directory, now, "sign a revocation list")
    crl_path = directory / "crl.pem"
    entries, held = _crl_entries(crl_path, ca_cert)
    if number is not None and number <= held:
        raise ValueError(
            f"--number {number}: {crl_path} is CRL number {held}, and numbers only increase "
            f"(RFC 5280 §5.2.3): give one above {held}"
        )
    _write_crl(
        ca_cert,
        ca_key,
        entries,
        last_update,
        next_update,
        crl_path,
        held + 1 if number is None else number,
    )
    return crl_path


def _crl_entries(
    path: Path, ca_cert: x509.Certificate
) -> tuple[list[x509.RevokedCertificate], int]:
    """The entries and the CRL number of the CA's list at ``path`` (none and 0 when
    there is no file, 0 for a list written before lists were numbered), after
    checking that the CA signed it: a list the CA did not sign is never carried on."""
    if not path.exists():
        return [], 0
    from spherecal.coordinator.server.revocation import crl_number, load_verified_crl

    crl = load_verified_crl(path.read_bytes(), ca_cert)
    return list(crl), crl_number(crl) or 0


def _write_crl(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    entries: Sequence[x509.RevokedCertificate],
    last_update: dt.datetime,
    next_update: dt.datetime,
    path: Path,
    number: int = 1,
) -> None:
    """Sign a CRL of ``entries`` with the CA key and write it atomically (a coordinator
    re-reading the file never sees half of it).

    The list carries the two extensions RFC 5280 §5.2 requires of a conforming CRL:
    the authority key identifier (the CA's subject key identifier), and a CRL number
    one above the list it replaces. The number is how a coordinator tells a newer list
    from an older one that the same CA signed (``revocation.RevocationList`` refuses
    to go back to a lower number, which would un-revoke what was revoked since)."""
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(last_update)
        .next_update(next_update)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .add_extension(x509.CRLNumber(number), False)
    )
    for entry in entries:
        builder = builder.add_revoked_certificate(entry)
    crl = builder.sign(ca_key, hashes.SHA256())
    tmp = path.with_suffix(".pem.tmp")
    tmp.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    tmp.replace(path)
