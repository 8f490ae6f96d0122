"""Checks a service process runs before it does anything: files it will need exist,
directories it will write are writable.

A coordinator that finds its certificate missing only when it builds the server, or a
participant that learns its ``out_dir`` is unwritable after an hour of federation,
wastes everyone's time and ends in a traceback. These checks name the config key, so
the one-line error says what to fix (``spherecal COMMAND: error: ...``, exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from spherecal.outputs import check_output_dir

__all__ = ["PreflightError", "check_coordinator", "check_participant"]


class PreflightError(ValueError):
    """A configured file or directory that cannot be used (named by its config key)."""


def _readable(source: str, key: str, path: Path | None) -> None:
    if path is None:
        return
    if not path.exists():
        raise PreflightError(f"{source}: {key} = {str(path)!r}: file does not exist")
    if path.is_dir():
        raise PreflightError(f"{source}: {key} = {str(path)!r}: is a directory, not a file")
    if not os.access(path, os.R_OK):
        raise PreflightError(f"{source}: {key} = {str(path)!r}: permission denied")


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


def check_participant(settings: Any, source: str) -> None:
    """TLS files (unless ``insecure``: present, parseable, the key matching its
    certificate), the data files and ``out_dir``."""
    if not settings.insecure:
        tls = settings.tls
        for key in ("ca", "cert", "key"):
            _readable(source, f"[tls] {key}", getattr(tls, key))
        _ca_bundle(source, "[tls] ca", tls.ca)
        _key_pair(source, "[tls]", tls.cert, tls.key)
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


def check_coordinator(settings: Any, source: str) -> None:
    """TLS files (unless ``insecure``: present, parseable, the key matching its
    certificate) and ``out_dir``."""
    if not settings.server.insecure:
        tls = settings.tls
        for key in ("cert", "key", "client_ca", "crl"):
            _readable(source, f"[tls] {key}", getattr(tls, key))
        _ca_bundle(source, "[tls] client_ca", tls.client_ca)
        _key_pair(source, "[tls]", tls.cert, tls.key)
    try:
        check_output_dir(settings.out_dir, what="[federation] out_dir")
    except ValueError as exc:
        raise PreflightError(f"{source}: {exc}") from None
