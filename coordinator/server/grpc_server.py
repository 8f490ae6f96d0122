"""gRPC transport for :class:`~spherecal.coordinator.server.service.CoordinatorService`.

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
  refused with UNAUTHENTICATED on every call (``spherecal.coordinator.server.revocation``),
  and the member whose own certificate it is has left the federation
  (``CoordinatorService.certificates_revoked``).
* Message size limits are explicit (``max_message_bytes``) on both directions.

Hostile bytes (issue #10): every handler is registered with a *safe* request
deserializer — bytes that do not parse become a marker the handler answers with
INVALID_ARGUMENT, instead of gRPC's INTERNAL plus a traceback per request. Every
exception that reaches a handler is mapped by :func:`spherecal.coordinator.errors.status_for`;
only an unmapped one becomes INTERNAL (logged, rate-limited). A request whose client
already went away (cancelled stream) ends quietly.

Busy port (issue #13): ``grpc.so_reuseport`` is 0, so a second coordinator on a port
in use fails to bind and exits 2 with :class:`PortInUse` naming the port, instead of
sharing it silently. The standard health service and server reflection are
registered next to the Coordinator service (``spherecal.coordinator.server.health``).

Threading (issue #14): the server is ``grpc.aio`` on an event loop of its own
(:mod:`spherecal.coordinator.server.aio_server`). ``Presence`` and ``NextInstruction`` are
coroutines
that hold no thread while they wait; every other handler is a coroutine too, but
hands the synchronous service call to a worker thread (``loop.run_in_executor``), so
aborts, trailing metadata and cancellation are handled on the loop, where the aio
``ServicerContext`` lives.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, NoReturn, TypeVar

import grpc
from cryptography import x509

from spherecal.coordinator.errors import ServiceError, status_for
from spherecal.coordinator.server.aio_server import CoordinatorServer, RequestBridge
from spherecal.coordinator.server.health import HealthReporter, enable_reflection
from spherecal.coordinator.server.revocation import CrlStamp, RevocationList
from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Peer
from spherecal.coordinator.state.store import Store
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.address import is_loopback, split_host_port
from spherecal.proto.identity import CertificateError, certificate_identity

__all__ = ["SERVICE_NAME", "CoordinatorServer", "PortInUse", "build_server", "ensure_port_free"]

SERVICE_NAME = "spherecal.v1.Coordinator"
POLL_THREADS = 4
"""Threads that evaluate woken long polls (``Board.wait_instruction_async``): a few
suffice (the work holds the GIL); a thread per poll is what issue #14 removed."""


class PortInUse(ValueError):
    """The listen address cannot be bound (another process holds the port)."""


log = logging.getLogger("spherecal.coordinator")
T = TypeVar("T")


class _PeerCache:
    """Parse each client certificate once (the same bytes arrive on every call), and
    refuse revoked ones on every call (the CRL may change while a peer stays)."""

    def __init__(self, revocation: RevocationList | None = None) -> None:
        self._lock = threading.Lock()
        self._cache: dict[bytes, tuple[str, int]] = {}
        self._revocation = revocation

    def peer(self, context: grpc.aio.ServicerContext[Any, Any]) -> Peer:
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
                raise ServiceError(
                    grpc.StatusCode.UNAUTHENTICATED, f"bad client certificate: {exc}"
                ) from None
            with self._lock:
                if len(self._cache) > 4096:
                    self._cache.clear()
                self._cache[pem] = known
        identity, serial = known
        if self._revocation is not None and self._revocation.is_revoked(serial):
            raise ServiceError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"the client certificate of {identity!r} (serial {serial:x}) is revoked",
            )
        return Peer(identity=identity, certificate_pem=pem, address=context.peer())


class _Malformed:
    """A request whose bytes did not parse (answered INVALID_ARGUMENT)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _safe_parser(message_type: Any) -> Callable[[bytes], Any]:
    name = message_type.DESCRIPTOR.name

    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception as exc:  # DecodeError and friends: bad input
            return _Malformed(f"malformed {name}: {type(exc).__name__}")

    return parse


class _Parsed:
    """A request stream that raises INVALID_ARGUMENT at the first undecodable message.
    ``cancelled`` is its call's (:attr:`RequestBridge.cancelled`): a handler that waits
    without reading (a masked upload waiting for a slot) looks there."""

    def __init__(self, bridge: RequestBridge) -> None:
        self._bridge = bridge
        self._messages = iter(bridge)

    def __iter__(self) -> _Parsed:
        return self

    def __next__(self) -> Any:
        message = next(self._messages)
        if isinstance(message, _Malformed):
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message.reason)
        return message

    @property
    def cancelled(self) -> bool:
        return self._bridge.cancelled


#: (method, request streams, response streams, request type, response type)
_METHODS: tuple[tuple[str, bool, bool, Any, Any], ...] = (
    ("Join", False, False, pb.JoinRequest, pb.JoinReply),
    ("Heartbeat", False, False, pb.HeartbeatRequest, pb.HeartbeatReply),
    ("Presence", False, True, pb.HeartbeatRequest, pb.HeartbeatReply),
    ("NextInstruction", False, False, pb.InstructionRequest, pb.Instruction),
    ("DownloadTensor", False, True, pb.DownloadRequest, pb.TensorChunk),
    ("UploadTensor", True, False, pb.TensorUpload, pb.UploadReceipt),
    ("SubmitSecAgg", False, False, pb.SecAggSubmission, pb.Receipt),
    ("UploadMasked", True, False, pb.MaskedUpload, pb.UploadReceipt),
    ("ReportEvaluation", False, False, pb.EvaluationReport, pb.Receipt),
    ("ReportFailure", False, False, pb.FailureReport, pb.Receipt),
    ("GetStatus", False, False, pb.StatusRequest, pb.StatusReply),
    ("GetFederationStatus", False, False, pb.FederationStatusRequest, pb.FederationStatus),
)


def _handlers(servicer: _Servicer) -> dict[str, grpc.RpcMethodHandler]:
    """The Coordinator's method handlers with safe request deserializers."""
    factories = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    return {
        name: factories[(streams_in, streams_out)](
            getattr(servicer, name),
            request_deserializer=_safe_parser(request_type),
            response_serializer=response_type.SerializeToString,
        )
        for name, streams_in, streams_out, request_type, response_type in _METHODS
    }


class _Servicer:
    """Maps each RPC to the service core (every handler a coroutine on the loop)."""

    def __init__(
        self,
        service: CoordinatorService,
        revocation: RevocationList | None,
        calls: futures.Executor,
        polls: futures.Executor,
    ) -> None:
        self.service = service
        self._peers = _PeerCache(revocation)
        self._calls = calls
        self._polls = polls

    async def _call(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        request: Any,
        fn: Callable[[Peer], T],
        pool: futures.Executor | None,
    ) -> T:
        """``fn(peer)`` on a worker thread of ``pool`` (inline on the loop when None:
        only for calls that take a short lock and never wait); an exception is
        answered with its documented code."""
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        try:
            try:
                peer = self._peers.peer(context)
            except ServiceError as refused:
                self.service.peer_refusals.refuse(context.peer(), refused)
                raise
            if pool is None:
                return fn(peer)
            return await asyncio.get_running_loop().run_in_executor(pool, fn, peer)
        except Exception as exc:  # never leak internals to callers
            failure = exc
        await self._abort_for(context, failure)

    async def _abort_for(
        self, context: grpc.aio.ServicerContext[Any, Any], exc: Exception
    ) -> NoReturn:
        """Answer ``exc`` with its documented code (always raises, via abort)."""
        if context.cancelled():  # the client is gone (cancelled, deadline): quietly
            await context.abort(grpc.StatusCode.CANCELLED, "the call ended before its answer")
        mapped = status_for(exc)
        if mapped is not None:
            await context.abort(mapped.code, mapped.message, mapped.trailing_metadata())
        log.error("internal error in RPC", exc_info=exc)
        self.service.federation.say(f"internal error: {type(exc).__name__}: {exc}")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error (see coordinator log)")
        raise AssertionError("unreachable")  # abort raises

    async def _unary(
        self, context: grpc.aio.ServicerContext[Any, Any], request: Any, fn: Callable[[Peer], T]
    ) -> T:
        return await self._call(context, request, fn, self._calls)

    async def _upload(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        consume: Callable[[Iterator[Any], Peer], T],
    ) -> T:
        """A client-streamed upload: the service consumes the stream on a worker
        thread, one message read on the loop at a time (:class:`RequestBridge`)."""
        bridge = RequestBridge(context, asyncio.get_running_loop())
        try:
            return await self._call(
                context, None, lambda p: consume(_Parsed(bridge), p), self._calls
            )
        finally:
            bridge.close()  # cancelled: the worker's waiting read ends too

    async def Join(self, request: Any, context: Any) -> Any:
        return await self._unary(context, request, lambda p: self.service.join(request, p))

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return await self._unary(context, request, lambda p: self.service.heartbeat(request, p))

    async def Presence(self, request: Any, context: Any) -> None:
        """A coroutine per open stream: a reply every five heartbeat intervals until
        the client goes (the stream is cancelled) or the server stops; then the
        participant is gone at once, as it was with the synchronous server."""
        member = await self._call(
            context, request, lambda p: self.service.presence_open(request, p), None
        )
        interval = max(0.2, self.service.settings.timeouts.heartbeat_interval_s)
        try:
            while not context.done():
                await context.write(self.service.presence_reply(member))
                await asyncio.sleep(interval * 5)
        finally:
            self.service.presence_close(member)

    async def NextInstruction(self, request: Any, context: Any) -> Any:
        """Long poll: awaits the board's wake-up (no thread while it waits); the
        instruction is evaluated on a ``polls`` thread each time it may have changed."""
        member, wait_s = await self._call(
            context, request, lambda p: self.service.open_poll(request, p), None
        )
        try:
            board = self.service.federation.board
            instruction = await board.wait_instruction_async(
                member, wait_s, self._polls, request.caller.session
            )
            return self.service.answer_poll(member, request, instruction)
        except Exception as exc:
            failure = exc
        await self._abort_for(context, failure)

    async def DownloadTensor(self, request: Any, context: Any) -> None:
        # Authentication and lookup take short locks; the chunks are slices of a
        # frozen array (at most 2 MiB each), cut on the loop as they are written.
        chunks = await self._call(
            context, request, lambda p: self.service.download_tensor(request, p), None
        )
        try:
            for chunk in chunks:
                await context.write(chunk)
            return
        except Exception as exc:
            failure = exc
        await self._abort_for(context, failure)

    async def UploadTensor(self, request_iterator: Any, context: Any) -> Any:
        return await self._upload(context, self.service.upload_tensor)

    async def SubmitSecAgg(self, request: Any, context: Any) -> Any:
        return await self._unary(context, request, lambda p: self.service.submit_secagg(request, p))

    async def UploadMasked(self, request_iterator: Any, context: Any) -> Any:
        return await self._upload(context, self.service.upload_masked)

    async def ReportEvaluation(self, request: Any, context: Any) -> Any:
        return await self._unary(
            context, request, lambda p: self.service.report_evaluation(request, p)
        )

    async def ReportFailure(self, request: Any, context: Any) -> Any:
        return await self._unary(
            context, request, lambda p: self.service.report_failure(request, p)
        )

    async def GetStatus(self, request: Any, context: Any) -> Any:
        return await self._unary(context, request, lambda p: self.service.get_status(request, p))

    async def GetFederationStatus(self, request: Any, context: Any) -> Any:
        return await self._unary(
            context, request, lambda p: self.service.get_federation_status(request, p)
        )


CRL_STAMP_KEY = "crl_in_force"
"""The state database's ``meta`` key of the newest revocation list applied."""


def revocation_list(
    settings: CoordinatorSettings, *, report: Callable[[str], None], store: Store | None = None
) -> RevocationList | None:
    """The ``[tls] crl`` list, verified against ``client_ca`` (None without a CRL); with
    ``store``, never older than the newest list this coordinator applied before
    (``revocation.CrlStamp``), whose stamp it keeps there."""
    tls = settings.tls
    if tls.crl is None or settings.server.insecure:
        return None
    if tls.client_ca is None:
        raise ValueError("[tls] crl needs client_ca, the CA that signs it")
    if store is None:
        return RevocationList(tls.crl, tls.client_ca.read_bytes(), report=report)
    kept = store.get_meta(CRL_STAMP_KEY)
    try:
        newest = None if kept is None else CrlStamp.from_json(kept)
    except ValueError as exc:
        raise ValueError(f"the state database's {CRL_STAMP_KEY!r}: {exc}") from None

    def remember(stamp: CrlStamp) -> None:
        store.set_meta(CRL_STAMP_KEY, stamp.to_json())

    return RevocationList(
        tls.crl,
        tls.client_ca.read_bytes(),
        report=report,
        newest_applied=newest,
        on_applied=remember,
    )


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


def ensure_port_free(listen: str) -> None:
    """Raise :class:`PortInUse` now if another process listens on ``listen``'s port.

    Why before anything else: a second coordinator started with the same config must
    not open (and write) the first one's state database before it finds the port
    taken. ``build_server`` (``so_reuseport`` = 0) stays the authority; this is the
    early, cheap answer. Port 0 (any free port) needs no check."""
    host, port = split_host_port(listen)
    if port == 0:
        return
    error = _bind_error(host, port, listen, reuse_addr=True)
    if error is not None:
        raise error


def _bind_error(host: str, port: int, listen: str, *, reuse_addr: bool = False) -> PortInUse | None:
    """Why ``listen`` cannot be bound, in one line (probing the port once); None if
    the probe binds. ``reuse_addr`` tolerates a port in TIME_WAIT after a restart
    (a port some process listens on still refuses)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    if reuse_addr:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host.strip("[]") or "0.0.0.0", port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return PortInUse(
                f"cannot listen on {listen}: port {port} is already in use (another "
                "coordinator?); stop it or choose another [server] listen port"
            )
        return PortInUse(f"cannot listen on {listen}: {exc.strerror or exc}")
    finally:
        probe.close()
    if reuse_addr:
        return None
    return PortInUse(f"cannot listen on {listen} (port {port}); is the address local?")


def build_server(
    settings: CoordinatorSettings,
    service: CoordinatorService,
    *,
    health: HealthReporter | None = None,
) -> tuple[CoordinatorServer, int]:
    """A bound, not yet started server and its port; ``health`` (created here when
    not given) reports the federation's state to health checks.

    The server is ``grpc.aio`` on its own event-loop thread (module docstring);
    :class:`CoordinatorServer` has the ``start()`` / ``stop(grace).wait()`` API of
    ``grpc.Server``. A port in use raises :class:`PortInUse` and leaves no thread."""
    credentials = server_credentials(settings)
    workers = settings.server.max_workers or (len(settings.participants) + 16)
    limit = settings.server.max_message_bytes
    revocation = revocation_list(settings, report=service.federation.say, store=service.store)
    if revocation is not None:
        # A member whose own certificate is on the list has left: nothing waits for it
        # (the join window, a job's stages). At start — a certificate revoked while
        # this process was down (the registry has each member's last serial from the
        # store) — and at every reload.
        revocation.on_change = service.certificates_revoked
        service.certificates_revoked(revocation.serials)
    service.revocation = revocation
    calls = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc")
    polls = futures.ThreadPoolExecutor(max_workers=POLL_THREADS, thread_name_prefix="poll")
    servicer = _Servicer(service, revocation, calls, polls)
    listen = settings.server.listen
    host, wanted = split_host_port(listen)

    def make() -> grpc.aio.Server:
        server = grpc.aio.server(
            # Only for handlers that are not coroutines (none of ours: health and
            # reflection are their aio servicers); gRPC runs those there.
            migration_thread_pool=calls,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                # Never share a port with another process (gRPC's default would).
                ("grpc.so_reuseport", 0),
            ],
        )
        handlers = _handlers(servicer)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
        server.add_registered_method_handlers(SERVICE_NAME, handlers)
        (health or HealthReporter()).register(server)
        enable_reflection(server, SERVICE_NAME)
        return server

    def bind(server: grpc.aio.Server) -> int:
        try:
            if credentials is None:
                port = server.add_insecure_port(listen)
            else:
                port = server.add_secure_port(listen, credentials)
        except RuntimeError:  # grpcio >= 1.60 raises instead of returning 0
            port = 0
        if port == 0:
            raise _bind_error(host, wanted, listen) or PortInUse(f"cannot listen on {listen}")
        return port

    wrapper = CoordinatorServer(calls, polls)
    wrapper.build(make, bind)
    return wrapper, wrapper.port
