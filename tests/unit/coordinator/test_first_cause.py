"""A failed round names the first cause — a site's refusal — not only the symptom
(issue #23)."""

from __future__ import annotations

from spherecal.coordinator.driver.stages import with_first_cause

QUORUM = "TooFewSurvivors: too few survivors at stage 'masked': needed at least 3, only 2 remained"


def test_withdrawals_are_named_after_the_symptom() -> None:
    dropped = {
        "p0": "masked: withdrew: BAD_INPUT: refusing to encode: 1 of 158563 entries are "
        "outside the declared bound |x| <= 100000.0",
        "p1": "share: disconnected / heartbeat timeout",
    }
    reason = with_first_cause(QUORUM, dropped)
    assert reason == (
        QUORUM + " — first cause: p0 withdrew at masked: BAD_INPUT: refusing to encode: 1 of "
        "158563 entries are outside the declared bound |x| <= 100000.0"
    )


def test_without_a_withdrawal_the_error_stands() -> None:
    assert with_first_cause(QUORUM, {}) == QUORUM
    assert with_first_cause(QUORUM, {"p1": "masked: stage deadline"}) == QUORUM


def test_a_long_reason_is_cut() -> None:
    reason = with_first_cause(QUORUM, {"p0": "masked: withdrew: " + "x" * 1000})
    assert reason.endswith("x" * 240) and len(reason) < len(QUORUM) + 300


def test_sites_giving_the_same_reason_are_named_together_and_others_apart() -> None:
    refusal = "POLICY_REFUSAL: the update of round 2 already left this site"
    dropped = {
        "p0": f"advertise: withdrew: {refusal}",
        "p1": f"advertise: withdrew: {refusal}",
        "p2": "advertise: withdrew: BAD_INPUT: refusing to encode",
        "p3": f"advertise: withdrew: {refusal}",
        "p4": f"share: withdrew: {refusal}",
        "p5": "advertise: disconnected / heartbeat timeout",
    }
    assert with_first_cause(QUORUM, dropped) == (
        f"{QUORUM} — first cause: p0, p1, p3 withdrew at advertise: {refusal}; "
        "p2 withdrew at advertise: BAD_INPUT: refusing to encode; "
        f"p4 withdrew at share: {refusal}"
    )
