"""The coordinator's plain-HTTP listener (``[metrics] listen``): metrics and probes.

Why HTTP probes next to gRPC health (issue #26): under mutual TLS every gRPC call,
health included, needs a client certificate, and Kubernetes' built-in gRPC probe
cannot present one; an ``httpGet`` probe on this listener needs none. Paths:

``/metrics``  Prometheus text format 0.0.4 (GET and HEAD), :mod:`.metrics`
``/healthz``  200 ``ok`` while the process serves HTTP at all (liveness)
``/readyz``   200 ``ready`` while the gRPC server is up and the federation is running
              or waiting for participants; 503 ``not ready: ...`` before the server
              starts and after the federation ended (the process then only lingers
              to tell participants) — readiness, so a load balancer stops routing
anything else  404; other methods 405

Bodies are plain text, one line. The listener is plain HTTP: a non-loopback
``listen`` is refused unless ``allow_remote`` (then put it behind the network's
access controls); it reveals counts and durations, never values or keys.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from spherecal.coordinator.server.metrics import metrics_registry
from spherecal.coordinator.server.service import CoordinatorService
from spherecal.proto.address import is_loopback, split_host_port

__all__ = ["MetricsServer", "ProbeServer", "start_metrics"]

#: The classic text format ``generate_latest`` writes (what Prometheus 2.x expects).
CONTENT_TYPE_PLAIN_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
#: ``ready()`` answers (ready?, reason when not).
Readiness = Callable[[], tuple[bool, str]]


def _handler(registry: CollectorRegistry, ready: Readiness) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "spherecal"

        def version_string(self) -> str:
            """``Server: spherecal`` — no Python version (nothing for a scanner to
            match), and no trailing space: the base class joins ``server_version``
            and ``sys_version`` with one, and an empty ``sys_version`` (as here until
            2026-11-27) left ``spherecal `` on every answer."""
            return self.server_version

        def _answer(self, code: int, body: bytes, content_type: str, head: bool) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _route(self, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            text = "text/plain; charset=utf-8"
            if path == "/metrics":
                self._answer(200, generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4, head)
            elif path == "/healthz":
                self._answer(200, b"ok\n", text, head)
            elif path == "/readyz":
                ok, reason = ready()
                body = b"ready\n" if ok else f"not ready: {reason}\n".encode()
                self._answer(200 if ok else 503, body, text, head)
            else:
                self._answer(404, b"not found: /metrics, /healthz, /readyz\n", text, head)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

        def _refuse(self) -> None:
            self.send_response(405)
            self.send_header("Allow", "GET, HEAD")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

        def log_message(self, format: str, *args: Any) -> None:
            return  # one line per scrape would drown the coordinator's log

    return Handler


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class ProbeServer:
    """A running listener; ``close()`` stops it."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port = int(server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


MetricsServer = ProbeServer


def start_metrics(
    service: CoordinatorService, ready: Readiness | None = None
) -> ProbeServer | None:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` when ``[metrics] listen`` is
    set; None otherwise. ``ready`` defaults to "the federation is running"."""
    m = service.settings.metrics
    if m.listen is None:
        return None
    host, port = split_host_port(m.listen)
    if not is_loopback(host) and not m.allow_remote:
        raise ValueError(
            f"[metrics] listen = {m.listen!r} is not a loopback address; the endpoint is "
            "plain HTTP, so set [metrics] allow_remote = true to expose it deliberately"
        )

    def running() -> tuple[bool, str]:
        done = service.federation.board.done
        return (True, "") if done is None else (False, f"federation {done[0]}")

    handler = _handler(metrics_registry(service), ready or running)
    bind = host.strip("[]")
    server_class = _Server6 if ":" in bind else ThreadingHTTPServer
    try:
        server = server_class((bind, port), handler)
    except OSError as exc:
        raise ValueError(
            f"[metrics] listen = {m.listen!r}: cannot listen ({exc.strerror})"
        ) from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return ProbeServer(server, thread)
