"""Each participant's SecAggJob instruction carries only the directory entries it needs.

``SecureJob.job_message(p)`` sends the entries of ``crypto.keys_needed(spec, p)`` —
on a Harary graph the closed 2-hop neighbourhood, O(k) of the n — instead of the
whole directory (under TLS: n certificates, each verified by every participant).
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.errors import ServiceError
from spherecal.proto import spherecal_pb2 as pb

from .helpers import make_job, run_job


def _full_message(job_n: int) -> tuple[int, int]:
    """(bytes of p0's instruction, bytes with the whole directory) for a job of n."""
    job, _ = make_job(job_n, 8)
    everyone = {e.participant_id: e for p in job.spec.participants for e in job.directory_for(p)}
    entries = [everyone[p] for p in job.spec.participants]
    full = pb.SecAggJob(spec=job.spec_bytes, directory=entries, purpose=job.purpose)
    return job.job_message("p0").ByteSize(), full.ByteSize()


def test_a_job_message_at_n_200_carries_the_needed_entries_not_all_n() -> None:
    job, _ = make_job(200, 8)
    spec = job.spec
    k = spec.degree
    assert spec.graph == "harary" and spec.consistency_check
    for p in ("p0", "p7", "p123", "p199"):
        message = job.job_message(p)
        ids = [e.participant_id for e in message.directory]
        assert ids == sorted(crypto.keys_needed(spec, p))
        assert p in ids and set(spec.masking_graph.neighbours(p)) <= set(ids)
        assert len(ids) <= (k + 2) ** 2 and len(ids) < spec.n // 4  # O(k²) bound, not n
        if k % 2 == 0:  # the circulant's 2-hop ball: 2k + 1
            assert len(ids) == 2 * k + 1
        for e in message.directory:  # the same entry for a peer in every message
            own = next(
                x
                for x in job.directory_for(e.participant_id)
                if x.participant_id == e.participant_id
            )
            assert e == own and len(e.identity_public_key) == 32
        assert message.spec == job.spec_bytes  # the spec (all n ids) is unchanged
    assert job.directory_for("p7") is job.directory_for("p7")  # computed once
    small, full = _full_message(200)
    assert 3 * small < full


def test_complete_graph_jobs_carry_everyone() -> None:
    job, _ = make_job(5, 8, threshold=3)
    assert job.spec.graph == "complete"
    for p in job.spec.participants:
        assert [e.participant_id for e in job.job_message(p).directory] == list(
            job.spec.participants
        )


def test_a_stranger_has_no_job_message() -> None:
    job, _ = make_job(40, 8)
    with pytest.raises(ServiceError) as info:
        job.job_message("nobody")
    assert info.value.code is grpc.StatusCode.INTERNAL


@pytest.mark.parametrize(
    "drop",
    [
        {"p3": "advertise", "p17": "masked", "p30": "unmask"},
        {"p5": "share", "p21": "consistency"},
    ],
)
def test_a_harary_job_whose_participants_hold_only_their_entries_sums_exactly(
    drop: dict[str, str],
) -> None:
    # make_job gives each participant exactly its instruction's directory entries
    job, clients = make_job(40, 64, chunk_entries=32)
    assert job.spec.graph == "harary"
    rng = np.random.default_rng(3)
    inputs = {p: rng.uniform(-5, 5, 64) for p in clients}
    run_job(job, clients, inputs, drop=drop)
    outcome = job.outcome
    assert outcome is not None and outcome.status == "done", outcome
    gone = {p for p, s in drop.items() if s in ("advertise", "share", "masked")}
    assert set(outcome.contributors) == set(clients) - gone
    ring = np.zeros(64, dtype=np.uint64)
    for p in outcome.contributors:
        ring += crypto.encode(
            inputs[p], scale_bits=job.spec.scale_bits, bound=job.spec.bound, length=64
        )
    expected = crypto.decode(ring, scale_bits=job.spec.scale_bits)
    assert np.asarray(outcome.values).tobytes() == expected.tobytes()
