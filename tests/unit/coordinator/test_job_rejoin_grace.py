"""A later stage of a secure job waits for a summed participant that disconnected
(issue #20): a site restarting within ``rejoin_grace_s`` answers from its held state
and counts as a survivor; without the grace the stage closes at once and, at a
threshold that needs it, the job — and every site's release — is lost."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.coordinator.driver.tasks import Task
from spherecal.coordinator.errors import ServiceError
from spherecal.proto import spherecal_pb2 as pb

from .helpers import make_job

IDS = ("p0", "p1", "p2", "p3")
GRACE_S = 30.0


def _to_consistency(
    rejoin_s: float,
) -> tuple[SecureJob, dict[str, crypto.SecAggParticipant], dict[str, np.ndarray]]:
    job, clients = make_job(4, 40, threshold=4, rejoin_s=rejoin_s)
    inputs = {p: np.full(40, float(k + 1)) for k, p in enumerate(IDS)}
    everyone = frozenset(IDS)
    for p in IDS:
        clients[p].set_input(inputs[p])
        job.submit(p, pb.ADVERTISE, clients[p].advertise_keys().to_bytes())
    job.advance(everyone)
    for p in IDS:
        step = job.step_for(p)
        assert step is not None
        shares = clients[p].share_keys(crypto.KeyRoster.from_bytes(step.message))
        job.submit(p, pb.SHARE, shares.to_bytes())
    job.advance(everyone)
    for p in IDS:
        step = job.step_for(p)
        assert step is not None
        clients[p].receive_shares(crypto.ShareBundle.from_bytes(step.message))
        job.begin_upload(p)
        for chunk in clients[p].masked_chunks():
            job.absorb(p, chunk.to_bytes())
        assert job.end_upload(p)
    job.advance(everyone)
    assert job.stage_name == "consistency"
    return job, clients, inputs


def _sign(job: SecureJob, clients: dict[str, crypto.SecAggParticipant], p: str) -> None:
    step = job.step_for(p)
    assert step is not None and step.stage == pb.CONSISTENCY
    request = crypto.ConsistencyRequest.from_bytes(step.message)
    job.submit(p, pb.CONSISTENCY, clients[p].consistency_signature(request).to_bytes())


def test_a_restarted_site_within_the_grace_counts_as_a_survivor() -> None:
    job, clients, inputs = _to_consistency(GRACE_S)
    without_p3 = frozenset(IDS) - {"p3"}
    for p in sorted(without_p3):
        _sign(job, clients, p)
    t0 = time.monotonic()
    lines = job.advance(without_p3, now=t0)
    assert job.stage_name == "consistency" and job.outcome is None
    assert any("p3 disconnected in stage consistency" in line for line in lines), lines
    assert job.advance(without_p3, now=t0 + GRACE_S - 1) == ()  # still waiting, quietly
    assert job.stage_name == "consistency"
    # p3's process restarted: rebuilt from its held state, it answers both stages
    resumed = crypto.SecAggParticipant.resume(
        job.spec,
        "p3",
        clients["p3"]._identity,
        {e.participant_id: e.identity_public_key for e in job.job_message("p3").directory},
        crypto.HeldState.from_bytes(clients["p3"].held_state().to_bytes()),
    )
    clients["p3"] = resumed
    _sign(job, clients, "p3")
    job.advance(frozenset(IDS))
    assert job.stage_name == "unmask"
    for p in IDS:
        step = job.step_for(p)
        assert step is not None
        answer = clients[p].unmask(crypto.UnmaskRequest.from_bytes(step.message))
        job.submit(p, pb.UNMASK, answer.to_bytes())
    job.advance(frozenset(IDS))
    outcome = job.outcome
    assert outcome is not None and outcome.status == "done", outcome
    assert outcome.contributors == IDS and outcome.dropped == {}
    np.testing.assert_allclose(np.asarray(outcome.values), sum(inputs.values()), atol=1e-6)


def test_without_the_grace_the_stage_closes_at_once_and_the_job_is_lost() -> None:
    job, clients, _ = _to_consistency(0.0)
    without_p3 = frozenset(IDS) - {"p3"}
    for p in sorted(without_p3):
        _sign(job, clients, p)
    job.advance(without_p3)
    outcome = job.outcome
    assert outcome is not None and outcome.status == "failed", outcome
    assert outcome.dropped["p3"].startswith("consistency: disconnected")


def test_a_site_not_back_within_the_grace_is_dropped_then() -> None:
    job, clients, _ = _to_consistency(GRACE_S)
    without_p3 = frozenset(IDS) - {"p3"}
    for p in sorted(without_p3):
        _sign(job, clients, p)
    t0 = time.monotonic()
    job.advance(without_p3, now=t0)
    assert job.outcome is None
    job.advance(without_p3, now=t0 + GRACE_S + 0.1)
    assert job.outcome is not None  # threshold 4: failed, p3 named as the dropout
    assert job.outcome.dropped["p3"].startswith("consistency: disconnected")


def test_a_site_back_without_the_job_withdraws_and_ends_the_wait() -> None:
    job, clients, _ = _to_consistency(GRACE_S)
    without_p3 = frozenset(IDS) - {"p3"}
    for p in sorted(without_p3):
        _sign(job, clients, p)
    job.advance(without_p3, now=time.monotonic())
    assert job.outcome is None
    # it came back without a held state: JobAborted, reported as its withdrawal
    job.withdraw("p3", "BAD_STATE: this participant holds no state for the job")
    job.advance(frozenset(IDS))
    assert job.outcome is not None
    assert "withdrew" in job.outcome.dropped["p3"]


# ------------------------------------------------------------- before the masked upload
# (issue #20: a site holds its job keys from the advertise stage on)


def _task(job: SecureJob) -> Task:
    return Task(
        kind="statistics",
        expected=frozenset(IDS),
        instructions={p: pb.Instruction(statistics=pb.StatisticsTask()) for p in IDS},
        job=job,
    )


def test_the_advertise_and_share_stages_wait_for_a_site_gone_and_hand_it_its_task_again() -> (
    None
):
    job, clients = make_job(4, 40, threshold=4, rejoin_s=GRACE_S)
    task = _task(job)
    without_p3 = frozenset(IDS) - {"p3"}
    for p in IDS:
        assert task.instruction_for(p, f"{p}-a") is not None  # delivered once
        assert task.instruction_for(p, f"{p}-a") is None  # not again in that session
    for p in sorted(without_p3):
        job.submit(p, pb.ADVERTISE, clients[p].advertise_keys().to_bytes())
    t0 = time.monotonic()
    lines = job.advance(without_p3, now=t0)  # p3 died before its advertisement left
    assert job.stage_name == "advertise" and job.outcome is None
    assert any("p3 disconnected in stage advertise before its keys" in x for x in lines), lines
    assert job.advance(without_p3, now=t0 + GRACE_S - 1) == ()
    assert task.instruction_for("p3", "p3-b") is not None  # back: its task again
    advert = clients["p3"].advertise_keys().to_bytes()
    job.submit("p3", pb.ADVERTISE, advert)
    job.advance(frozenset(IDS))
    assert job.stage_name == "share"
    # p2 dies before its shares left; a site that comes back after advertising gets
    # its task again (the new session) until it confirms the job (its advertisement
    # again, acknowledged as identical)
    for p in ("p0", "p1", "p3"):
        step = job.step_for(p)
        assert step is not None
        roster = crypto.KeyRoster.from_bytes(step.message)
        job.submit(p, pb.SHARE, clients[p].share_keys(roster).to_bytes())
    without_p2 = frozenset(IDS) - {"p2"}
    lines = job.advance(without_p2, now=t0)
    assert job.stage_name == "share"
    assert any("p2 disconnected in stage share before its shares" in x for x in lines), lines
    assert task.instruction_for("p2", "p2-b") is not None
    assert task.instruction_for("p2", "p2-b") is None
    with pytest.raises(ServiceError) as known:
        job.submit("p2", pb.ADVERTISE, clients["p2"]._own_advert.to_bytes())  # type: ignore[union-attr]
    assert known.value.code is grpc.StatusCode.ALREADY_EXISTS
    assert task.finished("p2")
    step = job.step_for("p2")
    assert step is not None
    roster = crypto.KeyRoster.from_bytes(step.message)
    job.submit("p2", pb.SHARE, clients["p2"].share_keys(roster).to_bytes())
    job.advance(frozenset(IDS))
    assert job.stage_name == "masked"
    # a site that uploaded its masked input is not handed its task again
    inputs = {p: np.full(40, float(k + 1)) for k, p in enumerate(IDS)}
    for p in IDS:
        step = job.step_for(p)
        assert step is not None
        clients[p].receive_shares(crypto.ShareBundle.from_bytes(step.message))
        clients[p].set_input(inputs[p])
        if p == "p1":
            continue  # p1 dies before its upload began
        job.begin_upload(p)
        for chunk in clients[p].masked_chunks():
            job.absorb(p, chunk.to_bytes())
        assert job.end_upload(p)
    assert task.instruction_for("p0", "p0-b") is None
    assert task.instruction_for("p1", "p1-b") is not None  # not uploaded at all: again
    job.begin_upload("p1")
    for chunk in clients["p1"].masked_chunks():
        job.absorb("p1", chunk.to_bytes())
    assert job.end_upload("p1")
    job.advance(frozenset(IDS))
    assert job.stage_name == "consistency"


def test_without_the_grace_a_site_gone_at_the_advertise_stage_is_left_out() -> None:
    job, clients = make_job(4, 40, threshold=3, rejoin_s=0.0)
    without_p3 = frozenset(IDS) - {"p3"}
    for p in sorted(without_p3):
        job.submit(p, pb.ADVERTISE, clients[p].advertise_keys().to_bytes())
    job.advance(without_p3)
    assert job.stage_name == "share"  # closed at once, p3 out of the job
    assert job.dropped["p3"].startswith("advertise: disconnected")


def test_a_site_whose_connection_was_cut_is_handed_its_task_again_when_it_is_back() -> None:
    """Its process never restarted (the same session), but the task was on its way
    when the connection was cut: counted as delivered, never received. Back within
    the grace, it gets the task once more — else the stage would wait for a live
    participant that waits for a task, until the deadline."""
    job, clients = make_job(4, 40, threshold=4, rejoin_s=GRACE_S)
    task = _task(job)
    for p in IDS:
        assert task.instruction_for(p, f"{p}-a") is not None
    without_p2 = frozenset(IDS) - {"p2"}
    for p in sorted(without_p2):
        job.submit(p, pb.ADVERTISE, clients[p].advertise_keys().to_bytes())
    t0 = time.monotonic()
    job.advance(without_p2, now=t0)  # p2's connection is cut: waited for
    assert task.instruction_for("p2", "p2-a") is None  # same session, nothing new yet
    lines = job.advance(frozenset(IDS), now=t0 + 1)  # p2 connected again
    assert any("p2 is back in stage advertise" in line for line in lines), lines
    assert job.stage_name == "advertise"
    assert task.instruction_for("p2", "p2-a") is not None  # the same session: again
    assert task.instruction_for("p2", "p2-a") is None  # once
    assert task.instruction_for("p0", "p0-a") is None  # the others are not disturbed
    job.submit("p2", pb.ADVERTISE, clients["p2"].advertise_keys().to_bytes())
    job.advance(frozenset(IDS), now=t0 + 2)
    assert job.stage_name == "share"


def test_mutation_without_the_comeback_the_lost_task_is_not_handed_out_again() -> None:
    job, clients = make_job(4, 40, threshold=4, rejoin_s=GRACE_S)
    task = _task(job)
    for p in IDS:
        task.instruction_for(p, f"{p}-a")
    job._grace.came_back = lambda alive: ()  # type: ignore[method-assign]
    without_p2 = frozenset(IDS) - {"p2"}
    t0 = time.monotonic()
    job.advance(without_p2, now=t0)
    job.advance(frozenset(IDS), now=t0 + 1)
    assert task.instruction_for("p2", "p2-a") is None  # p2 would wait until the deadline
