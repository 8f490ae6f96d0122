"""Standard gRPC health checking and server reflection for the coordinator.

Why standard services: load balancers, Kubernetes probes, ``grpc_health_probe`` and
``grpcurl`` speak them without knowing spherecal. Health (``grpc.health.v1``) answers
SERVING for the overall server ("") and for ``spherecal.v1.Coordinator`` while the
federation runs, and NOT_SERVING once it has ended (the process then only lingers to
tell participants). Reflection lets ``grpcurl -plaintext HOST:PORT list`` show the
API. Both answer without a client certificate only where the transport allows it: on
a mutual-TLS listener the TLS handshake still requires one.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

__all__ = ["HealthReporter", "enable_reflection"]

_COORDINATOR = "spherecal.v1.Coordinator"


class HealthReporter:
    """The health servicer plus the one switch the coordinator flips."""

    def __init__(self) -> None:
        self.servicer: Any = health.HealthServicer()
        self.serving(True)

    def register(self, server: grpc.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def serving(self, running: bool) -> None:
        """SERVING while the federation runs, NOT_SERVING after it ended."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if running
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", _COORDINATOR):
            self.servicer.set(name, status)

    def shutdown(self) -> None:
        """Every watcher sees NOT_SERVING before the server stops."""
        self.servicer.enter_graceful_shutdown()


def enable_reflection(server: grpc.Server, *service_names: str) -> None:
    """Server reflection for ``service_names``, health and reflection itself."""
    names = (
        *service_names,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
