"""A refusal that asking again cannot change is not asked again, and the status says
the cause once (``coordinator/driver/futile_retry.py``).

Found on 2026-11-27 after ``spherecal coordinator --new-federation`` over the same
sites and data: every site refused the exact statistics (``RULE_RELEASE_REPEATED``),
the coordinator asked three times, and each method's status reason repeated the
whole causal chain three times. These runs drive a real ``Federation`` through the
service core with scripted sites that answer every task with a typed
``FailureReport``, built by the participant's own mapping (``participant.failures``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from spherecal.coordinator.driver.conduct import Refusal
from spherecal.coordinator.driver.futile_retry import (
    CHANGEABLE,
    UNCHANGEABLE,
    fewest_for_a_job,
    unchangeable,
)
from spherecal.coordinator.settings import CoordinatorSettings, SecAggSettings
from spherecal.coordinator.state.registry import Peer
from spherecal.participant.failures import wire_reason
from spherecal.participant.policy import AttemptsExhausted, EvaluationsExhausted, ReleaseRepeated
from spherecal.proto import spherecal_pb2 as pb

from .service_harness import Harness, ScriptedSites, settings_for

Answer = Callable[[str, str], BaseException]
"""(site, task kind) -> the error the site answers the task with."""

REPEATED = ReleaseRepeated("the per-class moments already left this site")
EXHAUSTED = EvaluationsExhausted("this site already answered 4 evaluation(s)")
DROPOUT = RuntimeError("the site's local computation failed")


class AnsweringSites(ScriptedSites):
    """Every roster member answers each task it is handed — every new job of a retried
    one too — with a typed withdrawal, as a participant does."""

    def __init__(self, harness: Harness, answer: Answer) -> None:
        super().__init__(harness)
        self.answer = answer

    def handle(self, pid: str, instruction: pb.Instruction) -> None:
        kind = instruction.WhichOneof("kind")
        if kind not in ("train", "statistics", "evaluate"):
            return
        # a task is handed out once per session: each one here is a new task (a
        # retry's too, whose id is the same as the attempt's before it)
        self.refuse(pid, instruction.task_id, self.answer(pid, kind))


def _settings(tmp: Path, *, secure: bool, n: int, rounds: int) -> CoordinatorSettings:
    base = settings_for(tmp, secure=secure, n=n, rounds=rounds)
    return replace(
        base,
        timeouts=replace(base.timeouts, retry_backoff_s=0.0, rejoin_grace_s=5.0),
    )


@contextmanager
def _run(settings: CoordinatorSettings, answer: Answer) -> Iterator[Harness]:
    harness = Harness(settings).start()
    sites = AnsweringSites(harness, answer).start()
    try:
        harness.thread.join(timeout=120)
        assert not harness.thread.is_alive(), "the federation did not end"
        yield harness
    finally:
        sites.close()
        harness.close()


def _jobs(harness: Harness, purpose: str) -> int:
    return int(harness.store.query("SELECT count(*) FROM jobs WHERE purpose = ?", (purpose,))[0][0])


def _retries(harness: Harness, stage: str) -> int:
    return sum(1 for r in harness.federation.progress.retries if r["stage"] == stage)


def _reason(harness: Harness, method: str) -> str:
    (reason,) = [
        r for r in harness.federation.progress.status_reasons if r.startswith(f"{method}: ")
    ]
    return reason


def _everyone_refuses(site: str, kind: str) -> BaseException:
    return EXHAUSTED if kind == "evaluate" else REPEATED


@pytest.mark.parametrize("secure", [True, False], ids=["secure", "plaintext"])
def test_statistics_refused_for_good_by_every_site_are_asked_once(
    tmp_path: Path, secure: bool
) -> None:
    with _run(_settings(tmp_path, secure=secure, n=3, rounds=0), _everyone_refuses) as harness:
        assert harness.federation.board.done is not None
        assert harness.federation.board.done[0] == "degraded"
        if secure:
            assert _jobs(harness, "ffc") == 1  # the old code started 3
            assert _jobs(harness, "evaluate") == 1
        assert _retries(harness, "statistics ffc") == 0
        assert _retries(harness, "final evaluation") == 0
        # one reason, naming the sites and the rule once
        reason = _reason(harness, "ffc")
        assert reason.count("RULE_RELEASE_REPEATED") == 1, reason
        assert reason.count(wire_reason(REPEATED)) == 1, reason
        assert "not retried: p0, p1, p2 refused it: POLICY_REFUSAL/RULE_RELEASE_REPEATED" in (
            reason
        )
        assert "0 of the 3 eligible participants could take part" in reason
        # the status view says the same, once
        view = harness.service.get_federation_status(pb.FederationStatusRequest(), Peer())
        assert list(view.status_reasons) == harness.federation.progress.status_reasons
        (evaluation,) = [r for r in view.status_reasons if "final evaluation" in r]
        assert evaluation.count("RULE_EVALUATIONS_EXHAUSTED") == 1, evaluation
        # the job's own failure, with its first cause, stays in the errors and events
        errors = harness.federation.progress.errors
        if secure:
            assert any(e.startswith("ffc job ") and "first cause" in e for e in errors)
        events = [m for (m,) in harness.store.query("SELECT message FROM events")]
        assert any("statistics ffc: attempt 1 failed" in m for m in events)


def test_a_round_whose_update_already_left_every_site_is_lost_at_once(tmp_path: Path) -> None:
    with _run(_settings(tmp_path, secure=True, n=3, rounds=1), _everyone_refuses) as harness:
        assert _jobs(harness, "update") == 1  # the old code started 3, then lost the round
        (metrics,) = harness.federation.progress.round_metrics
        assert metrics["status"] == "lost" and metrics["attempt"] == 1
        (lost,) = [r for r in harness.federation.progress.status_reasons if " lost: " in r]
        assert "not retried" in lost and lost.count("RULE_RELEASE_REPEATED") == 1


def _attempts_spent(site: str, kind: str) -> BaseException:
    if kind == "train":
        return AttemptsExhausted("this site already started 3 job(s) for round 1")
    return _everyone_refuses(site, kind)


def test_a_round_whose_sites_spent_their_attempts_is_lost_and_the_federation_goes_on(
    tmp_path: Path,
) -> None:
    """The sites admit ``[policy] max_unreleased_attempts`` started jobs per round whose
    input never left — attempts before a coordinator restart count too — so a round
    they refuse for that is lost, as one whose updates left: the next round is a
    purpose of its own. Failing the federation instead would end it for what is a
    per-round bound."""
    with _run(_settings(tmp_path, secure=True, n=3, rounds=1), _attempts_spent) as harness:
        assert harness.federation.board.done is not None
        assert harness.federation.board.done[0] == "degraded"
        assert _jobs(harness, "update") == 1
        (metrics,) = harness.federation.progress.round_metrics
        assert metrics["status"] == "lost" and metrics["attempt"] == 1
        (lost,) = [r for r in harness.federation.progress.status_reasons if " lost: " in r]
        assert "not retried" in lost and lost.count("RULE_ATTEMPTS_EXHAUSTED") == 1, lost
        assert "p0, p1, p2 already started their most jobs for this round" in lost
        assert "RULE_RELEASE_REPEATED" not in lost


def _one_refuses_the_others_drop(site: str, kind: str) -> BaseException:
    if kind == "evaluate":
        return EXHAUSTED
    return REPEATED if site == "p0" else DROPOUT


def _everyone_drops(site: str, kind: str) -> BaseException:
    return EXHAUSTED if kind == "evaluate" else DROPOUT


@pytest.mark.parametrize(
    ("n", "answer"),
    [(4, _one_refuses_the_others_drop), (3, _everyone_drops)],
    ids=["one-refusal-others-drop", "all-drop"],
)
def test_a_job_that_others_could_still_make_is_retried_as_before(
    tmp_path: Path, n: int, answer: Answer
) -> None:
    """p0's refusal repeats, but 3 others could make a job (the secure minimum): the
    dropouts may come back, so the job is asked again, every attempt; and the method's
    reason says the last cause once, not once per attempt."""
    settings = _settings(tmp_path, secure=True, n=n, rounds=0)
    attempts = settings.training.max_round_attempts
    with _run(settings, answer) as harness:
        assert _jobs(harness, "ffc") == attempts
        assert _retries(harness, "statistics ffc") == attempts - 1
        reason = _reason(harness, "ffc")
        assert f"{attempts} attempts failed; the last: " in reason
        assert reason.count("first cause") == 1, reason
        assert "not retried" not in reason


def test_every_policy_rule_is_classified_once() -> None:
    rules = set(pb.PolicyRule.DESCRIPTOR.values_by_name) - {"RULE_UNSPECIFIED"}
    assert CHANGEABLE | (UNCHANGEABLE - {"BUDGET_EXCEEDED"}) == rules
    assert not CHANGEABLE & UNCHANGEABLE


@pytest.mark.parametrize(
    ("kind", "rule", "repeats"),
    [
        ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED", True),
        ("POLICY_REFUSAL", "RULE_EVALUATIONS_EXHAUSTED", True),
        ("BUDGET_EXCEEDED", "RULE_UNSPECIFIED", True),
        ("POLICY_REFUSAL", "RULE_THRESHOLD_TOO_LOW", False),  # follows the roster
        ("POLICY_REFUSAL", "RULE_UNSPECIFIED", False),
        ("BAD_INPUT", "RULE_UNSPECIFIED", False),  # a withheld input, or one job's bytes
        ("BAD_INPUT", "RULE_RELEASE_REPEATED", False),  # a rule only means one with its kind
    ],
)
def test_which_refusals_repeat(kind: str, rule: str, repeats: bool) -> None:
    assert unchangeable(Refusal("p0", "j", "ffc", kind, rule, "")) is repeats


def test_the_fewest_a_secure_job_takes() -> None:
    assert fewest_for_a_job(SecAggSettings(), 10) == 3  # min_participants
    assert fewest_for_a_job(SecAggSettings(threshold=5), 10) == 5
    assert fewest_for_a_job(SecAggSettings(), 2) == 3  # none over 2 or fewer
    # the threshold counts the assumed colluders (2t > n + c): two members make a job
    # at t = 2 alone or with one colluder, not with two (t = 3 > 2); three then do
    assert fewest_for_a_job(SecAggSettings(min_participants=2), 10) == 2
    assert fewest_for_a_job(SecAggSettings(min_participants=2), 10, colluders=1) == 2
    assert fewest_for_a_job(SecAggSettings(min_participants=2), 10, colluders=2) == 3


@pytest.mark.parametrize(
    ("n", "kept", "retried"),
    [(4, 3, False), (6, 3, True), (7, 4, True), (5, 3, False), (4, 2, False)],
    ids=["4-kept-3", "6-kept-3", "7-kept-4", "5-kept-3", "4-kept-2"],
)
def test_a_kept_short_sum_is_retried_only_if_the_others_could_make_a_job(
    tmp_path: Path, n: int, kept: int, retried: bool
) -> None:
    """The contributors of a short sum the stage keeps refuse to release the same
    value again, so they count as refused before anyone is asked: a retry (whose sum
    is added to the one kept) is made only if the sites left could make a job — three,
    the secure minimum."""
    from spherecal.coordinator.driver.futile_retry import RefusalWatch

    settings = _settings(tmp_path, secure=True, n=n, rounds=0)
    harness = Harness(settings)
    try:
        for pid in settings.participants:
            harness.join(pid)
        watch = RefusalWatch(harness.federation.stages, "ffc")
        pool = list(settings.participants)
        released = pool[:kept]
        least = fewest_for_a_job(settings.secagg, n)
        assert least == 3
        futile = watch.futile(pool, least=least, needs="a secure job needs", released=released)
        assert (futile is None) is retried
        # without the kept sum (the old call) nothing is known to repeat: retried
        assert watch.futile(pool, least=least, needs="a secure job needs") is None
        if futile is not None:
            assert futile.possible == n - kept
            assert futile.released == tuple(released)
            reason = futile.reason()
            assert f"{', '.join(released)} released their input into the sum kept" in reason
            assert f"{n - kept} of the {n} eligible participants could take part" in reason
    finally:
        harness.store.close()
