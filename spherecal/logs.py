"""Log lines an operator can ship (issue #26): one format for every process.

Every line a coordinator or participant writes to stderr — its progress messages
(the ``say`` callables) and records of the ``logging`` module — carries an ISO-8601
UTC timestamp with milliseconds and a level, in one of two formats
(:data:`LOG_FORMATS`; ``--log-format`` or the config key ``[server] log_format`` /
``[participant] log_format``):

``text``  ``2026-11-25T09:14:02.123Z INFO hospital-b: reconnect attempt 1 in 0.2s``
``json``  ``{"ts": "2026-11-25T09:14:02.123Z", "level": "INFO", "component":
          "hospital-b", "msg": "reconnect attempt 1 in 0.2s"}`` — one object a line,
          for log shippers (Loki, Fluent Bit, Vector) to parse without a regex

Progress messages have no level of their own; :func:`level_of` reads the convention
the code already follows (``WARNING: …``, ``DEGRADED: …`` → WARNING; ``FAILED: …``,
``ERROR: …`` → ERROR; anything else INFO). This module only *formats*: rate limiting
of repeated lines stays in ``spherecal.coordinator.server.log_limit``, which wraps
the writer made here.

gRPC core (the C library) writes its own lines straight to stderr in another format
(``I1125 15:50:47.559397 4797 ssl_transport_security.cc:2563] Handshake failed …``,
one per refused TLS handshake). :func:`quiet_grpc_core` sets ``GRPC_VERBOSITY=ERROR``
before gRPC is imported unless the operator set it, so by default only its errors
reach the log; ``GRPC_VERBOSITY=INFO`` brings the rest back for debugging. The
coordinator command is the exception: it asks for INFO, because a refused TLS
handshake (an expired client certificate, one from another CA) is an INFO line and
nothing else records it; its capture of fd 2 keeps only those lines, as its own
(``spherecal.coordinator.server.native_log``), and drops the other INFO lines.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "LineFormatter",
    "add_log_format_option",
    "add_log_level_option",
    "check_log_format",
    "closing_line",
    "format_line",
    "level_of",
    "line_writer",
    "log_records",
    "grpc_info_is_ours",
    "quiet_grpc_core",
    "timestamp",
]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("info", "debug")
_PREFIXES = (
    ("DEBUG:", "DEBUG"),
    ("WARNING:", "WARNING"),
    ("DEGRADED:", "WARNING"),
    ("FAILED:", "ERROR"),
    ("ERROR:", "ERROR"),
    ("CRITICAL:", "CRITICAL"),
)


def check_log_format(value: str) -> str:
    """``value`` if it is a known format, else ValueError (a one-line error)."""
    if value not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {value!r}")
    return value


def timestamp(seconds: float | None = None) -> str:
    """ISO-8601 UTC with milliseconds and ``Z``: ``2026-11-25T09:14:02.123Z``."""
    when = (
        dt.datetime.now(dt.UTC) if seconds is None else dt.datetime.fromtimestamp(seconds, dt.UTC)
    )
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def level_of(message: str) -> str:
    """The level a progress message's own prefix implies (INFO without one)."""
    for prefix, level in _PREFIXES:
        if message.startswith(prefix):
            return level
    return "INFO"


def format_line(
    component: str,
    message: str,
    *,
    fmt: str = "text",
    level: str | None = None,
    seconds: float | None = None,
    logger: str | None = None,
) -> str:
    """One log line (no trailing newline). In ``text`` a multi-line message keeps its
    continuation lines indented under the first; ``json`` escapes them."""
    level = level or level_of(message)
    ts = timestamp(seconds)
    if fmt == "json":
        record: dict[str, str] = {"ts": ts, "level": level, "component": component}
        if logger:
            record["logger"] = logger
        record["msg"] = message
        return json.dumps(record, ensure_ascii=False)
    where = f"{component} {logger}" if logger else component
    return f"{ts} {level} {where}: " + message.replace("\n", "\n    ")


def line_writer(
    component: str, fmt: str = "text", stream: TextIO | None = None, *, debug: bool = False
) -> Callable[[str], None]:
    """A ``say`` callable writing formatted lines to ``stream`` (stderr by default,
    looked up at each call so that a redirected ``sys.stderr`` is honoured). A message
    marked ``DEBUG: …`` is written (at level DEBUG, without the mark) only with
    ``debug``."""
    check_log_format(fmt)

    def say(message: str) -> None:
        if message.startswith("DEBUG: "):
            if not debug:
                return
            message = message[len("DEBUG: ") :]
            level: str | None = "DEBUG"
        else:
            level = None
        out = stream if stream is not None else sys.stderr
        print(format_line(component, message, fmt=fmt, level=level), file=out, flush=True)

    return say


class LineFormatter(logging.Formatter):
    """``logging`` records in the same format as the progress lines."""

    def __init__(self, component: str, fmt: str = "text") -> None:
        super().__init__()
        self.component = component
        self.fmt = check_log_format(fmt)

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return format_line(
            self.component,
            message,
            fmt=self.fmt,
            level=record.levelname,
            seconds=record.created,
            logger=record.name,
        )


#: The ``GRPC_VERBOSITY`` that :func:`quiet_grpc_core` set last, so that a later
#: command in the same process (or a child that inherits the environment) can tell
#: its own default from the operator's choice.
GRPC_VERBOSITY_SET_BY_US = "SPHERECAL_GRPC_VERBOSITY_DEFAULT"


def quiet_grpc_core(command: str | None = None) -> None:
    """gRPC core's log level for ``command`` unless the operator chose one (must run
    before gRPC makes its first object): ERROR, only its errors — but INFO for the
    ``coordinator``, whose capture keeps of INFO only the refused TLS handshakes
    (:func:`grpc_info_is_ours`). A level this function set earlier is not the
    operator's and is replaced."""
    current = os.environ.get("GRPC_VERBOSITY")
    if current is not None and current != os.environ.get(GRPC_VERBOSITY_SET_BY_US):
        return  # the operator's
    level = "INFO" if command == "coordinator" else "ERROR"
    os.environ["GRPC_VERBOSITY"] = level
    os.environ[GRPC_VERBOSITY_SET_BY_US] = level


def grpc_info_is_ours() -> bool:
    """gRPC core logs at INFO because :func:`quiet_grpc_core` asked for it (for the
    refused handshakes), not because the operator did: its other INFO lines are noise."""
    level = os.environ.get("GRPC_VERBOSITY")
    return level == "INFO" and os.environ.get(GRPC_VERBOSITY_SET_BY_US) == "INFO"


def add_log_format_option(parser: Any, key: str) -> None:
    """``--log-format text|json`` on a service command (``key``: its config key)."""
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help=f"stderr log lines: text or one JSON object a line, each with an ISO-8601 UTC "
        f"timestamp and a level (default: the config's {key}, else text)",
    )


def add_log_level_option(parser: Any, key: str) -> None:
    """``--log-level info|debug`` on a service command (``key``: its config key)."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=None,
        help=f"info: one line per round and what goes wrong; debug: every secure-aggregation "
        f"stage too (default: the config's {key}, else info)",
    )


def closing_line(component: str, fmt: str, what: str, code: int, level: str | None = None) -> None:
    """The last line on stderr: how the process ends and its exit status (at ``level``,
    else INFO for 0 and ERROR for any other status)."""
    level = level or ("INFO" if code == 0 else "ERROR")
    line = format_line(component, f"exiting: {what} (exit status {code})", fmt=fmt, level=level)
    print(line, file=sys.stderr, flush=True)


def log_records(component: str, fmt: str, level: int = logging.WARNING) -> None:
    """``logging`` records (``level`` and up) to stderr in the process's format,
    unless the host already set up logging (embedded: it decides)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(component, fmt))
    root.addHandler(handler)
    root.setLevel(level)
