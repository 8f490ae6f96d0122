"""The wire contract: ``spherecal.proto`` and its generated modules.

Tensors travel as dtype + shape + raw bytes (:mod:`spherecal.proto.codec`); nothing is
pickled. The generated ``*_pb2.py`` modules are committed (regenerate with
``python -m spherecal.proto._generate``) and a test fails when they are stale against the
``.proto``. :mod:`spherecal.proto.identity` holds the bytes both sides sign or parse for
identities (join proof, certificate extension).

``codec``           tensors and ``ModelSpec`` as dtype + shape + raw bytes
``identity``        the bytes both sides sign or parse for identities
``address``         ``host:port`` parsing and the loopback check
``error_detail``    typed error details as gRPC trailing metadata
``federation_end``  the statuses that end a federation, and which of them succeeded
``services``        the generated gRPC module, from one place
``task_context``    the digest of the task a secure job serves (every member's inputs)
``plan_terms``      a federation plan's terms: what both ends keep fixed for a federation
Generated and committed: ``spherecal_pb2`` (messages) and ``spherecal_pb2_grpc`` (stubs).
"""

from __future__ import annotations

# Nothing is defined here: the package is imported by every process, so it stays light.
