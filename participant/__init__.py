"""The participant process: local data, training, statistics, the ``crypto``
secure-aggregation client, and the gRPC client (pull model: it never listens).

Modules, one idea each:

``settings``        every setting, as frozen dataclasses (TOML parsing: ``spherecal.config``)
``runner``          the main loop: join, pull instructions, act, push results, reconnect
``transport``       the transport protocol (gRPC in deployments, in-process in unit tests)
``grpc_transport``  the gRPC transport (TLS / mutual TLS; plaintext on loopback only)
``data``            local data, or this participant's slice of a shared dataset
``trainer``         local training, statistics and evaluation (as the reference runner)
``algorithm_state`` the participant's own algorithm state (SCAFFOLD's c_k) on disk
``secure``          one secure-aggregation job over the network; persistent job ledger
``trust``           verifying peers' identity keys against the federation CA
``faults``          fault injection (halt at a protocol stage) for tests and simulate
``main``            ``run_participant``: wire it all up and run until done
"""
