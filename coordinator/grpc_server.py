"""gRPC transport for :class:`~coordinator.service.CoordinatorService`.

Thin on purpose: extract the authenticated peer from the TLS auth context, call the
service, turn :class:`ServiceError` into ``context.abort(code, message)``. Anything
unexpected becomes INTERNAL with a generic message (details go to the coordinator's
log, not to the caller).

Transport security:

* ``insecure = true`` is accepted only when the listen address is a loopback
  address — a coordinator reachable from the network always speaks TLS.
* Otherwise the server presents its certificate and, with ``client_ca`` set (the
  default deployment), *requires* a client certificate signed by that CA (mutual
  TLS). A client without one fails the TLS handshake (the client sees UNAVAILABLE);
  a client whose certificate names another participant than the request does is
  refused with UNAUTHENTICATED by the service.
* With ``[tls] crl`` set, a client certificate on the CA's revocation list is
  refused with UNAUTHENTICATED on every call (``coordinator.revocation``).
* Message size limits are explicit (``max_message_bytes``) on both directions.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
from cryptography import x509

from proto import grpc_services
from proto.identity import CertificateError, certificate_identity

from .errors import ServiceError
from .registry import Peer
from .revocation import RevocationList
from .service import CoordinatorService
from .settings import CoordinatorSettings

__all__ = ["build_server", "is_loopback", "split_host_port"]

log = logging.getLogger("spherecal.coordinator")
T = TypeVar("T")


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port_text = rest.lstrip(":")
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(f"address {address!r} needs a port (host:port)")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"address {address!r} has an invalid port") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (no DNS lookup)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _PeerCache:
    """Parse each client certificate once (the same bytes arrive on every call), and
    refuse revoked ones on every call (the CRL may change while a peer stays)."""

    def __init__(self, revocation: RevocationList | None = None) -> None:
        self._lock = threading.Lock()
        self._cache: dict[bytes, tuple[str, int]] = {}
        self._revocation = revocation

    def peer(self, context: grpc.ServicerContext) -> Peer:
        auth = context.auth_context() or {}
        pems = auth.get("x509_pem_cert") or []
        if not pems:
            return Peer(identity=None, address=context.peer())
        pem = bytes(pems[0])
        with self._lock:
            known = self._cache.get(pem)
        if known is None:
            try:
                cert = x509.load_pem_x509_certificate(pem)
                known = (certificate_identity(cert), cert.serial_number)
            except (CertificateError, ValueError) as exc:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, f"bad client certificate: {exc}")
                raise AssertionError("unreachable") from exc
            with self._lock:
                if len(self._cache) > 4096:
                    self._cache.clear()
                self._cache[pem] = known
        identity, serial = known
        if self._revocation is not None and self._revocation.is_revoked(serial):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"the client certificate of {identity!r} (serial {serial:x}) is revoked",
            )
            raise AssertionError("unreachable")
        return Peer(identity=identity, certificate_pem=pem, address=context.peer())


class _Servicer:
    """Maps each RPC to the service core."""

    def __init__(
        self, service: CoordinatorService, revocation: RevocationList | None = None
    ) -> None:
        self.service = service
        self._peers = _PeerCache(revocation)

    def _call(self, context: grpc.ServicerContext, fn: Callable[[Peer], T]) -> T:
        peer = self._peers.peer(context)
        try:
            return fn(peer)
        except ServiceError as exc:
            context.set_trailing_metadata(exc.trailing_metadata())
            context.abort(exc.code, exc.message)
            raise AssertionError("unreachable") from exc
        except Exception as exc:  # noqa: BLE001 - never leak internals to callers
            if not context.is_active():
                raise
            log.exception("internal error in RPC")
            self.service.federation.say(f"internal error: {type(exc).__name__}: {exc}")
            context.abort(grpc.StatusCode.INTERNAL, "internal error (see coordinator log)")
            raise AssertionError("unreachable") from exc

    def _stream(
        self, context: grpc.ServicerContext, fn: Callable[[Peer], Iterator[T]]
    ) -> Iterator[T]:
        iterator = self._call(context, fn)
        try:
            yield from iterator
        except ServiceError as exc:
            context.set_trailing_metadata(exc.trailing_metadata())
            context.abort(exc.code, exc.message)

    def Join(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.join(request, p))

    def Heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.heartbeat(request, p))

    def Presence(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        member = self._call(context, lambda p: self.service.presence_open(request, p))
        closed = threading.Event()
        lock = threading.Lock()

        def on_done() -> None:
            with lock:
                if closed.is_set():
                    return
                closed.set()
            self.service.presence_close(member)

        if not context.add_callback(on_done):
            on_done()
            return
        interval = max(0.2, self.service.settings.timeouts.heartbeat_interval_s)
        try:
            while context.is_active() and not closed.is_set():
                yield self.service.presence_reply(member)
                closed.wait(interval * 5)
        finally:
            on_done()

    def NextInstruction(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.next_instruction(request, p))

    def DownloadTensor(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._stream(context, lambda p: self.service.download_tensor(request, p))

    def UploadTensor(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.upload_tensor(request_iterator, p))

    def SubmitSecAgg(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.submit_secagg(request, p))

    def UploadMasked(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.upload_masked(request_iterator, p))

    def ReportEvaluation(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.report_evaluation(request, p))

    def ReportFailure(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.report_failure(request, p))

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._call(context, lambda p: self.service.get_status(request, p))


def revocation_list(
    settings: CoordinatorSettings, *, report: Callable[[str], None]
) -> RevocationList | None:
    """The ``[tls] crl`` list, verified against ``client_ca`` (None without a CRL)."""
    tls = settings.tls
    if tls.crl is None or settings.server.insecure:
        return None
    if tls.client_ca is None:
        raise ValueError("[tls] crl needs client_ca, the CA that signs it")
    return RevocationList(tls.crl, tls.client_ca.read_bytes(), report=report)


def server_credentials(settings: CoordinatorSettings) -> grpc.ServerCredentials | None:
    """TLS credentials, or None for ``insecure`` (loopback only)."""
    host, _ = split_host_port(settings.server.listen)
    if settings.server.insecure:
        if not is_loopback(host):
            raise ValueError(
                f"insecure mode is only allowed on loopback addresses, not {host!r}; "
                "configure [tls] (see `spherecal certs`)"
            )
        return None
    tls = settings.tls
    if tls.cert is None or tls.key is None:
        raise ValueError(
            "TLS needs [tls] cert and key (or `insecure = true` on a loopback address)"
        )
    chain = tls.cert.read_bytes()
    key = tls.key.read_bytes()
    if tls.client_ca is None:
        raise ValueError(
            "[tls] client_ca is required: participants authenticate with client "
            "certificates (mutual TLS)"
        )
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=tls.client_ca.read_bytes(), require_client_auth=True
    )


def build_server(
    settings: CoordinatorSettings, service: CoordinatorService
) -> tuple[grpc.Server, int]:
    """A started-ready (not yet started) server and the port it bound."""
    credentials = server_credentials(settings)
    workers = settings.server.max_workers or (4 * len(settings.participants) + 16)
    limit = settings.server.max_message_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ],
    )
    revocation = revocation_list(settings, report=service.federation.say)
    grpc_services().add_CoordinatorServicer_to_server(_Servicer(service, revocation), server)
    if credentials is None:
        port = server.add_insecure_port(settings.server.listen)
    else:
        port = server.add_secure_port(settings.server.listen, credentials)
    if port == 0:
        raise OSError(f"could not bind {settings.server.listen}")
    return server, port
