"""The generated gRPC module (stub, servicer, registration), typed by its committed stub.

Kept as one accessor so that every caller takes the gRPC module from one place; the
module now lives inside the ``spherecal`` namespace (``spherecal.proto``), so no
other distribution's top-level ``proto`` (proto-plus) can shadow it.
"""

from __future__ import annotations

from types import ModuleType

from spherecal.proto import spherecal_pb2_grpc

__all__ = ["grpc_services"]


def grpc_services() -> ModuleType:
    """The generated ``spherecal_pb2_grpc`` module (stub, servicer, registration)."""
    return spherecal_pb2_grpc
