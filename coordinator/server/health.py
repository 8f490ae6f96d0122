"""Standard gRPC health checking and server reflection for the coordinator.

Why standard services: load balancers, Kubernetes probes, ``grpc_health_probe`` and
``grpcurl`` speak them without knowing spherecal. Health (``grpc.health.v1``) answers
SERVING for the overall server ("") and for ``spherecal.v1.Coordinator`` while the
federation runs, and NOT_SERVING once it has ended (the process then only lingers to
tell participants). Reflection lets ``grpcurl -plaintext HOST:PORT list`` show the
API. Both answer without a client certificate only where the transport allows it: on
a mutual-TLS listener the TLS handshake still requires one (the HTTP ``/healthz`` and
``/readyz`` probes of :mod:`spherecal.coordinator.server.probes` need none).

Reflection is served as both ``grpc.reflection.v1`` (newer grpcurl and grpc-js
clients) and ``grpc.reflection.v1alpha`` (older ones). ``grpcio-reflection`` ships
only v1alpha; the two protocols are the same messages under another package (the
v1 ``.proto`` was copied from v1alpha), so v1 is the same servicer registered under
the v1 method path, and the v1 file descriptor — v1alpha's, renamed — is added to
the descriptor pool so that v1 clients can also *describe* the v1 service.

The server is ``grpc.aio`` (issue #14), so health is grpc_health's asyncio servicer,
whose ``set`` is a coroutine on the server's loop; :class:`HealthReporter` keeps the
blocking API the driver thread calls and runs each change on that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as alpha_pb2

__all__ = ["REFLECTION_V1", "REFLECTION_V1ALPHA", "HealthReporter", "enable_reflection"]

_COORDINATOR = "spherecal.v1.Coordinator"
REFLECTION_V1ALPHA = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


class HealthReporter:
    """The health servicer plus the one switch the coordinator flips (from any
    thread: the change runs on the server's loop and is in effect on return)."""

    def __init__(self) -> None:
        self.servicer: Any = health.aio.HealthServicer()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status = health_pb2.HealthCheckResponse.SERVING

    def register(self, server: grpc.aio.Server) -> None:
        """Add the servicer to ``server``; called on the server's loop."""
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        self._loop = asyncio.get_running_loop()
        self._loop.create_task(self._set_all(self._status))

    async def _set_all(self, status: Any) -> None:
        for name in ("", _COORDINATOR):
            await self.servicer.set(name, status)

    def _on_loop(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # not serving (yet, or any more): applied at register / moot
        if _running_in(loop):
            loop.create_task(make())
            return
        # The loop stopped meanwhile (RuntimeError), or stops before running it: the
        # server is going away, and its health with it.
        with contextlib.suppress(RuntimeError, TimeoutError):
            asyncio.run_coroutine_threadsafe(make(), loop).result(timeout=10)

    def serving(self, running: bool) -> None:
        """SERVING while the federation runs, NOT_SERVING after it ended."""
        self._status = (
            health_pb2.HealthCheckResponse.SERVING
            if running
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        status = self._status
        self._on_loop(lambda: self._set_all(status))

    def shutdown(self) -> None:
        """Every watcher sees NOT_SERVING before the server stops."""
        self._status = health_pb2.HealthCheckResponse.NOT_SERVING
        self._on_loop(self.servicer.enter_graceful_shutdown)


def _running_in(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _add_v1_descriptor() -> None:
    """Put ``grpc/reflection/v1/reflection.proto`` into the default pool (once):
    v1alpha's file with the package renamed, as the upstream v1 file is."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    proto.name, proto.package = _V1_FILE, "grpc.reflection.v1"
    proto.ClearField("options")
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    pool.AddSerializedFile(proto.SerializeToString())


def enable_reflection(server: grpc.aio.Server, *service_names: str) -> None:
    """Server reflection, v1 and v1alpha, for ``service_names``, health and
    reflection itself."""
    _add_v1_descriptor()
    names = (
        *service_names,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        REFLECTION_V1,
        REFLECTION_V1ALPHA,
    )
    servicer = reflection.aio.ReflectionServicer(names)
    for service in (REFLECTION_V1ALPHA, REFLECTION_V1):
        handler = grpc.method_handlers_generic_handler(
            service,
            {
                "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                    servicer.ServerReflectionInfo,
                    request_deserializer=alpha_pb2.ServerReflectionRequest.FromString,
                    response_serializer=alpha_pb2.ServerReflectionResponse.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
