"""At most ``[policy] max_unreleased_attempts`` started jobs per purpose whose input
never left: a job the coordinator abandons during its local work charges no release,
but the moment the site next speaks follows that work, so fresh job ids made that
reading free and unbounded. The ledger counts the reservations that never left —
per training round, for the per-class moments, for the federation's evaluations
together — and refuses a new job id beyond the limit, before any local work."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spherecal.coordinator.driver.futile_retry import UNCHANGEABLE, attempts_warning
from spherecal.coordinator.settings import CoordinatorSettings, TrainingSettings
from spherecal.participant.failures import policy_rule
from spherecal.participant.policy import (
    DEFAULT_MAX_UNRELEASED_ATTEMPTS,
    AttemptsExhausted,
    PolicySettings,
    ReleaseRepeated,
)
from spherecal.participant.release_ledger import (
    EVALUATE,
    REFUSAL,
    UPDATE,
    LedgerRules,
    Release,
    ReleaseLedger,
)
from spherecal.proto import spherecal_pb2 as pb
from spherecal.site_audit import format_site_audit, read_site_audit, run_site_audit, site_audit_html
from spherecal.spherefed.privacy.evaluation_noise import DEFAULT_MAX_EVALUATIONS_PER_FEDERATION

MOST = DEFAULT_MAX_UNRELEASED_ATTEMPTS


def _ledger(tmp_path: Path, **rules: object) -> ReleaseLedger:
    return ReleaseLedger(
        tmp_path / "privacy.db",
        participant="p0",
        rules=LedgerRules(**rules),  # type: ignore[arg-type]
    )


def _round(r: int, federation: str = "fed", model: int = 0) -> Release:
    return Release(
        kind=UPDATE,
        federation=federation,
        model=model.to_bytes(32, "big"),
        data=b"d" * 32,
        round=r,
    )


def _moments(model: int, federation: str = "fed", kind: str = "ffc") -> Release:
    """Noised (DP) moments: a later federation on the same data admits them."""
    return Release(
        kind=kind,
        federation=federation,
        model=model.to_bytes(32, "big"),
        data=b"d" * 32,
        noised=True,
    )


def _evaluation(model: int, federation: str = "fed") -> Release:
    return Release(
        kind=EVALUATE,
        federation=federation,
        model=model.to_bytes(32, "big"),
        data=b"t" * 32,
        content=b"c" * 32,
    )


def test_a_rounds_fourth_started_job_is_refused_and_another_round_is_its_own_purpose(
    tmp_path: Path,
) -> None:
    ledger = _ledger(tmp_path)
    for k in range(MOST):  # three jobs for round 1, each with a fresh id and model
        ledger.reserve(_round(0, model=k), job=f"job-{k}")
    with pytest.raises(AttemptsExhausted, match=rf"started {MOST} job\(s\) for round 1 "):
        ledger.reserve(_round(0, model=99), job="job-late")
    ledger.reserve(_round(1), job="round-2")  # another round: its own count
    ledger.reserve(_round(0, federation="fed-2"), job="fed-2-round-1")  # another federation
    ledger.close()


def test_a_continued_job_is_the_same_attempt_and_a_restart_keeps_the_count(
    tmp_path: Path,
) -> None:
    ledger = _ledger(tmp_path)
    for k in range(MOST):
        ledger.reserve(_round(0, model=k), job=f"job-{k}")
    ledger.reserve(_round(0, model=0), job="job-0")  # the same job asked again
    ledger.close()
    restarted = _ledger(tmp_path)  # durable: the count is in privacy.db
    restarted.reserve(_round(0, model=1), job="job-1")  # continued after the restart
    with pytest.raises(AttemptsExhausted):
        restarted.reserve(_round(0, model=7), job="job-new")
    restarted.close()


def test_what_left_does_not_count_and_another_federation_starts_over(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    # moments: two abandoned jobs, then one that left (a refusal charged in its place)
    ledger.reserve(_moments(1), job="m1")
    ledger.reserve(_moments(2), job="m2")
    ledger.reserve(_moments(3, kind="ccvr"), job="m3")
    ledger.consume("m3", answer=REFUSAL)
    # the next is refused for what left, not for its attempts
    with pytest.raises(ReleaseRepeated):
        ledger.reserve(_moments(4), job="m4")
    # a new federation: its own purposes
    for k in range(MOST):
        ledger.reserve(_moments(10 + k, federation="fed-2"), job=f"f2-{k}")
    with pytest.raises(AttemptsExhausted, match="per-class moments"):
        ledger.reserve(_moments(20, federation="fed-2", kind="ccvr"), job="f2-late")
    ledger.close()


def test_the_moments_count_spans_their_kinds(tmp_path: Path) -> None:
    """FFC and CCVR are one family (CCVR's moments determine FFC's), so one purpose."""
    ledger = _ledger(tmp_path)
    kinds = ("ffc", "ccvr", "ffc")
    for k, kind in enumerate(kinds[:MOST]):
        ledger.reserve(_moments(k, kind=kind), job=f"m{k}")
    with pytest.raises(AttemptsExhausted):
        ledger.reserve(_moments(9, kind="ccvr"), job="m-late")
    ledger.close()


def test_evaluations_count_together_at_the_limit_times_the_allowance(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    allowed = MOST * DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    for k in range(allowed):  # each a new executed model: a new release key
        ledger.reserve(_evaluation(k), job=f"e{k}")
    with pytest.raises(AttemptsExhausted, match="this federation's evaluations"):
        ledger.reserve(_evaluation(allowed), job="e-late")
    ledger.close()
    tight = _ledger(tmp_path / "tight", max_evaluations_per_federation=2)
    for k in range(2 * MOST):
        tight.reserve(_evaluation(k), job=f"e{k}")
    with pytest.raises(AttemptsExhausted):
        tight.reserve(_evaluation(99), job="e-late")
    tight.close()


def test_zero_sets_no_limit_and_so_does_an_unenforced_ledger(tmp_path: Path) -> None:
    free = _ledger(tmp_path / "free", max_unreleased_attempts=0)
    for k in range(10):
        free.reserve(_round(0, model=k), job=f"job-{k}")
    free.close()
    unenforced = ReleaseLedger(tmp_path / "off" / "privacy.db", participant="p0", enforce=False)
    for k in range(10):
        unenforced.reserve(_round(0, model=k), job=f"job-{k}")
    unenforced.close()
    one = _ledger(tmp_path / "one", max_unreleased_attempts=1)
    one.reserve(_round(0), job="first")
    with pytest.raises(AttemptsExhausted):
        one.reserve(_round(0, model=1), job="second")
    one.close()


def test_the_refusal_goes_as_its_own_rule_and_a_retry_is_not_made_for_it() -> None:
    assert policy_rule(AttemptsExhausted("x")) == pb.RULE_ATTEMPTS_EXHAUSTED
    assert "RULE_ATTEMPTS_EXHAUSTED" in UNCHANGEABLE


def test_the_policy_key_is_validated_and_a_weaker_value_is_logged() -> None:
    assert PolicySettings().max_unreleased_attempts == MOST
    for bad in (-1, True, 2.5, "3"):
        with pytest.raises(ValueError, match="max_unreleased_attempts must be an integer"):
            PolicySettings(max_unreleased_attempts=bad)  # type: ignore[arg-type]
    assert not [r for r in PolicySettings().relaxations() if "max_unreleased_attempts" in r]
    for weaker in (0, MOST + 1):
        (line,) = [
            r
            for r in PolicySettings(max_unreleased_attempts=weaker).relaxations()
            if "max_unreleased_attempts" in r
        ]
        assert "min_local_work_s = 0 does not hold it" in line
    held = PolicySettings(max_unreleased_attempts=0, min_local_work_s=5.0).relaxations()
    assert [r for r in held if "max_unreleased_attempts" in r and "does not hold" not in r]


def test_the_sites_default_is_the_coordinators_default_retry_count() -> None:
    """An honest coordinator's retries fit the sites' default; raised, it says so."""
    assert TrainingSettings().max_round_attempts == MOST
    base = CoordinatorSettings(participants=("p0", "p1", "p2"))
    assert attempts_warning(base) == []
    raised = replace(base, training=replace(base.training, max_round_attempts=MOST + 2))
    (line,) = attempts_warning(raised)
    assert f"max_round_attempts = {MOST + 2}" in line and "RULE_ATTEMPTS_EXHAUSTED" in line


def test_the_site_audit_lists_the_started_jobs_that_never_released_by_purpose(
    tmp_path: Path,
) -> None:
    """What a privacy officer reads: which purposes a coordinator started jobs for
    and abandoned (each one a reading of the local work's timing)."""
    ledger = _ledger(tmp_path)
    ledger.reserve(_round(0, model=1), job="r1-a")
    ledger.reserve(_round(0, model=2), job="r1-b")
    ledger.reserve(_round(1), job="r2-left")
    ledger.consume("r2-left")  # left: not an attempt any more
    ledger.reserve(_moments(1), job="m-a")
    for k in range(2):
        ledger.reserve(_evaluation(k), job=f"e{k}")
    with pytest.raises(AttemptsExhausted):
        for k in range(2, 20):
            ledger.reserve(_evaluation(k), job=f"e{k}")
    ledger.close()
    audit = read_site_audit(tmp_path)
    found = {(a.federation, a.purpose): a.jobs for a in audit.attempts}
    allowed = MOST * DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    assert found == {
        ("fed", "round 1"): ["r1-a", "r1-b"],
        ("fed", "moments"): ["m-a"],
        ("fed", "evaluations"): [f"e{k}" for k in range(allowed)],
    }
    text = format_site_audit(audit)
    assert "started jobs that never released: 3 purpose(s)" in text
    assert "p0 fed round 1: 2 job(s)" in text
    assert "Started jobs that never released" in site_audit_html(audit)
    status, out = run_site_audit(tmp_path, as_json=True)
    assert status == 0
    listed = json.loads(out)["unreleased_attempts"]
    assert {(a["purpose"], len(a["jobs"])) for a in listed} == {
        ("round 1", 2),
        ("moments", 1),
        ("evaluations", allowed),
    }
