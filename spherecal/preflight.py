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


def check_participant(settings: Any, source: str) -> None:
    """TLS files (unless ``insecure``), the data files and ``out_dir``."""
    if not settings.insecure:
        tls = settings.tls
        for key in ("ca", "cert", "key"):
            _readable(source, f"[tls] {key}", getattr(tls, key))
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
    """TLS files (unless ``insecure``) and ``out_dir``."""
    if not settings.server.insecure:
        tls = settings.tls
        for key in ("cert", "key", "client_ca", "crl"):
            _readable(source, f"[tls] {key}", getattr(tls, key))
    try:
        check_output_dir(settings.out_dir, what="[federation] out_dir")
    except ValueError as exc:
        raise PreflightError(f"{source}: {exc}") from None
