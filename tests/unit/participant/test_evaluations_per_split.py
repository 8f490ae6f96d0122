"""At most ``[policy] max_evaluations_per_split`` evaluation releases of one local
split for its lifetime, across every federation: the per-federation count starts over
in each new federation, while the counts a coordinator can ask for again (the split's
total, a constant head's label histogram) stay those of the same records. Unset, the
limit is ``max_evaluations_per_federation``'s value; a split whose records changed
(another fingerprint) counts on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spherecal.participant.failures import policy_rule
from spherecal.participant.policy import EvaluationsExhausted, PolicySettings
from spherecal.participant.release_ledger import (
    REFUSAL,
    ReleaseLedger,
)
from spherecal.proto import spherecal_pb2 as pb
from spherecal.site_audit import format_site_audit, read_site_audit, site_audit_html
from spherecal.spherefed.privacy.evaluation_noise import DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
from tests.evaluation_ledger import TEST_SPLIT, evaluation, ledger_at, release_evaluation

TEST = TEST_SPLIT
VALIDATION = b"v" * 32
GROWN = b"g" * 32
"""The test split after a record was added: another fingerprint."""


def _ledger(tmp_path: Path, **rules: object) -> ReleaseLedger:
    return ledger_at(tmp_path / "state" / "privacy.db", **rules)


def test_the_splits_evaluations_stop_across_federations_and_after_a_restart(
    tmp_path: Path,
) -> None:
    """Two evaluations in each of two federations (each under its own limit of four):
    the split's four are spent, and a third federation's first is refused — also by
    the ledger of a restarted site."""
    ledger = _ledger(tmp_path)
    for k in range(4):
        release_evaluation(ledger, k, federation=f"fed-{k // 2}")
    with pytest.raises(EvaluationsExhausted) as refused:
        ledger.reserve(evaluation(4, "fed-2"), job="fed-2-4")
    text = str(refused.value)
    assert "max_evaluations_per_split = 4" in text and "in 2 federation(s)" in text
    assert policy_rule(refused.value) == pb.RULE_EVALUATIONS_EXHAUSTED
    assert ledger.split_evaluations(TEST) == (4, 2)
    ledger.close()
    restarted = _ledger(tmp_path)
    with pytest.raises(EvaluationsExhausted, match="max_evaluations_per_split"):
        restarted.reserve(evaluation(5, "fed-3"), job="fed-3-5")
    restarted.close()


def test_another_split_and_changed_records_count_on_their_own(tmp_path: Path) -> None:
    """The validation split is other records; so is the test split once a record was
    added (its fingerprint changed): neither is refused for the test split's four."""
    ledger = _ledger(tmp_path)
    for k in range(4):
        release_evaluation(ledger, k, federation=f"fed-{k // 2}")
    release_evaluation(ledger, 10, federation="fed-2", data=VALIDATION)
    release_evaluation(ledger, 11, federation="fed-2", data=GROWN)
    assert ledger.split_evaluations(VALIDATION) == (1, 1)
    assert ledger.split_evaluations(GROWN) == (1, 1)
    ledger.close()


def test_within_one_federation_the_federations_limit_refuses_first(tmp_path: Path) -> None:
    """Unset, the split's limit equals the federation's: inside one federation the
    federation's count (both splits together) reaches it first, so nothing that ran
    before this rule is refused differently."""
    ledger = _ledger(tmp_path)
    for k in range(DEFAULT_MAX_EVALUATIONS_PER_FEDERATION):
        release_evaluation(ledger, k, federation="fed")
    with pytest.raises(EvaluationsExhausted, match="max_evaluations_per_federation = 4"):
        ledger.reserve(evaluation(9, "fed"), job="fed-9")
    ledger.close()


def test_unset_it_follows_the_federations_limit(tmp_path: Path) -> None:
    """A site that raised ``max_evaluations_per_federation`` to 6 (per-round
    evaluations) has six per split for its lifetime, not six per federation."""
    ledger = _ledger(tmp_path, max_evaluations_per_federation=6)
    for k in range(6):
        release_evaluation(ledger, k, federation=f"fed-{k // 3}")
    with pytest.raises(EvaluationsExhausted, match="max_evaluations_per_split = 6"):
        ledger.reserve(evaluation(6, "fed-2"), job="fed-2-6")
    ledger.close()


def test_set_it_is_its_own_number(tmp_path: Path) -> None:
    """Raised to 8 beside the federation's 4: two federations of four, then refused;
    lowered to 1: the second evaluation of the split, in any federation, is refused."""
    ledger = _ledger(tmp_path / "raised", max_evaluations_per_split=8)
    for k in range(8):
        release_evaluation(ledger, k, federation=f"fed-{k // 4}")
    with pytest.raises(EvaluationsExhausted, match="max_evaluations_per_split = 8"):
        ledger.reserve(evaluation(8, "fed-2"), job="fed-2-8")
    ledger.close()
    ledger = _ledger(tmp_path / "lowered", max_evaluations_per_split=1)
    release_evaluation(ledger, 0, federation="fed-0")
    with pytest.raises(EvaluationsExhausted, match="max_evaluations_per_split = 1"):
        ledger.reserve(evaluation(1, "fed-0"), job="fed-0-1")
    ledger.close()


@pytest.mark.parametrize("rules", [{"max_evaluations_per_split": 0}, None])
def test_no_lifetime_limit_when_set_to_zero_or_unenforced(
    tmp_path: Path, rules: dict[str, int] | None
) -> None:
    if rules is None:
        ledger = ReleaseLedger(tmp_path / "privacy.db", participant="p0", enforce=False)
    else:
        ledger = _ledger(tmp_path, **rules)
    for k in range(12):  # three federations of four
        release_evaluation(ledger, k, federation=f"fed-{k // 4}")
    ledger.close()


def test_a_refusal_in_its_place_counts_and_a_reservation_does_not(tmp_path: Path) -> None:
    """As for the federation's count: a data-dependent refusal charged as the release
    is one of the split's; a job abandoned before anything left is not."""
    ledger = _ledger(tmp_path, max_evaluations_per_split=2)
    release_evaluation(ledger, 0, federation="fed-0", answer=REFUSAL)
    ledger.reserve(evaluation(1, "fed-1"), job="abandoned")  # never consumed
    release_evaluation(ledger, 2, federation="fed-1")
    with pytest.raises(EvaluationsExhausted):
        ledger.reserve(evaluation(3, "fed-2"), job="fed-2-3")
    ledger.close()


def test_two_federations_jobs_admitted_together_cannot_both_pass(tmp_path: Path) -> None:
    """Consuming re-checks the split's count atomically: two evaluations of the split
    reserved in two federations while one was left, the second to leave is refused."""
    ledger = _ledger(tmp_path, max_evaluations_per_split=2)
    release_evaluation(ledger, 0, federation="fed-0")
    ledger.reserve(evaluation(1, "fed-1"), job="a")
    ledger.reserve(evaluation(2, "fed-2"), job="b")
    ledger.consume("a")
    with pytest.raises(EvaluationsExhausted, match="max_evaluations_per_split"):
        ledger.consume("b")
    ledger.close()


@pytest.mark.parametrize("key", ["max_evaluations_per_federation", "max_evaluations_per_split"])
def test_each_evaluation_limit_is_checked_and_a_weaker_value_logged(key: str) -> None:
    assert not [r for r in PolicySettings().relaxations() if "max_evaluations" in r]
    for bad in (-1, True, 2.5, "4"):
        with pytest.raises(ValueError, match=key):
            PolicySettings(**{key: bad})  # type: ignore[arg-type]
    for weaker in (0, DEFAULT_MAX_EVALUATIONS_PER_FEDERATION + 1):
        weakened = PolicySettings(**{key: weaker})  # type: ignore[arg-type]
        (line,) = [r for r in weakened.relaxations() if key in r]
        assert f"{key} = {weaker}" in line
    stricter = PolicySettings(**{key: 1})  # type: ignore[arg-type]
    assert not [r for r in stricter.relaxations() if "max_evaluations" in r]


def test_unset_the_split_limit_is_the_federations_and_raising_that_says_so() -> None:
    assert PolicySettings().max_evaluations_per_split is None
    assert PolicySettings().max_evaluations_per_federation == DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    (line,) = PolicySettings(max_evaluations_per_federation=6).relaxations()
    assert "of each split across federations too" in line
    (line,) = [
        r
        for r in PolicySettings(
            max_evaluations_per_federation=6, max_evaluations_per_split=2
        ).relaxations()
        if "max_evaluations" in r
    ]
    assert "across federations" not in line


def test_the_site_audit_lists_each_splits_evaluations_across_federations(
    tmp_path: Path,
) -> None:
    ledger = _ledger(tmp_path)
    for k in range(3):
        release_evaluation(ledger, k, federation=f"fed-{k // 2}")
    release_evaluation(ledger, 5, federation="fed-1", data=VALIDATION)
    ledger.reserve(evaluation(6, "fed-1"), job="abandoned")  # left nothing: not counted
    ledger.close()
    audit = read_site_audit(tmp_path / "state")
    splits = {x["split"]: x for x in audit.to_json()["evaluations_per_split"]}
    assert splits[TEST.hex()] == {
        "participant": "p0",
        "split": TEST.hex(),
        "evaluations": 3,
        "federations": ["fed-0", "fed-1"],
    }
    assert splits[VALIDATION.hex()]["evaluations"] == 1
    text = format_site_audit(audit)
    assert "evaluations per split, all federations: 2 split(s)" in text
    assert f"split {TEST.hex()[:12]}: 3 evaluation(s) in 2 federation(s)" in text
    page = site_audit_html(audit)
    assert "Evaluations per split, all federations" in page and TEST.hex()[:12] in page
    json.dumps(audit.to_json())  # the JSON stays serialisable
