"""The wire contract: ``spherecal.proto`` and its generated modules.

Tensors travel as dtype + shape + raw bytes (:mod:`proto.codec`); nothing is
pickled. The generated ``*_pb2.py`` modules are committed (regenerate with
``python -m proto._generate``) and a test fails when they are stale against the
``.proto``. :mod:`proto.identity` holds the bytes both sides sign or parse for
identities (join proof, certificate extension).
"""

from __future__ import annotations

# Nothing is defined here: see proto/services.py for why (proto-plus's ``proto``).
