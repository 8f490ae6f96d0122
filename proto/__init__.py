"""The wire contract: ``spherecal.proto`` and its generated modules.

Filled by the service issue. Tensors travel as dtype + shape + raw bytes; nothing is
pickled. The generated ``*_pb2.py`` modules are committed and a test fails when they
are stale against the ``.proto``.
"""
