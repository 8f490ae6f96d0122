"""The generated gRPC module, typed loosely on purpose.

Why a module of its own (not a name in ``proto/__init__.py``): ``ray[default]``
installs proto-plus, whose top-level package is also called ``proto``. In an
editable install run from outside the repository, Python finds proto-plus's
``proto/__init__.py`` first; our *submodules* are still found (by the editable
finder, proto-plus has none of their names), but a name defined in our
``__init__`` is not — ``spherecal participant`` then failed with "cannot import name
'grpc_services' from 'proto'". ``tests/unit/proto/test_outside_the_repo.py`` imports
the gRPC clients from another directory.
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
