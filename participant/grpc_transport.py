"""The participant's gRPC transport: one channel to the coordinator, TLS or (on
loopback only) plaintext.

With TLS the participant verifies the coordinator's certificate against its CA and
presents its own client certificate (mutual TLS). ``insecure`` is refused unless the
coordinator address is a loopback address, so a misconfigured participant cannot
send its masked data, keys or even its identity over a network in the clear.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc

from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.transport import StubCalls, TransportError
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.address import is_loopback_address
from spherecal.proto.error_detail import reason_from_metadata
from spherecal.proto.services import grpc_services

__all__ = [
    "GrpcTransport",
    "channel_options",
    "client_certificate_hint",
    "credentials_for",
    "is_loopback_address",
    "tls_failure_hint",
]

T = TypeVar("T")


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
        # own connection, as a separate process would, not a shared one.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if not settings.insecure and settings.tls.server_name:
        options.append(("grpc.ssl_target_name_override", settings.tls.server_name))
    return options


class GrpcTransport(StubCalls):
    def __init__(self, settings: ParticipantSettings) -> None:
        credentials = credentials_for(settings)
        options = channel_options(settings)
        if credentials is None:
            self._channel = grpc.insecure_channel(settings.coordinator, options=options)
        else:
            self._channel = grpc.secure_channel(settings.coordinator, credentials, options=options)
        self._stub = grpc_services().CoordinatorStub(self._channel)
        self._timeout = settings.rpc_timeout_s
        self._long_poll_s = settings.long_poll_ms / 1000.0

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
        self._channel.close()


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
