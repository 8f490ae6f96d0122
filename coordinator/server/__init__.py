"""The coordinator's RPC boundary: everything a call passes through.

``service``      RPC semantics and boundary validation, independent of gRPC
``uploads``      the two streamed uploads (plaintext tensors, masked inputs), chunk by chunk
``grpc_server``  the gRPC adapter, TLS / mutual TLS, message limits
``aio_server``   that server's event-loop thread and worker pools (grpc.aio)
``ids``          task and job identifiers as they arrive on the wire, checked exactly
``revocation``   the CA's CRL, verified, enforced on every call, reloaded on change
``peer_refusals``  calls refused for their client certificate: counted, logged, recorded
``status``       the operator's live view: connected, round, stage, refusals
``metrics``      the Prometheus metrics (names by Prometheus' conventions)
``probes``       the plain-HTTP listener: /metrics, /healthz, /readyz
``health``       standard gRPC health checking and server reflection
``traffic``      bytes on the wire per participant per stage
``log_limit``    rate limiting of repeated identical log lines
``native_log``   gRPC core's own lines (fd 2) through the same rate limit
"""
