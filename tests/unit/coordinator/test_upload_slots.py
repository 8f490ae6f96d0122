"""Concurrent masked uploads per job: ``max_in_flight``, raised while ``in_flight_mb`` holds
the vectors (issue #24: with two slots the sites of a small statistics job queued)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.settings import SecAggSettings

from .helpers import finish_after_masked, make_job, masked_streams

MIB = 1 << 20


def test_upload_slots_follow_the_memory_budget() -> None:
    s = SecAggSettings()  # max_in_flight 2, in_flight_mb 256
    assert s.upload_slots(7_582_728, 10) == 10  # FFC at l = 1280: all ten at once
    assert s.upload_slots(7_582_728, 100) == 35  # 256 MiB / 7.58 MB
    assert s.upload_slots(105_472_800, 4) == 2  # CCVR at l = 512: the floor
    assert s.upload_slots(1_000, 1) == 2  # never below max_in_flight
    assert SecAggSettings(in_flight_mb=0).upload_slots(8, 50) == 2
    assert SecAggSettings(max_in_flight=5, in_flight_mb=1).upload_slots(MIB // 2, 3) == 5
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="in_flight_mb"):
            SecAggSettings(in_flight_mb=bad)


def _interleaved_uploads(in_flight_mb: float) -> tuple[int, int, int, np.ndarray, np.ndarray]:
    """Every participant streams at once, chunk by chunk in turn; a refused one retries
    from the start. Returns (slots, refusals, peak bytes held, result, expected)."""
    n, length = 6, 20_000
    job, clients = make_job(
        n, length, threshold=4, chunk_entries=4096, max_in_flight=2, in_flight_mb=in_flight_mb
    )
    rng = np.random.default_rng(3)
    inputs = {p: rng.uniform(-5, 5, length) for p in clients}
    pending = masked_streams(job, clients, inputs)
    refused, peak, started = 0, 0, set()
    while pending:
        for p in list(pending):
            chunk = next(pending[p], None)
            if chunk is None:
                assert job.end_upload(p)
                del pending[p]
                continue
            if p not in started:
                job.begin_upload(p)
                started.add(p)
            try:
                job.absorb(p, chunk.to_bytes())
            except ServiceError as exc:
                assert exc.code is grpc.StatusCode.UNAVAILABLE  # busy: retry later
                refused += 1
                job.end_upload(p)
                started.discard(p)
                pending[p] = clients[p].masked_chunks()
            peak = max(peak, job.server.memory_bytes())
    outcome = finish_after_masked(job, clients)
    expected = np.sum(list(inputs.values()), axis=0)
    return job.server.max_in_flight, refused, peak, np.asarray(outcome.values), expected


def test_a_small_job_takes_every_upload_at_once_within_the_budget() -> None:
    vector = 8 * 20_000
    slots, refused, peak, got, expected = _interleaved_uploads(in_flight_mb=1.0)
    assert slots == 6 and refused == 0  # 1 MiB holds six 160 kB vectors
    assert peak <= vector + MIB  # the accumulator plus at most the budget
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # Without the budget the same uploads queue behind two slots (the same sum).
    slots, refused, peak, got, expected = _interleaved_uploads(in_flight_mb=0.0)
    assert slots == 2 and refused > 0 and peak <= 3 * vector
    np.testing.assert_allclose(got, expected, atol=1e-6)
