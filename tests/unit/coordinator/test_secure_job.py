"""SecureJob: the crypto server state machine under deadlines, liveness and streaming."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.secure_job import plan_graph
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.settings import SecAggSettings
from spherecal.proto import spherecal_pb2 as pb

from .helpers import make_job, masked_streams, run_job


def _inputs(n: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"p{k}": rng.uniform(-5, 5, length) for k in range(n)}


def _total(inputs: dict[str, np.ndarray]) -> np.ndarray:
    return np.sum(list(inputs.values()), axis=0)


def test_complete_job_returns_the_sum_of_all_inputs() -> None:
    job, clients = make_job(4, 1000, chunk_entries=256)
    inputs = _inputs(4, 1000)
    run_job(job, clients, inputs)
    assert job.outcome is not None and job.outcome.status == "done"
    expected = _total(inputs)
    np.testing.assert_allclose(
        np.asarray(job.outcome.values), expected, rtol=0, atol=4 * 2.0**-job.spec.scale_bits
    )
    assert job.outcome.contributors == ("p0", "p1", "p2", "p3")
    assert set(job.stage_seconds) == {"advertise", "share", "masked", "consistency", "unmask"}


@pytest.mark.parametrize(
    ("stage", "in_sum"),
    [("advertise", False), ("share", False), ("masked", False), ("unmask", True)],
)
def test_dropout_at_each_stage_still_sums_exactly_the_survivors(stage: str, in_sum: bool) -> None:
    job, clients = make_job(5, 700, threshold=3, chunk_entries=128)
    inputs = _inputs(5, 700, seed=1)
    run_job(job, clients, inputs, drop={"p2": stage})
    outcome = job.outcome
    assert outcome is not None and outcome.status == "done", outcome
    contributors = set(outcome.contributors)
    assert ("p2" in contributors) is in_sum
    expected = sum(inputs[p] for p in contributors)
    np.testing.assert_allclose(np.asarray(outcome.values), expected, rtol=0, atol=1e-6)
    assert outcome.dropped["p2"].startswith(stage)


def test_consistency_check_round_with_a_dropout() -> None:
    job, clients = make_job(5, 300, threshold=3, consistency_check=True)
    inputs = _inputs(5, 300, seed=2)
    run_job(job, clients, inputs, drop={"p4": "consistency"})
    outcome = job.outcome
    assert outcome is not None and outcome.status == "done", outcome
    assert "consistency" in outcome.stage_seconds
    np.testing.assert_allclose(np.asarray(outcome.values), _total(inputs), atol=1e-6)  # p4 is in


def test_fewer_than_threshold_survivors_fails_the_job_with_a_clear_error() -> None:
    job, clients = make_job(3, 50, threshold=3)
    run_job(job, clients, _inputs(3, 50), drop={"p1": "masked"})
    assert job.outcome is not None and job.outcome.status == "failed"
    assert "too few" in (job.outcome.error or "")
    with pytest.raises(ServiceError) as info:
        job.submit("p0", pb.UNMASK, b"whatever")
    assert info.value.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ABORTED)


def test_too_few_participants_to_create_a_job() -> None:
    with pytest.raises(crypto.TooFewSurvivors):
        make_job(2, 10, threshold=3)


def test_silent_but_alive_participant_is_dropped_at_the_deadline() -> None:
    job, clients = make_job(4, 20, threshold=3, stage_s=5.0)
    for p in ("p0", "p1", "p2"):
        clients[p].set_input(np.zeros(20))
        job.submit(p, pb.ADVERTISE, clients[p].advertise_keys().to_bytes())
    alive = frozenset(clients)
    assert job.advance(alive) == ()  # p3 is alive and pending: keep waiting
    lines = job.advance(alive, now=float("inf"))
    assert lines and "stage deadline" in lines[0]
    assert job.server.advertised == frozenset({"p0", "p1", "p2"})


@pytest.mark.parametrize("silent_at", ["share", "masked"])
def test_stages_that_wait_on_local_work_get_the_first_stage_deadline(silent_at: str) -> None:
    """Participants share before their local work and upload after it
    (``spherecal.participant.secure_jobs``): the masked stage — and the share stage, for a
    participant whose share wait ran out — waits the job's first-stage deadline
    (training-sized); later stages only ``stage_s``."""
    job, clients = make_job(4, 20, threshold=3, stage_s=5.0, first_stage_s=100.0)
    alive = frozenset(clients)
    for p, c in clients.items():
        c.set_input(np.zeros(20))
        job.submit(p, pb.ADVERTISE, c.advertise_keys().to_bytes())
    t = time.monotonic()
    assert job.advance(alive, now=t)  # everyone advertised
    sharing = ["p0", "p1", "p2"] if silent_at == "share" else sorted(clients)
    for p in sharing:
        step = job.step_for(p)
        assert step is not None
        shares = clients[p].share_keys(crypto.KeyRoster.from_bytes(step.message))
        job.submit(p, pb.SHARE, shares.to_bytes())
    if silent_at == "share":
        assert job.advance(alive, now=t + 50.0) == ()  # 50 s > stage_s: still waiting
        t += 101.0
        (line,) = job.advance(alive, now=t)
        assert "p3 (share: stage deadline)" in line
    else:
        assert job.advance(alive, now=t)
    for p in ("p0", "p1", "p2"):  # p3 (still in the job when silent_at is masked) is silent
        step = job.step_for(p)
        assert step is not None
        clients[p].receive_shares(crypto.ShareBundle.from_bytes(step.message))
        job.begin_upload(p)
        for chunk in clients[p].masked_chunks():
            job.absorb(p, chunk.to_bytes())
        assert job.end_upload(p)
    if silent_at == "masked":
        assert job.advance(alive, now=t + 50.0) == ()
        t += 101.0
        (line,) = job.advance(alive, now=t)
        assert "p3 (masked: stage deadline)" in line
    else:
        assert job.advance(alive, now=t)
    assert job.stage_name == "consistency"
    assert job.advance(alive, now=t + 4.0) == ()
    assert job.advance(alive, now=t + 6.0)  # later stages: stage_s


def test_boundary_rejections_store_nothing() -> None:
    job, clients = make_job(3, 20, threshold=2)
    advert = clients["p0"].advertise_keys().to_bytes()
    with pytest.raises(ServiceError) as info:
        job.submit("p0", pb.ADVERTISE, b"\x00garbage")
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ServiceError) as info:
        job.submit("p1", pb.ADVERTISE, advert)  # p0's message sent by p1
    assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(ServiceError) as info:
        job.submit("p0", pb.MASKED, advert)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    response = crypto.UnmaskResponse(job_id=job.job_id, sender="p0", shares=())
    with pytest.raises(ServiceError) as info:
        job.submit("p0", pb.UNMASK, response.to_bytes())
    assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
    job.submit("p0", pb.ADVERTISE, advert)
    # the same bytes again (a site answering after a restart): "already there", no change
    with pytest.raises(ServiceError) as info:
        job.submit("p0", pb.ADVERTISE, advert)
    assert info.value.code is grpc.StatusCode.ALREADY_EXISTS
    assert "identical" in info.value.message
    assert job.server.pending() == frozenset({"p1", "p2"})
    other = make_job(3, 20, threshold=2)[1]["p0"]  # p0 with other job keys
    second = crypto.AdvertiseKeys.from_bytes(other.advertise_keys().to_bytes())
    forged = crypto.AdvertiseKeys(
        job_id=job.job_id,
        sender="p0",
        channel_public=second.channel_public,
        masking_public=second.masking_public,
        seed_commitment=second.seed_commitment,
        signature=second.signature,
    )
    with pytest.raises(ServiceError) as info:  # a *different* second advertisement
        job.submit("p0", pb.ADVERTISE, forged.to_bytes())
    assert info.value.code in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNAUTHENTICATED)
    assert job.server.pending() == frozenset({"p1", "p2"})


def test_broken_masked_upload_is_abandoned_and_can_be_retried() -> None:
    job, clients = make_job(3, 1000, threshold=2, chunk_entries=100)
    inputs = _inputs(3, 1000, seed=3)
    for p, c in clients.items():
        c.set_input(inputs[p])
        job.submit(p, pb.ADVERTISE, c.advertise_keys().to_bytes())
    job.advance(frozenset(clients))
    for p, c in clients.items():
        step = job.step_for(p)
        assert step is not None and step.stage == pb.SHARE
        job.submit(p, pb.SHARE, c.share_keys(crypto.KeyRoster.from_bytes(step.message)).to_bytes())
    job.advance(frozenset(clients))
    for p, c in clients.items():
        step = job.step_for(p)
        assert step is not None and step.stage == pb.MASKED
        c.receive_shares(crypto.ShareBundle.from_bytes(step.message))
    # p0: a broken stream (3 of 10 chunks), a second concurrent stream refused.
    job.begin_upload("p0")
    with pytest.raises(ServiceError) as info:
        job.begin_upload("p0")
    assert info.value.code is grpc.StatusCode.ALREADY_EXISTS
    assert job.step_for("p0") is None  # no new instruction while it streams
    for index in range(3):
        job.absorb("p0", clients["p0"].masked_chunk(index).to_bytes())
    chunk = clients["p0"].masked_chunk(3)
    short = crypto.MaskedChunk(
        job_id=chunk.job_id, sender="p0", index=3, payload=chunk.payload[:-8]
    )
    with pytest.raises(ServiceError) as info:
        job.absorb("p0", short.to_bytes())
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert job.end_upload("p0") is False
    assert job.step_for("p0") is not None  # asked again
    for p, c in clients.items():
        job.begin_upload(p)
        for masked in c.masked_chunks():
            job.absorb(p, masked.to_bytes())
        assert job.end_upload(p)
    # a complete input sent again is compared to its end, then answered as delivered
    # (issue #20: coordinator.driver.masked_resend); nothing is summed twice
    job.begin_upload("p1")
    n = job.spec.n_chunks
    for index in range(n - 1):
        job.absorb("p1", clients["p1"].masked_chunk(index).to_bytes())
    with pytest.raises(ServiceError) as info:
        job.absorb("p1", clients["p1"].masked_chunk(n - 1).to_bytes())
    assert info.value.code is grpc.StatusCode.ALREADY_EXISTS
    assert job.end_upload("p1")
    job.advance(frozenset(clients))
    for p, c in clients.items():  # the signed survivor-set round (on by default)
        step = job.step_for(p)
        assert step is not None and step.stage == pb.CONSISTENCY
        request = crypto.ConsistencyRequest.from_bytes(step.message)
        job.submit(p, pb.CONSISTENCY, c.consistency_signature(request).to_bytes())
    job.advance(frozenset(clients))
    for p, c in clients.items():
        step = job.step_for(p)
        assert step is not None
        job.submit(p, pb.UNMASK, c.unmask(crypto.UnmaskRequest.from_bytes(step.message)).to_bytes())
    job.advance(frozenset(clients))
    assert job.outcome is not None and job.outcome.status == "done"
    np.testing.assert_allclose(np.asarray(job.outcome.values), _total(inputs), atol=1e-6)
    assert job.server.memory_bytes() == 0  # accumulator released after finishing


def test_withdrawn_participant_is_not_waited_for() -> None:
    job, clients = make_job(3, 10, threshold=2)
    for p in ("p0", "p1"):
        clients[p].set_input(np.zeros(10))
        job.submit(p, pb.ADVERTISE, clients[p].advertise_keys().to_bytes())
    job.withdraw("p2", "EncodingOverflow: out of bound")
    lines = job.advance(frozenset(clients))
    assert lines and "withdrew" in lines[0]


def test_plan_graph() -> None:
    assert plan_graph(SecAggSettings(), 5) == ("complete", 4, 3)
    assert plan_graph(SecAggSettings(threshold=2), 5) == ("complete", 4, 2)
    kind, degree, t = plan_graph(SecAggSettings(), 100)
    assert kind == "harary" and degree == 14 and t == 8
    kind, degree, t = plan_graph(SecAggSettings(graph="harary:4"), 10)
    assert (kind, degree, t) == ("harary", 4, 3)


@pytest.mark.parametrize("colluders", [0, 1, 2, 3])
@pytest.mark.parametrize(
    ("n", "graph"),
    [
        (3, "auto"),
        (5, "auto"),
        (10, "auto"),
        (33, "auto"),
        (100, "auto"),
        (9, "harary:3"),
        (11, "harary:5"),
    ],
)
def test_the_default_threshold_is_one_sites_assuming_colluders_accept(
    n: int, graph: str, colluders: int
) -> None:
    """The coordinator's default threshold counts its ``[privacy] colluders`` as the
    sites' policy does (``2t > h + c``, ``crypto.policy.check_threshold``): a site
    assuming as many colluders accepts the spec, and one assuming one more refuses
    whenever the rule binds. Until 2026-11-27 the default was a majority of ``h``
    alone, which such sites refused for every odd ``h``."""
    settings = SecAggSettings(graph=graph)
    kind, degree, t = plan_graph(settings, n, colluders)
    holders = crypto.graph.max_closed_size(kind, n, degree)
    smallest = crypto.graph.min_closed_size(kind, n, degree)
    if t > smallest:
        # no threshold of that graph covers that many colluders (a spec's t is at most
        # its smallest share-holder set): the job is refused at creation
        assert 2 * smallest <= holders + colluders
        return
    ids = [f"p{i}" for i in range(n)]
    spec = crypto.JobSpec.create(
        ids, threshold=t, min_participants=min(n, 3), graph=kind, degree=degree, length=4,
        bound=1.0, consistency_check=True,
    )  # fmt: skip
    crypto.policy.check_threshold(crypto.SecAggPolicy(colluders=colluders), spec)
    assert 2 * t > holders + colluders and 2 * (t - 1) <= holders + colluders  # the least
    if 2 * t <= holders + colluders + 1:  # one colluder more binds: it is refused
        with pytest.raises(crypto.ThresholdTooLow):
            crypto.policy.check_threshold(crypto.SecAggPolicy(colluders=colluders + 1), spec)


def test_memory_is_a_few_vectors_whatever_the_number_of_participants() -> None:
    n, length = 8, 20_000
    job, clients = make_job(n, length, threshold=5, chunk_entries=4096, max_in_flight=2)
    inputs = _inputs(n, length, seed=5)
    streams = masked_streams(job, clients, inputs)
    # Everybody streams at once, round-robin chunk by chunk: only max_in_flight uploads
    # hold a staging slot; the others are told UNAVAILABLE (retry) and nothing of
    # theirs is stored.
    peak, busy = 0, 0
    started: set[str] = set()
    pending = dict(streams)
    while pending:
        for p in list(pending):
            chunk = next(pending[p], None)
            if chunk is None:
                assert job.end_upload(p)
                started.discard(p)
                del pending[p]
                continue
            if p not in started:
                job.begin_upload(p)
                started.add(p)
            try:
                job.absorb(p, chunk.to_bytes())
            except ServiceError as exc:
                assert exc.code is grpc.StatusCode.UNAVAILABLE
                busy += 1
                job.end_upload(p)
                started.discard(p)
                pending[p] = clients[p].masked_chunks()  # retry later, from the start
            peak = max(peak, job.server.memory_bytes())
    assert busy > 0
    assert peak <= 3 * 8 * length
    job.advance(frozenset(clients))
    for p, c in clients.items():  # the signed survivor-set round (on by default)
        step = job.step_for(p)
        assert step is not None and step.stage == pb.CONSISTENCY
        request = crypto.ConsistencyRequest.from_bytes(step.message)
        job.submit(p, pb.CONSISTENCY, c.consistency_signature(request).to_bytes())
    job.advance(frozenset(clients))
    for p, c in clients.items():
        step = job.step_for(p)
        assert step is not None
        job.submit(p, pb.UNMASK, c.unmask(crypto.UnmaskRequest.from_bytes(step.message)).to_bytes())
    job.advance(frozenset(clients))
    assert job.outcome is not None and job.outcome.status == "done"
    np.testing.assert_allclose(np.asarray(job.outcome.values), _total(inputs), atol=1e-6)
