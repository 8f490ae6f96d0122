"""The coordinator process (filled by the service issue).

gRPC service, round state machine, secure-aggregation server, calibration, privacy
ledger, audit log and SQLite persistence. It only ever sees masked sums.
"""
