"""Benchmarks that print JSON (never timed asserts in tests)."""
