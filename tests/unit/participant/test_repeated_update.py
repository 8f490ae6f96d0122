"""One exact training update (``ReleaseLedger.admit_update``): an update whose
digest (executed model, seed, broadcast, local training) equals one that already left,
in any federation, is refused under any round index, before any training, and again
atomically when its input is about to leave; a continued job is its own release, a
noised update is not the same one."""

from __future__ import annotations

from pathlib import Path

import pytest

from spherecal.participant.policy import ReleaseRepeated
from spherecal.participant.release_ledger import UPDATE, LedgerRules, Release, ReleaseLedger

EXECUTED = b"e" * 32
SAME = b"u" * 32
OTHER = b"v" * 32


def _round(r: int, *, federation: str = "fed", noised: bool = False) -> Release:
    return Release(
        kind=UPDATE,
        federation=federation,
        model=bytes([r]) * 32,  # the wire digest: another model's bytes each round
        data=b"d" * 32,
        round=r,
        noised=noised,
    )


def _ledger(tmp_path: Path, **rules: bool) -> ReleaseLedger:
    return ReleaseLedger(tmp_path / "privacy.db", participant="p0", rules=LedgerRules(**rules))


def test_the_same_update_under_another_round_is_refused(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.reserve(_round(0), job="a")
    ledger.admit_update("a", executed=EXECUTED, trained=SAME)
    ledger.consume("a")
    ledger.reserve(_round(1), job="b")  # the round index is new: admitted so far
    with pytest.raises(ReleaseRepeated, match="as round 1's"):
        ledger.admit_update("b", executed=EXECUTED, trained=SAME)
    ledger.admit_update("b", executed=EXECUTED, trained=OTHER)  # another seed: admitted
    ledger.consume("b")
    ledger.admit_update("a", executed=EXECUTED, trained=SAME)  # a continued job
    assert [job for job, _, _ in ledger.released()] == ["a", "b"]
    ledger.close()


def test_two_concurrent_jobs_of_one_update_leave_once(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    for job, r in (("a", 0), ("b", 1)):
        ledger.reserve(_round(r), job=job)
        ledger.admit_update(job, executed=EXECUTED, trained=SAME)  # neither left yet
    ledger.consume("a")
    with pytest.raises(ReleaseRepeated):
        ledger.check_consumable("b")
    with pytest.raises(ReleaseRepeated):
        ledger.consume("b")
    assert [job for job, _, _ in ledger.released()] == ["a"]
    ledger.close()


def test_a_noised_update_is_not_the_same(tmp_path: Path) -> None:
    """Fresh DP-SGD noise: never the same update twice."""
    ledger = _ledger(tmp_path)
    ledger.reserve(_round(0), job="a")
    ledger.admit_update("a", executed=EXECUTED, trained=SAME)
    ledger.consume("a")
    ledger.reserve(_round(1, noised=True), job="b")
    ledger.admit_update("b", executed=EXECUTED, trained=SAME)
    ledger.consume("b")
    ledger.close()


def test_the_same_update_in_another_federation_is_refused(tmp_path: Path) -> None:
    """Since 2026-11-28 the rule holds in any federation (before, per federation): a
    second federation's round 1 from the first's model and seed is the first's update,
    refused before any training — also by the ledger of a restarted site — and its
    reason names the federation it left in and what avoids it. Another update in the
    other federation is admitted."""
    ledger = _ledger(tmp_path)
    ledger.reserve(_round(0), job="a")
    ledger.admit_update("a", executed=EXECUTED, trained=SAME)
    ledger.consume("a")
    ledger.close()
    restarted = _ledger(tmp_path)
    restarted.reserve(_round(0, federation="other"), job="b")
    with pytest.raises(ReleaseRepeated, match=r"federation 'fed', not this one.*seed"):
        restarted.admit_update("b", executed=EXECUTED, trained=SAME)
    restarted.admit_update("b", executed=EXECUTED, trained=OTHER)
    restarted.consume("b")
    restarted.close()


def test_one_update_per_round_off_admits_the_same_update(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, one_update_per_round=False)
    for job, r in (("a", 0), ("b", 1)):
        ledger.reserve(_round(r), job=job)
        ledger.admit_update(job, executed=EXECUTED, trained=SAME)
        ledger.consume(job)
    assert len(ledger.released()) == 2
    ledger.close()


def test_a_noised_first_update_holds_no_exact_one(tmp_path: Path) -> None:
    """Its update carried fresh noise, so an exact one of the same digest differs."""
    ledger = _ledger(tmp_path)
    ledger.reserve(_round(0, noised=True), job="a")
    ledger.admit_update("a", executed=EXECUTED, trained=SAME)
    ledger.consume("a")
    ledger.reserve(_round(1), job="b")
    ledger.admit_update("b", executed=EXECUTED, trained=SAME)
    ledger.consume("b")
    ledger.close()
