"""The participant process (filled by the service issue).

Holds the local data, trains with the federation's head, computes FFC/CCVR
statistics, runs the ``crypto`` secure-aggregation client, and dials out to the
coordinator over gRPC (pull model: a participant never listens).
"""
