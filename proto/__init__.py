"""The wire contract: ``spherecal.proto`` and its generated modules.

Tensors travel as dtype + shape + raw bytes (:mod:`proto.codec`); nothing is
pickled. The generated ``*_pb2.py`` modules are committed (regenerate with
``python -m proto._generate``) and a test fails when they are stale against the
``.proto``. :mod:`proto.identity` holds the bytes both sides sign or parse for
identities (join proof, certificate extension).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["grpc_services"]


def grpc_services() -> Any:
    """The generated ``spherecal_pb2_grpc`` module (stub, servicer, registration).

    Imported dynamically because grpc's generated code is untyped and our mypy
    settings refuse untyped definitions; callers wrap what they use in typed code.
    """
    return importlib.import_module("proto.spherecal_pb2_grpc")
