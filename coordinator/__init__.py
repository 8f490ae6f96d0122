"""The coordinator process: gRPC service, federation driver, secure-aggregation
server, calibration, audit log and SQLite persistence. It only ever sees masked sums
(or, when a deployment turns secure aggregation off, ordered plaintext sums).

Three rooms, ordered (a room imports only rooms above it in this list; a test checks):

``evaluation_schedule``
              what the schedule asks of each site in evaluation releases, against
              the sites' limit (the settings check with it)
``settings``  every setting, as frozen dataclasses (TOML parsing: ``spherecal.config``)
``errors``    typed service errors and the gRPC status of each
``summary_schema``
              the shape of ``summary.json`` (TypedDicts), for its writer and readers
``state``     what the coordinator keeps: SQLite store and schema, the roster, spooled
              uploads, the state directory
``driver``    the federation: rounds, stages, secure jobs, calibration, evaluation,
              outputs, the honest final status
``server``    the RPC boundary: service semantics, gRPC/aio transport, auth of calls,
              revocation, metrics, health, the operator's status view
``main``      ``run_coordinator``: wire it all up and run one federation
"""
