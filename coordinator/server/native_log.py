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
``on_handshake``), rate-limited like the rest.

**Who was refused.** That line carries no peer address, and nothing else in a
default configuration does: the refusal happens before a call exists, so a
``grpc.ServerInterceptor`` or a servicer's ``context.peer()`` never runs. The only
place gRPC core names the address is its ``handshaker`` trace: with
``GRPC_TRACE=handshaker`` in the environment, the entry in which the failed
handshake is reported to the handshake manager (``CallNextHandshakerLocked:
error=… certificate has expired …``, often on another thread than the refusal's line)
lists the connection's channel arguments, among them
``grpc.internal.endpoint_peer_address=ipv4:10.0.0.9:5123``. That is a debugging
trace (its wording is gRPC's internals, several INFO lines per connection), so it is
not turned on for the operator. With it on (``peer_trace``) a refusal waits up to
:data:`PEER_WAIT_S` for the next such entry with the same OpenSSL reason, and its line
says ``from 10.0.0.9`` (the host: the port differs per attempt, and repeats from one
host are counted as one). Two refusals of one reason at the same moment may each take
the other's entry — each line still names a host refused for that reason. Otherwise —
no trace, or no entry in time — the line says plainly that the address is not known
and how to have it named. A line that says a handshake failed in words this reader
does not recognise (a later gRPC) is written as gRPC core's, not dropped with the INFO
lines.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO

from spherecal.coordinator.server.log_limit import RepeatLimiter

__all__ = [
    "HANDSHAKE_REFUSED",
    "NativeStderr",
    "handshake_refusal",
    "handshaker_traced",
    "normalise",
    "peer_host",
]

#: glog's prefix: severity letter, MMDD, time, thread id (``E1125 10:00:01.123456  123 ``).
_GLOG = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+")
_ADDRESS = re.compile(r"\b(ipv4|ipv6|unix):[^\s,;)\]]+")
_POINTER = re.compile(r"0x[0-9a-fA-F]+")
#: gRPC core's line for a failed TLS handshake (``ssl_transport_security.cc``).
_HANDSHAKE = re.compile(r"Handshake failed with (?:fatal )?error (\w+)(?:: (.*))?$")
#: Any other line that says a TLS handshake failed (gRPC's words changed): never dropped.
_HANDSHAKE_LOOSE = re.compile(r"handshake failed", re.IGNORECASE)
#: The handshaker trace's own entries, which say "handshake failed" of every refusal.
_HANDSHAKER_TRACE = re.compile(r"CallNextHandshakerLocked|handshake[ _]manager")
#: The peer's address in the handshaker trace's channel arguments.
_PEER = re.compile(r"grpc\.internal\.endpoint_peer_address=((?:ipv4|ipv6|unix):[^\s,}]+)")
#: The handshaker trace's entry reporting a failed handshake (with its channel args).
_TRACE_FAILURE = re.compile(r"CallNextHandshakerLocked: error=(?!OK\b)")
#: How long a refusal waits for the handshaker trace to name its peer (``peer_trace``).
PEER_WAIT_S = 1.0
#: gRPC core's own warning when INFO is asked for, which this reader then filters.
_INFO_NOTICE = "Log level INFO is not suitable for production"
#: How every line made by :func:`handshake_refusal` begins.
HANDSHAKE_REFUSED = "WARNING: refused a TLS handshake"
#: What a handshake failure's OpenSSL reason says about the client, first match wins.
_REFUSALS = (
    # OpenSSL says these of any certificate of the chain: the [tls] client_ca one too
    # (valid at the coordinator's start-up check, it may have ended since)
    (
        "certificate has expired",
        "the client's certificate (or the [tls] client_ca certificate that issued it) has expired",
    ),
    (
        "certificate is not yet valid",
        "the client's certificate (or the [tls] client_ca certificate that issued it) "
        "is not yet valid",
    ),
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


def handshaker_traced(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``GRPC_TRACE`` turns gRPC core's ``handshaker`` trace on (by name or
    ``all``, and not off with ``-handshaker``): then refused handshakes can be named
    by their peer's address."""
    names = {n.strip() for n in (environ or os.environ).get("GRPC_TRACE", "").split(",")}
    return bool(names & {"handshaker", "all"}) and "-handshaker" not in names


def peer_host(address: str) -> str:
    """The host of a gRPC address (``ipv4:10.0.0.9:5123`` → ``10.0.0.9``,
    ``ipv6:[::1]:5123`` → ``::1``); a unix socket stays whole."""
    scheme, _, rest = address.partition(":")
    if scheme == "unix":
        return address
    rest = rest.replace("%5B", "[").replace("%5D", "]")
    host = rest.rpartition(":")[0] or rest
    return host.strip("[]")


def handshake_refusal(line: str, *, peer: str | None = None, traced: bool = False) -> str | None:
    """The coordinator's line for a gRPC-core line that reports a refused TLS
    handshake, or ``None`` for any other line. The reason is OpenSSL's, after the
    library's prefix (``error:1000007d:SSL routines:OPENSSL_internal:``). ``peer``:
    the client's host, when gRPC core's handshaker trace named it; else the line says
    that it is not known, and (unless ``traced``) how to have it named."""
    if _HANDSHAKE.search(line) is None:
        return None
    detail = _detail(line)
    what = next(
        (said for marker, said in _REFUSALS if marker in detail),
        "the client's TLS handshake failed",
    )
    if peer is not None:
        return (
            f"{HANDSHAKE_REFUSED} from {peer}: {what} ({detail}); refused before any call, "
            "so no participant is named (a site checks its own certificate at start)"
        )
    how = (
        "gRPC core's handshaker trace did not name it"
        if traced
        else "gRPC core reports a refused handshake without it; start the coordinator "
        "with GRPC_TRACE=handshaker to have it named here"
    )
    return (
        f"{HANDSHAKE_REFUSED}: {what} ({detail}); the client's address is not known "
        f"({how}), nor its participant (refused before any call; a site checks its own "
        "certificate at start)"
    )


def _detail(line: str) -> str:
    """OpenSSL's reason in a refused handshake's line (``CERTIFICATE_VERIFY_FAILED:
    certificate has expired``), as :func:`handshake_refusal` reads it."""
    found = _HANDSHAKE.search(line)
    if found is None:
        return ""
    detail = (found.group(2) or found.group(1)).strip()
    return detail.rsplit("OPENSSL_internal:", 1)[-1].strip()


def _unrecognised_handshake(text: str) -> bool:
    """A line that says a TLS handshake failed in words :data:`_HANDSHAKE` does not
    match (the handshaker trace's own entries aside): kept, so that a change of gRPC
    core's wording shows in the log instead of every refusal vanishing with the INFO
    lines."""
    return bool(_HANDSHAKE_LOOSE.search(text)) and not _HANDSHAKER_TRACE.search(text)


@dataclass
class _Held:
    """A refused handshake waiting for the handshaker trace to name its peer."""

    line: str
    detail: str
    """OpenSSL's reason, which the trace's entry for the same handshake repeats."""
    since: float


class NativeStderr:
    """fd 2 through a rate-limiting pipe while started (see the module docstring).

    ``info=False``: gRPC core's INFO lines are there only for the refused handshakes
    (the coordinator command raised its level for them), so the others are dropped.
    ``on_handshake``: where a refused handshake's line goes (the coordinator's own
    writer, so that it reads like its other lines); without it, it is written as
    gRPC core's lines are. ``peer_trace``: gRPC core's handshaker trace is on
    (:func:`handshaker_traced`), so a refusal waits for the trace to name its peer
    (the module docstring)."""

    def __init__(
        self,
        limiter: RepeatLimiter | None = None,
        *,
        label: str = "grpc-core",
        clock: Callable[[], str] = lambda: time.strftime("%H:%M:%S"),
        info: bool = True,
        on_handshake: Callable[[str], None] | None = None,
        peer_trace: bool = False,
    ) -> None:
        self.limiter = limiter or RepeatLimiter()
        self.label = label
        self._clock = clock
        self._info = info
        self._on_handshake = on_handshake
        self._peer_trace = peer_trace and on_handshake is not None
        self._held: list[_Held] = []
        """Refusals waiting for their peer's address, oldest first."""
        self._failure: str | None = None
        """The text so far of the current entry when it is the handshaker trace's report
        of a failed handshake whose peer is not found yet (an entry of gRPC core may
        span several lines; only its first has the glog prefix)."""
        self._dropping = False
        """The current entry was dropped (its continuation lines go with it)."""
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
                wait = min(self.limiter.window_s, PEER_WAIT_S) if self._held else None
                ready, _, _ = select.select(
                    [self._read], [], [], self.limiter.window_s if wait is None else wait
                )
                if ready:
                    chunk = os.read(self._read, 65536)
                    if not chunk:
                        break
                    held += chunk
                    *lines, held = held.split(b"\n")
                    for raw in lines:
                        self._safely(raw)
                self._release_waiting(time.monotonic() - PEER_WAIT_S)
                for summary in self.limiter.expired():  # the periodic count
                    self._write(summary)
            if held:
                self._safely(held)
            self._release_waiting(float("inf"))
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
        entry = _GLOG.match(raw)
        if entry is not None:  # a new entry; other lines continue the last one
            self._dropping = False
            self._failure = raw if self._peer_trace and _TRACE_FAILURE.search(raw) else None
        elif self._failure is not None:
            self._failure += "\n" + raw
        if self._failure is not None:
            peer = _PEER.search(raw)
            if peer is not None:
                self._name(self._failure, peer_host(peer.group(1)))
                self._failure = None
        text = normalise(raw)
        if handshake_refusal(text) is not None and self._on_handshake is not None:
            if self._peer_trace:
                self._held.append(_Held(text, _detail(text), time.monotonic()))
                return
            self._emit(self._refusal(text, None))
            return
        if entry is None and self._dropping:
            self.lines_dropped += 1  # the rest of a dropped entry
            return
        if (
            not self._info
            and (text.startswith("I ") or _INFO_NOTICE in text)
            and not _unrecognised_handshake(text)
        ):
            self.lines_dropped += 1
            self._dropping = True
            return
        self._emit(text)

    def _refusal(self, text: str, peer: str | None) -> str:
        line = handshake_refusal(text, peer=peer, traced=self._peer_trace)
        assert line is not None  # text is a refused handshake's line
        return line

    def _name(self, failure: str, peer: str) -> None:
        """The oldest held refusal whose reason the trace's entry ``failure`` gives,
        written naming ``peer``."""
        for index, waiting in enumerate(self._held):
            if waiting.detail in failure:
                del self._held[index]
                self._emit(self._refusal(waiting.line, peer))
                return

    def _release_waiting(self, before: float) -> None:
        """Write the refusals held since before ``before`` (monotonic), unnamed."""
        while self._held and self._held[0].since <= before:
            waiting = self._held.pop(0)
            with contextlib.suppress(Exception):  # this thread must never die
                self._emit(self._refusal(waiting.line, None))

    def _emit(self, text: str) -> None:
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
