"""One exact training update per federation (``ReleaseLedger.admit_update``): an
update whose digest (executed model, seed, broadcast, local training) equals one that
already left in the federation is refused under any round index, before any
training, and again atomically when its input is about to leave; a continued job is
its own release, a noised update or another federation is not the same one."""

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


@pytest.mark.parametrize(
    "second",
    [
        _round(1, noised=True),  # fresh DP-SGD noise: never the same update twice
        _round(1, federation="other"),  # the rule is per federation
    ],
)
def test_a_noised_update_or_another_federation_is_not_the_same(
    tmp_path: Path, second: Release
) -> None:
    ledger = _ledger(tmp_path)
    ledger.reserve(_round(0), job="a")
    ledger.admit_update("a", executed=EXECUTED, trained=SAME)
    ledger.consume("a")
    ledger.reserve(second, job="b")
    ledger.admit_update("b", executed=EXECUTED, trained=SAME)
    ledger.consume("b")
    ledger.close()


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
