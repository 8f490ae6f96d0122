"""The coordinator process: gRPC service, federation driver, secure-aggregation
server, calibration, audit log and SQLite persistence. It only ever sees masked sums
(or, when a deployment turns secure aggregation off, ordered plaintext sums).

Modules, one idea each:

``settings``     every setting, as frozen dataclasses (TOML parsing: ``spherecal.config``)
``federation``   the driver: rounds → statistics → calibration → evaluation → outputs
``board``        the shared state RPC handlers read ("what does participant p do next?")
``resume``       open the state directory or resume after the last completed round
``stages``       waiting on tasks, driving secure jobs, the one aggregation helper
``rounds``       the training rounds: selection, server step, checkpoint
``calibrating``  statistics jobs and the FFC / CCVR solve
``outputs``      saved models and the JSON summary
``tasks``        work handed to participants (train / statistics / evaluate)
``secure_job``   one ``crypto.SecAggServer`` job with deadlines, liveness, streaming
``spool``        plaintext uploads spooled and summed in roster order (determinism)
``strategy``     adapter around spherefed.algorithms' one registry: named sums laid out
                 in the aggregation vector, broadcasts, resumable server state
``calibration``  FFC and CCVR from aggregated statistics
``model``        the global network's layout, checkpoints, saved models
``evaluation``   federated evaluation, and central when the coordinator has test data
``registry``     roster, join proofs, pinned identity keys, sessions, liveness
``service``      RPC semantics and boundary validation, independent of gRPC
``grpc_server``  the gRPC adapter, TLS / mutual TLS, message limits
``aio_server``   that server's event-loop thread and worker pools (grpc.aio)
``revocation``   the CA's CRL, verified, enforced on every call, reloaded on change
``store``        SQLite (one writer thread): participants, rounds, jobs, audit, events
``traffic``      bytes on the wire per participant per stage
``errors``       typed service errors and the gRPC status of each
``main``         ``run_coordinator``: wire it all up and run one federation
"""
