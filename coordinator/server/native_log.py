"""gRPC core's own log lines, rate-limited like ours (issue #20).

Why: gRPC's C core writes straight to file descriptor 2 — under TLS one
``Handshake failed with fatal error SSL_ERROR_SSL …`` line per garbage TCP
connection (132 of them in one fuzz run), so anyone who can connect can grow the log
without limit, past every Python-level filter. So a coordinator *process* points
fd 2 at a pipe and reads it on a thread: each line, its glog prefix (severity, date,
time, thread id) and addresses stripped so that repeats are identical, goes through
the same :class:`~spherecal.coordinator.server.log_limit.RepeatLimiter` as ours, and
the first of a kind — then a count per window — reaches the real stderr.

Python's own ``sys.stderr`` is moved to a duplicate of the real stderr first, so our
lines (already limited) and faulthandler's tracebacks never pass through the pipe
— a process dying on a signal still leaves its tracebacks in the log. Stopping
restores fd 2 and ``sys.stderr``; the reader then sees end-of-file and writes what
it still holds.

**Refused TLS handshakes.** A client whose certificate has expired, is not yet valid
or was not issued by ``[tls] client_ca`` is refused by gRPC core in the TLS
handshake: no call is made, so no interceptor, servicer or Python logger ever sees
it, and the gRPC Python API has no hook for it. gRPC core's one trace of it is an
INFO line (``ssl_transport_security.cc … Handshake failed … certificate has
expired``), below the ``GRPC_VERBOSITY=ERROR`` the CLI sets. So the coordinator
command asks gRPC core for INFO (unless the operator chose a level) and this reader,
with ``info=False``, drops every other INFO line and turns each refused handshake
into one of the coordinator's own lines (:func:`handshake_refusal`, through
``on_handshake``), rate-limited like the rest: the handshake carries no peer
address or name in that line, so it says *why* clients are refused, not *who*.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

from spherecal.coordinator.server.log_limit import RepeatLimiter

__all__ = ["HANDSHAKE_REFUSED", "NativeStderr", "handshake_refusal", "normalise"]

#: glog's prefix: severity letter, MMDD, time, thread id (``E1125 10:00:01.123456  123 ``).
_GLOG = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+")
_ADDRESS = re.compile(r"\b(ipv4|ipv6|unix):[^\s,;)\]]+")
_POINTER = re.compile(r"0x[0-9a-fA-F]+")
#: gRPC core's line for a failed TLS handshake (``ssl_transport_security.cc``).
_HANDSHAKE = re.compile(r"Handshake failed with (?:fatal )?error (\w+)(?:: (.*))?$")
#: gRPC core's own warning when INFO is asked for, which this reader then filters.
_INFO_NOTICE = "Log level INFO is not suitable for production"
#: How every line made by :func:`handshake_refusal` begins.
HANDSHAKE_REFUSED = "WARNING: refused a TLS handshake"
#: What a handshake failure's OpenSSL reason says about the client, first match wins.
_REFUSALS = (
    ("certificate has expired", "the client's certificate has expired"),
    ("certificate is not yet valid", "the client's certificate is not yet valid"),
    ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "the client presented no certificate"),
    (
        "CERTIFICATE_VERIFY_FAILED",
        "the client's certificate does not verify against [tls] client_ca",
    ),
    (  # another CA of the same name (every `certs init` CA is "spherecal dev CA")
        "BAD_SIGNATURE",
        "the client's certificate does not verify against [tls] client_ca",
    ),
)


def normalise(line: str) -> str:
    """The part of a gRPC-core line that says *what* happened (what repeats)."""
    text = _GLOG.sub(r"\1 ", line.rstrip("\r\n"))
    text = _ADDRESS.sub(r"\1:…", text)
    return _POINTER.sub("0x…", text)


def handshake_refusal(line: str) -> str | None:
    """The coordinator's line for a gRPC-core line that reports a refused TLS
    handshake, or ``None`` for any other line. The reason is OpenSSL's, after the
    library's prefix (``error:1000007d:SSL routines:OPENSSL_internal:``)."""
    found = _HANDSHAKE.search(line)
    if found is None:
        return None
    detail = (found.group(2) or found.group(1)).strip()
    detail = detail.rsplit("OPENSSL_internal:", 1)[-1].strip()
    what = next(
        (said for marker, said in _REFUSALS if marker in detail),
        "the client's TLS handshake failed",
    )
    return (
        f"{HANDSHAKE_REFUSED}: {what} ({detail}); such a client is refused before any "
        "call and is not named here (a site checks its own certificate at start)"
    )


class NativeStderr:
    """fd 2 through a rate-limiting pipe while started (see the module docstring).

    ``info=False``: gRPC core's INFO lines are there only for the refused handshakes
    (the coordinator command raised its level for them), so the others are dropped.
    ``on_handshake``: where a refused handshake's line goes (the coordinator's own
    writer, so that it reads like its other lines); without it, it is written as
    gRPC core's lines are."""

    def __init__(
        self,
        limiter: RepeatLimiter | None = None,
        *,
        label: str = "grpc-core",
        clock: Callable[[], str] = lambda: time.strftime("%H:%M:%S"),
        info: bool = True,
        on_handshake: Callable[[str], None] | None = None,
    ) -> None:
        self.limiter = limiter or RepeatLimiter()
        self.label = label
        self._clock = clock
        self._info = info
        self._on_handshake = on_handshake
        self.lines_dropped = 0
        """INFO lines dropped with ``info=False`` (not refused handshakes)."""
        self._saved: int | None = None
        self._read: int | None = None
        self._out: IO[str] | None = None
        self._python_stderr: IO[str] | None = None
        self._thread: threading.Thread | None = None
        self.lines_in = 0
        """Native lines read (for tests and the periodic count)."""
        self.lines_out = 0

    def start(self) -> NativeStderr:
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._out = os.fdopen(os.dup(self._saved), "w", buffering=1, errors="replace")
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._read = read
        self._python_stderr = sys.stderr
        sys.stderr = self._out
        if faulthandler.is_enabled():  # keep tracebacks off the pipe (see the docstring)
            faulthandler.enable(file=self._out, all_threads=True)
            with contextlib.suppress(RuntimeError, ValueError, AttributeError):
                faulthandler.register(signal.SIGUSR1, file=self._out, all_threads=True)
        self._thread = threading.Thread(target=self._pump, name="native-stderr", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Restore fd 2 and ``sys.stderr``; write what is still held (counts too)."""
        if self._saved is None:
            return
        with contextlib.suppress(OSError):
            os.dup2(self._saved, 2)  # closes the pipe's write end: the reader sees EOF
        if self._python_stderr is not None:
            if faulthandler.is_enabled():
                faulthandler.enable(file=self._python_stderr, all_threads=True)
                with contextlib.suppress(RuntimeError, ValueError, AttributeError):
                    faulthandler.register(
                        signal.SIGUSR1, file=self._python_stderr, all_threads=True
                    )
            sys.stderr = self._python_stderr
        if self._thread is not None:
            self._thread.join(timeout=5)
        for summary in self.limiter.expired_all():
            self._write(summary)
        os.close(self._saved)
        self._saved = None
        if self._out is not None:
            with contextlib.suppress(OSError):
                self._out.close()

    # ------------------------------------------------------------ reader thread
    def _pump(self) -> None:
        assert self._read is not None
        held = b""
        try:
            while True:
                ready, _, _ = select.select([self._read], [], [], self.limiter.window_s)
                if ready:
                    chunk = os.read(self._read, 65536)
                    if not chunk:
                        break
                    held += chunk
                    *lines, held = held.split(b"\n")
                    for raw in lines:
                        self._safely(raw)
                for summary in self.limiter.expired():  # the periodic count
                    self._write(summary)
            if held:
                self._safely(held)
        finally:
            os.close(self._read)

    def _safely(self, raw: bytes) -> None:
        """One line, whatever happens: this thread must never die, or the C library's
        next writes to fd 2 would block once the pipe is full."""
        try:
            self._line(raw.decode("utf-8", "replace"))
        except Exception:
            with contextlib.suppress(Exception):
                self._write(raw.decode("utf-8", "replace"))

    def _line(self, raw: str) -> None:
        if not raw.strip():
            return
        self.lines_in += 1
        text = normalise(raw)
        refusal = handshake_refusal(text)
        if refusal is not None and self._on_handshake is not None:
            text = refusal
        elif refusal is None and not self._info and (text.startswith("I ") or _INFO_NOTICE in text):
            self.lines_dropped += 1
            return
        summaries, line = self.limiter.check(text)
        for summary in summaries:
            self._write(summary)
        if line is not None:
            self._write(line)

    def _write(self, line: str) -> None:
        if self._on_handshake is not None and line.startswith(HANDSHAKE_REFUSED):
            self.lines_out += 1
            with contextlib.suppress(Exception):  # this thread must never die
                self._on_handshake(line)
            return
        out = self._out
        if out is None:
            return
        self.lines_out += 1
        with contextlib.suppress(OSError, ValueError):
            out.write(f"[coordinator {self._clock()}] {self.label}: {line}\n")
            out.flush()
