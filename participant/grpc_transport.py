"""The participant's gRPC transport: one channel to the coordinator, TLS or (on
loopback only) plaintext.

With TLS the participant verifies the coordinator's certificate against its CA and
presents its own client certificate (mutual TLS). ``insecure`` is refused unless the
coordinator address is a loopback address, so a misconfigured participant cannot
send its masked data, keys or even its identity over a network in the clear.

A channel whose connection attempt failed is replaced at the next call
(:class:`ChannelKeeper`: the one rule of this transport and of the asyncio one,
``spherecal.participant.loop_transport``), so every attempt of the site's own back-off
is a real connection attempt, however long gRPC's own back-off has grown.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc

from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.transport import StubCalls, TransportError
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.address import is_loopback_address
from spherecal.proto.error_detail import reason_from_metadata
from spherecal.proto.services import grpc_services

__all__ = [
    "ChannelKeeper",
    "GrpcTransport",
    "channel_options",
    "client_certificate_hint",
    "credentials_for",
    "is_loopback_address",
    "reconnect_backoff_options",
    "tls_failure_hint",
]

T = TypeVar("T")
C = TypeVar("C")


def credentials_for(settings: ParticipantSettings) -> grpc.ChannelCredentials | None:
    if settings.insecure:
        if not is_loopback_address(settings.coordinator):
            raise ValueError(
                f"insecure mode is only allowed for a loopback coordinator address, not "
                f"{settings.coordinator!r}; configure [tls] (see `spherecal certs`)"
            )
        return None
    tls = settings.tls
    if tls.ca is None or tls.cert is None or tls.key is None:
        raise ValueError("TLS needs [tls] ca, cert and key (mutual TLS with the coordinator)")
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=tls.key.read_bytes(),
        certificate_chain=tls.cert.read_bytes(),
    )


def tls_failure_hint(details: str, *, server_name: str, ca: str) -> str:
    """What to fix when gRPC's failure text is the coordinator's certificate failing
    verification — gRPC reports it as UNAVAILABLE ("failed to connect to all
    addresses"), like an outage, though no retry will help; "" for anything else.
    ``server_name`` and ``ca`` name the caller's setting (a config key or an option)."""
    if "Hostname Verification Check failed" in details:
        return (
            "the coordinator's certificate does not name the address dialled: set "
            f"{server_name} to a name it was issued for (`spherecal certs init --host NAME`)"
        )
    for said, what in (("certificate has expired", "expired"), ("not yet valid", "not yet valid")):
        if "CERTIFICATE_VERIFY_FAILED" in details and said in details:
            # OpenSSL says it of any certificate in the chain: the coordinator's, or
            # the CA one (valid at this side's start-up check, it ended since)
            return (
                f"the coordinator's certificate, or the CA certificate in {ca} that issued "
                f"it, is {what} by this machine's clock: check the clock; the CA's operator "
                "renews whichever it is (a new CA certificate goes to every site)"
            )
    if any(m in details for m in ("CERTIFICATE_VERIFY_FAILED", "BAD_SIGNATURE")):
        return (
            f"the coordinator's certificate does not verify against {ca}: use the CA that issued it"
        )
    return ""


def client_certificate_hint(
    details: str, *, cert: Path | None, ca: Path | None, cert_name: str, ca_name: str
) -> str:
    """What to fix when the coordinator closed the connection during the TLS handshake
    and this side's own certificate is not issued by the CA it trusts for the
    coordinator; "" otherwise.

    Why: a server that refuses a client certificate ends the handshake with no reason
    the client sees — gRPC says only "Socket closed", like an outage. The federation's
    one CA (``spherecal certs init``) issues the coordinator's certificate and every
    site's (``spherecal certs issue``), so a site certificate that ``ca`` did not
    issue is the likeliest cause, and one the site can check alone. ``cert_name`` and
    ``ca_name`` name the caller's settings. A certificate that is no longer (or not
    yet) valid is named the same way: one that ended while the process ran, after
    its start-up check."""
    if "Socket closed" not in details or cert is None or ca is None:
        return ""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    try:
        own = x509.load_pem_x509_certificate(cert.read_bytes())
        authorities = x509.load_pem_x509_certificates(ca.read_bytes())
    except (OSError, ValueError):
        return ""  # unreadable now: the start-up checks named such files already
    now = dt.datetime.now(dt.UTC)
    if not own.not_valid_before_utc <= now <= own.not_valid_after_utc:
        # valid at start (checked there), but it ended while this process ran
        return (
            f"the coordinator closed the connection during the TLS handshake, and "
            f"{cert_name} is valid only from {own.not_valid_before_utc:%Y-%m-%d %H:%M} to "
            f"{own.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: ask the CA's operator for a new "
            "one (`spherecal certs request`, then `spherecal certs issue --csr`)"
        )
    for authority in authorities:
        try:
            own.verify_directly_issued_by(authority)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return ""
    return (
        f"the coordinator closed the connection during the TLS handshake, and {cert_name} "
        f"(issued by {own.issuer.rfc4514_string()}) is not issued by {ca_name}: a "
        "coordinator that trusts only the federation's CA refuses it; use a certificate "
        "that CA issued (`spherecal certs issue`)"
    )


def reconnect_backoff_options(settings: ParticipantSettings) -> list[tuple[str, int]]:
    """gRPC's own connection back-off, held to the site's (``Backoff``): it starts at
    0.2 s (or ``reconnect_max_s`` when smaller) and never exceeds ``reconnect_max_s``,
    instead of gRPC's 1 s growing to 120 s.

    Why both and not ``grpc.min_reconnect_backoff_ms`` too: gRPC core reads that one as
    the least time it gives one connection attempt to complete (20 s by default) —
    lowering it to the site's 0.2 s would cut off a TLS handshake over a slow network.
    These two only bound the *waits between* gRPC's attempts. They matter where a call
    meets a failed channel that is not replaced (both transports replace it:
    :class:`ChannelKeeper`; a grpcio that does not answer the sync channel's
    connectivity leaves it), and for gRPC's background attempts while the site itself
    waits."""
    maximum_ms = max(1, round(settings.reconnect_max_s * 1000))
    return [
        ("grpc.initial_reconnect_backoff_ms", min(200, maximum_ms)),
        ("grpc.max_reconnect_backoff_ms", maximum_ms),
    ]


def channel_options(settings: ParticipantSettings) -> list[tuple[str, Any]]:
    """The channel options of every participant transport (sync or asyncio)."""
    limit = settings.max_message_bytes
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.enable_retries", 0),
        # One connection per participant even when many share a process (the
        # Ray engine's virtual participants): a dropped participant drops its
        # own connection, as a separate process would, not a shared one. It also
        # gives a replaced channel (ChannelKeeper) a fresh subchannel, not the
        # failed one with its back-off.
        ("grpc.use_local_subchannel_pool", 1),
        *reconnect_backoff_options(settings),
    ]
    if not settings.insecure and settings.tls.server_name:
        options.append(("grpc.ssl_target_name_override", settings.tls.server_name))
    return options


def _connectivity(channel: grpc.Channel) -> grpc.ChannelConnectivity | None:
    """The channel's connectivity now, asked synchronously; None where this grpcio
    does not answer (its channel is then never replaced: the behaviour before).

    Why not ``channel.subscribe``, gRPC's public way to learn it: a subscription starts
    a polling thread per channel, and a subscribed channel dropped while its thread
    polls can hang the process's exit — a site sent SIGTERM during its reconnect loop
    then never exited, its main thread waiting in the dropped channel's finalizer.
    This asks what that thread asks (``check_connectivity_state`` of the channel's
    core, without trying to connect), only when a call is about to be made, and
    starts no thread; ``tests/unit/participant/test_grpc_reconnect.py`` fails if a
    grpcio upgrade stops answering it."""
    try:
        state = channel._channel.check_connectivity_state(False)  # private: see above
        from grpc import _common

        return _common.CYGRPC_CONNECTIVITY_STATE_TO_CHANNEL_CONNECTIVITY[state]
    except (AttributeError, ImportError, KeyError, TypeError, ValueError):
        return None


_FAILED = grpc.ChannelConnectivity.TRANSIENT_FAILURE
"""The one state in which a channel is replaced (:class:`ChannelKeeper`)."""


class ChannelKeeper(Generic[C]):
    """A transport's one channel to the coordinator at a time, replaced by a new one
    before a call when its last connection attempt failed — the rule of both
    participant transports (:class:`GrpcTransport`, and the asyncio
    ``LoopTransport`` of a host of many participants), each giving how it opens,
    asks and closes its kind of channel.

    Why the channel is replaced: a gRPC channel whose connection attempt failed waits
    out its own back-off (1 s growing ×1.6 up to 120 s by default) before it tries
    again, and fails every call at once with UNAVAILABLE meanwhile — whatever the
    site's own back-off (:class:`~spherecal.participant.backoff.Backoff`). A site
    whose coordinator was down for a minute then kept failing for up to two more after
    it came back (the coordinator listening at 13:31:38, an attempt at 13:31:43 refused
    with "Connection refused", the join at 13:31:58). So before each call, a channel
    in TRANSIENT_FAILURE is closed and a new one made: a new channel (with its own
    subchannel: ``grpc.use_local_subchannel_pool``) connects at its first call, so
    each attempt of the site's back-off is a real connection attempt, and the first
    one after the coordinator is listening succeeds.

    Why not the alternatives alone: capping gRPC's back-off with channel options
    (:func:`reconnect_backoff_options`, set as well) leaves two jittered back-offs that
    cannot be aligned — an attempt can still fall inside gRPC's wait and fail; asking
    the channel to connect (``channel_ready_future``, ``try_to_connect``) does not cut
    short a back-off already running, and gRPC's Python API has no call that resets it;
    replacing the channel after *every* failed attempt, whatever the channel's state,
    would also drop a live connection — and with it the site's presence stream, so the
    coordinator would count a site that only met a slow call as gone. Nothing in
    flight is lost by the replacement: a channel in TRANSIENT_FAILURE has no
    connection, so every call on it has already failed. A state of ``None`` (not
    known) keeps the channel: the behaviour before 2026-11-27.

    ``open_channel``, ``state`` and ``close_channel`` are called under this keeper's
    lock, from the thread about to make a call (never the asyncio loop's own thread:
    the asyncio transport opens and closes its channels *on* that loop, waiting for
    it), so a channel is never asked or replaced while another thread closes it."""

    def __init__(
        self,
        open_channel: Callable[[], C],
        state: Callable[[C], grpc.ChannelConnectivity | None],
        close_channel: Callable[[C], None],
    ) -> None:
        self._open = open_channel
        self._state = state
        self._close = close_channel
        self._lock = threading.Lock()
        self._channel = open_channel()
        self._stub = grpc_services().CoordinatorStub(self._channel)
        self._closed = False
        self.opened = 1
        """How many channels were made (the first, then one per replacement)."""

    @property
    def closed(self) -> bool:
        return self._closed

    def stub(self) -> Any:
        """The current channel's stub, replacing a failed channel first (see the class)."""
        with self._lock:
            if not self._closed and self._state(self._channel) is _FAILED:
                old, self._channel = self._channel, self._open()
                self._stub = grpc_services().CoordinatorStub(self._channel)
                self.opened += 1
                self._close(old)
            return self._stub

    def close(self) -> None:
        """Close the current channel (once); no channel is made after this."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close(self._channel)


class GrpcTransport(StubCalls):
    """The synchronous transport of a site process: one channel to the coordinator at a
    time, replaced by a new one when its connection attempt failed
    (:class:`ChannelKeeper`; its state asked by :func:`_connectivity`)."""

    def __init__(self, settings: ParticipantSettings) -> None:
        credentials = credentials_for(settings)
        options = channel_options(settings)
        target = settings.coordinator

        def open_channel() -> grpc.Channel:
            if credentials is None:
                return grpc.insecure_channel(target, options=options)
            return grpc.secure_channel(target, credentials, options=options)

        self._channels: ChannelKeeper[grpc.Channel] = ChannelKeeper(
            open_channel, _connectivity, lambda channel: channel.close()
        )
        self._timeout = settings.rpc_timeout_s
        self._long_poll_s = settings.long_poll_ms / 1000.0

    @property
    def channels_opened(self) -> int:
        """How many channels this transport made (the first, then one per replacement)."""
        return self._channels.opened

    @property
    def _stub(self) -> Any:
        """The current channel's stub, replacing a failed channel first."""
        return self._channels.stub()

    def _unary(self, fn: Callable[..., T], request: object, timeout: float | None = None) -> T:
        try:
            return fn(request, timeout=timeout or self._timeout)
        except grpc.RpcError as exc:
            raise to_transport_error(exc) from None

    def presence(self, request: pb.HeartbeatRequest) -> _GrpcPresence:
        return _GrpcPresence(self._stub.Presence(request))

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        return self._unary(
            self._stub.NextInstruction, request, timeout=self._long_poll_s + self._timeout
        )

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]:
        try:
            yield from self._stub.DownloadTensor(request, timeout=self._timeout * 10)
        except grpc.RpcError as exc:
            raise to_transport_error(exc) from None

    def close(self) -> None:
        self._channels.close()


class _GrpcPresence:
    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[pb.HeartbeatReply]:
        try:
            yield from self._call
        except grpc.RpcError as exc:
            raise to_transport_error(exc) from None

    def cancel(self) -> None:
        self._call.cancel()


def to_transport_error(exc: grpc.RpcError) -> TransportError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    metadata = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return TransportError(
        code or grpc.StatusCode.UNKNOWN, details or "", reason=reason_from_metadata(metadata)
    )
