"""At most ``[policy] max_evaluations_per_federation`` evaluation releases per
federation: each evaluation's noise is fresh while the same counts can be asked for
again at no cost (a model moved by one ulp is a new release key), so the number of
evaluations bounds how far the noise averages down. The site enforces it in its
ledger; the coordinator states what its schedule asks, and its default schedule fits
the sites' default limit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from spherecal.coordinator.evaluation_schedule import evaluations_per_site, evaluations_warning
from spherecal.coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    EvaluationSettings,
    TrainingSettings,
)
from spherecal.participant.failures import policy_rule, wire_reason
from spherecal.participant.policy import EvaluationsExhausted, ReleaseRepeated
from spherecal.participant.release_ledger import (
    REFUSAL,
    Release,
    ReleaseLedger,
)
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.privacy.evaluation_noise import DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
from tests.evaluation_ledger import evaluation, ledger_at, release_evaluation


def _ledger(tmp_path: Path, **rules: object) -> ReleaseLedger:
    return ledger_at(tmp_path / "privacy.db", **rules)


def test_the_evaluation_after_the_limit_is_refused_in_that_federation_only(
    tmp_path: Path,
) -> None:
    ledger = _ledger(tmp_path)
    most = DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    for k in range(most):
        release_evaluation(ledger, k)
    with pytest.raises(EvaluationsExhausted, match=rf"already answered {most} evaluation"):
        ledger.reserve(evaluation(most), job=f"fed-{most}")
    # another federation has its own count (of another split here: the same split's
    # lifetime is max_evaluations_per_split's, test_evaluations_per_split.py)
    release_evaluation(ledger, most, federation="other", data=b"v" * 32)
    ledger.close()
    # durable: a restarted site counts the same releases
    restarted = _ledger(tmp_path)
    with pytest.raises(EvaluationsExhausted):
        restarted.reserve(evaluation(most + 1), job="fed-late")
    restarted.close()


def test_a_refusal_in_an_evaluations_place_counts_and_a_reservation_does_not(
    tmp_path: Path,
) -> None:
    """A data-dependent refusal charged as the release counts (it is one bit of the
    data); a job that ended before anything left (only reserved) does not."""
    ledger = _ledger(tmp_path, max_evaluations_per_federation=2)
    release_evaluation(ledger, 0, answer=REFUSAL)
    ledger.reserve(evaluation(1), job="abandoned")  # never consumed
    release_evaluation(ledger, 2)
    with pytest.raises(EvaluationsExhausted):
        ledger.reserve(evaluation(3), job="fed-3")
    ledger.close()


def test_two_jobs_admitted_together_cannot_both_pass_the_limit(tmp_path: Path) -> None:
    """Consuming re-checks the count atomically: two evaluations reserved while one
    was left, the second to leave is refused at its upload."""
    ledger = _ledger(tmp_path, max_evaluations_per_federation=2)
    release_evaluation(ledger, 0)
    ledger.reserve(evaluation(1), job="a")
    ledger.reserve(evaluation(2), job="b")
    ledger.consume("a")
    with pytest.raises(EvaluationsExhausted):
        ledger.consume("b")
    ledger.close()


def test_the_limit_is_not_the_repeat_rule(tmp_path: Path) -> None:
    """The same evaluation asked again is still a repeat (its own rule), and the
    other families are not counted."""
    ledger = _ledger(tmp_path, max_evaluations_per_federation=1)
    release_evaluation(ledger, 0)
    with pytest.raises(ReleaseRepeated):
        ledger.reserve(evaluation(0), job="again")
    moments = Release(kind="ffc", federation="fed", model=b"m" * 32, data=b"d" * 32)
    ledger.reserve(moments, job="stats")
    ledger.consume("stats")
    ledger.close()


@pytest.mark.parametrize("rules", [{"max_evaluations_per_federation": 0}, None])
def test_no_limit_when_set_to_zero_or_unenforced(tmp_path: Path, rules: dict | None) -> None:
    if rules is None:
        ledger = ReleaseLedger(tmp_path / "privacy.db", participant="p0", enforce=False)
    else:
        ledger = _ledger(tmp_path, **rules)
    for k in range(DEFAULT_MAX_EVALUATIONS_PER_FEDERATION + 3):
        release_evaluation(ledger, k)
    ledger.close()


def test_the_refusal_travels_with_its_rule_and_its_text() -> None:
    """Its text is the site's declared limit and what this federation already got —
    both known to the coordinator — so it goes as it is."""
    error = EvaluationsExhausted("this site already answered 4 evaluation(s) ...")
    assert policy_rule(error) == pb.RULE_EVALUATIONS_EXHAUSTED
    assert wire_reason(error) == str(error)


# ------------------------------------------------------------------ the coordinator
def _coordinator(**kw: object) -> CoordinatorSettings:
    return replace(CoordinatorSettings(participants=("a", "b", "c")), **kw)  # type: ignore[arg-type]


def test_the_default_schedule_fits_the_sites_default_limit() -> None:
    """The final test evaluation and the validation gate's: two, below the default
    four; closed-form calibrators add their grid's one."""
    default = _coordinator()
    assert default.evaluations_per_site == default.essential_evaluations == 2
    assert default.evaluation.site_limit == DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    assert evaluations_warning(default) == []
    closed = _coordinator(calibration=CalibrationSettings(methods=("ffc", "ccvr", "lda", "qda")))
    assert closed.evaluations_per_site == 3 <= DEFAULT_MAX_EVALUATIONS_PER_FEDERATION


def test_per_round_evaluations_stop_where_the_sites_limit_keeps_room_for_the_rest() -> None:
    """Every round evaluated for 10 rounds would take 12 of a site's 4: the rounds get
    2 (rounds 1 and 2), the validation gate and the final evaluation keep theirs —
    decided by the schedule alone, and said at start."""
    every = _coordinator(
        training=TrainingSettings(rounds=10), evaluation=EvaluationSettings(federated_every=1)
    )
    assert every.evaluations_per_site == 2 + 10
    assert [r for r in range(10) if every.evaluates_after_round(r)] == [0, 1]
    (line,) = evaluations_warning(every)
    assert "stop after round 2" in line and "site_limit" in line
    sparse = _coordinator(
        training=TrainingSettings(rounds=10), evaluation=EvaluationSettings(federated_every=4)
    )
    assert [r for r in range(10) if sparse.evaluates_after_round(r)] == [3, 7]
    assert evaluations_warning(sparse) == []


def test_a_limit_raised_with_the_sites_lets_every_round_through_and_is_logged() -> None:
    raised = _coordinator(
        training=TrainingSettings(rounds=10),
        evaluation=EvaluationSettings(federated_every=1, site_limit=12),
    )
    assert [r for r in range(10) if raised.evaluates_after_round(r)] == list(range(10))
    (line,) = evaluations_warning(raised)
    assert "site_limit = 12" in line and "up to 12 evaluation releases" in line
    unlimited = _coordinator(evaluation=EvaluationSettings(federated_every=1, site_limit=0))
    assert all(unlimited.evaluates_after_round(r) for r in range(3))


def test_a_round_gate_the_sites_limit_cannot_hold_is_refused_at_start() -> None:
    """A round gate needs every round's check: with 3 rounds, 2 + 4 = 6 > 4."""
    with pytest.raises(ValueError, match=r"needs 6 evaluation releases .* site_limit = 4"):
        _coordinator(training=TrainingSettings(rounds=3), round_gate="flag")
    gated = _coordinator(
        training=TrainingSettings(rounds=3),
        round_gate="flag",
        evaluation=EvaluationSettings(site_limit=6),
    )
    assert gated.essential_evaluations == 6
    assert (
        evaluations_per_site(
            rounds=3, federated_every=0, round_gate="off", validation_gate=False, closed_forms=False
        )
        == 1
    )
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="site_limit"):
            EvaluationSettings(site_limit=bad)  # type: ignore[arg-type]
