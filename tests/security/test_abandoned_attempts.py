"""A hostile coordinator reading a site's local work by abandoning its jobs.

A release counts when the site's input leaves, so that an honest retry is admitted;
a job the coordinator abandons during the local work (it moves on before the masked
step) charges nothing. But the site ran that work, and the moment it next speaks
follows how long it took — the example count — and whether a crafted model made it
fail. Under fresh job ids, at the default ``[policy] min_local_work_s = 0``, that
reading was free and unbounded (``docs/threat_model.md``, *Timing*).

Played by a :class:`tests.security.hostile_ring.HostileRing` around a real
:class:`ParticipantRunner` (real trainer, data, crypto, SQLite release ledger): the
coordinator abandons every job at its masked step and asks the same purpose again
under a new job id. At the default ``[policy] max_unreleased_attempts`` (3) the fourth
job of a purpose is refused at once — before the site advertises a key or runs any
local work — with ``RULE_ATTEMPTS_EXHAUSTED``, also after the site restarts; another
training round is its own purpose. The mutation check turns the bound off: every job
then runs its local work, each one more reading.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from spherecal.coordinator.driver.model import GlobalModel
from spherecal.participant.data import LocalData
from spherecal.participant.trainer import LocalTrainer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.stats import ffc_layout_size
from tests.security.hostile_ring import (
    HostileRing,
    RingJob,
    make_job,
    run_target,
    target_settings,
)

ROSTER = ("p0", "p1", "p2", "p3")
REFUSED = ("POLICY_REFUSAL", "RULE_ATTEMPTS_EXHAUSTED")


class AbandoningRing(HostileRing):
    """Never sends a job's masked step: once the site answered the share step, the
    coordinator moves on to the next task (a fresh job for the same purpose)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.advertised: set[bytes] = set()

    def _step(self, job: RingJob, stage: pb.SecAggStage, message: bytes) -> None:
        if stage != pb.MASKED:
            super()._step(job, stage, message)

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        if request.stage == pb.ADVERTISE:
            self.advertised.add(bytes(request.job_id))
        return super().submit_secagg(request)


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every local work the site starts (a feature pass, a training run), in order."""
    started: list[str] = []
    statistics, train = LocalTrainer.statistics, LocalTrainer.train

    def counted_statistics(self: LocalTrainer, *args: object, **kwargs: object) -> object:
        started.append("statistics")
        return statistics(self, *args, **kwargs)  # type: ignore[arg-type]

    def counted_train(self: LocalTrainer, *args: object, **kwargs: object) -> object:
        started.append("train")
        return train(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalTrainer, "statistics", counted_statistics)
    monkeypatch.setattr(LocalTrainer, "train", counted_train)
    return started


def _run(tmp: Path, ring: HostileRing, data: LocalData, **policy: object) -> None:
    run_target(target_settings(tmp, **policy), ring, data)


def _ffc_tasks(ring: HostileRing, model: GlobalModel, names: list[str]) -> list[RingJob]:
    """One FFC statistics task per name, each a fresh job: the same release asked
    again and again (nothing of it ever left)."""
    length = ffc_layout_size(model.feature_dim, model.num_classes)
    ref = ring.publish("model", model.initial_vector)
    jobs = [make_job(ROSTER, length) for _ in names]
    ring.script = [
        pb.Instruction(
            task_id=name,
            statistics=pb.StatisticsTask(kind=pb.FFC, model=ref, secure=ring.secure(job, "ffc")),
        )
        for name, job in zip(names, jobs, strict=True)
    ]
    return jobs


def _rows(tmp: Path, query: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(tmp / "state" / "privacy.db")
    try:
        return list(conn.execute(query))
    finally:
        conn.close()


def test_the_fourth_abandoned_statistics_job_is_refused_before_any_work_also_after_a_restart(
    tmp_path: Path, model: GlobalModel, data: LocalData, work: list[str]
) -> None:
    ring = AbandoningRing(federation="fed", model=model)
    first = _ffc_tasks(ring, model, ["ffc-1", "ffc-2", "ffc-3", "ffc-4"])
    _run(tmp_path, ring, data)
    # the first three ran (keys, shares, the feature pass) and left nothing
    assert work == ["statistics"] * 3
    assert {j.job_id for j in first[:3]} == ring.advertised
    assert ring.refusal("ffc-4") == REFUSED
    assert _rows(tmp_path, "SELECT state, COUNT(*) FROM site_releases GROUP BY state") == [
        ("reserved", 3)
    ]
    # the site restarts: the count is in its ledger
    again = AbandoningRing(federation="fed", model=model)
    later = _ffc_tasks(again, model, ["ffc-5"])
    _run(tmp_path, again, data)
    assert work == ["statistics"] * 3
    assert later[0].job_id not in again.advertised
    assert again.refusal("ffc-5") == REFUSED
    refusals = _rows(tmp_path, "SELECT task, rule FROM site_refusals ORDER BY at")
    assert refusals == [
        ("ffc-4", "RULE_ATTEMPTS_EXHAUSTED"),
        ("ffc-5", "RULE_ATTEMPTS_EXHAUSTED"),
    ]


def test_mutation_without_the_bound_every_abandoned_job_runs_its_work(
    tmp_path: Path, model: GlobalModel, data: LocalData, work: list[str]
) -> None:
    ring = AbandoningRing(federation="fed", model=model)
    jobs = _ffc_tasks(ring, model, [f"ffc-{k}" for k in range(1, 6)])
    _run(tmp_path, ring, data, max_unreleased_attempts=0)
    assert work == ["statistics"] * 5
    assert ring.advertised == {j.job_id for j in jobs}
    assert not ring.failures


def test_a_rounds_abandoned_jobs_are_bounded_and_the_next_round_is_its_own(
    tmp_path: Path, model: GlobalModel, data: LocalData, work: list[str]
) -> None:
    ring = AbandoningRing(federation="fed", model=model)
    ring.rounds = 2
    length = model.length + 2  # the update and its weight entries
    vector = np.array(model.initial_vector, dtype=np.float64)
    tasks = []
    for k in range(4):  # round 1 four times, each a fresh job and name
        job = make_job(ROSTER, length)
        tasks.append(ring.train(vector, job, round_index=0, name=f"r1-{k}"))
    job = make_job(ROSTER, length)
    tasks.append(ring.train(vector, job, round_index=1, name="r2"))
    ring.script = tasks
    _run(tmp_path, ring, data)
    assert work == ["train"] * 4  # three of round 1, then round 2's
    assert ring.refusal("train-r1-3") == REFUSED
    assert len(ring.advertised) == 4
    rounds = _rows(tmp_path, "SELECT round, COUNT(*) FROM site_releases GROUP BY round")
    assert rounds == [(0, 3), (1, 1)]
