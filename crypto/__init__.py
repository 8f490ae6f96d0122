"""Secure aggregation: pure, no I/O, no torch (filled by the crypto issue)."""
