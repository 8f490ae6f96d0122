"""One contract suite for every LedgerStore backend (memory, SQLite), plus budget refusal."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spherecal.spherefed.privacy.accounting import compose, epsilon
from spherecal.spherefed.privacy.charge import PrivacyCharge, dpsgd_charge, gaussian_charge
from spherecal.spherefed.privacy.ledger import (
    BudgetExceeded,
    DuplicateRelease,
    LedgerStore,
    MemoryLedgerStore,
    PrivacyBudget,
    PrivacyLedger,
    SqliteLedgerStore,
)
from spherecal.spherefed.privacy.plan import plan_calibration_release

DELTA = 1e-5


@pytest.fixture(params=["memory", "sqlite-memory", "sqlite-file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerStore]:
    if request.param == "memory":
        yield MemoryLedgerStore()
        return
    path = ":memory:" if request.param == "sqlite-memory" else str(tmp_path / "site.db")
    conn = sqlite3.connect(path)
    try:
        yield SqliteLedgerStore(conn)
    finally:
        conn.close()


def ffc_charge(eps_target: float = 1.0) -> PrivacyCharge:
    plan = plan_calibration_release(
        "ffc",
        dim=8,
        num_classes=3,
        participants=5,
        min_contributors=3,
        epsilon_target=eps_target,
        delta=DELTA,
        max_examples=1000,
    )
    return plan.charge(3)


# ------------------------------------------------------------------ contract
def test_records_in_order_with_composed_totals(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, PrivacyBudget(delta=DELTA))
    charges = [ffc_charge(1.0), gaussian_charge("model_update", 2.0, DELTA), ffc_charge(0.5)]
    for i, c in enumerate(charges):
        ledger.charge("site-a", c, release_id=f"job-{i}")
    entries = ledger.entries("site-a")
    assert [e.release_id for e in entries] == ["job-0", "job-1", "job-2"]
    assert [e.charge for e in entries] == charges  # round-trips exactly (JSON for SQLite)
    totals = [e.epsilon_total for e in entries]
    assert totals == sorted(totals) and totals[0] == pytest.approx(charges[0].epsilon)
    expected, _ = epsilon(compose([c.curve for c in charges]), DELTA)
    assert ledger.spent("site-a").epsilon == pytest.approx(expected)
    assert totals[-1] == pytest.approx(expected)
    assert ledger.spent("site-a").releases == 3


def test_subjects_are_independent(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, PrivacyBudget(delta=DELTA, total_epsilon=1.5))
    ledger.charge("a", ffc_charge(1.0), release_id="j1")
    ledger.charge("b", ffc_charge(1.0), release_id="j1")
    assert store.subjects() == ["a", "b"]
    assert ledger.spent("c").releases == 0 and ledger.spent("c").epsilon == 0.0


def test_total_budget_refusal_carries_the_numbers_and_writes_nothing(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, PrivacyBudget(delta=DELTA, total_epsilon=2.0))
    first = ledger.charge("site-a", ffc_charge(1.5), release_id="j1")
    with pytest.raises(BudgetExceeded) as err:
        ledger.charge("site-a", ffc_charge(1.5), release_id="j2")
    e = err.value
    assert e.limit == "total" and e.budget_epsilon == 2.0 and e.subject == "site-a"
    assert e.spent_epsilon == pytest.approx(first.epsilon_total)
    assert e.projected_epsilon > 2.0 and e.release_epsilon == pytest.approx(1.5, rel=1e-3)
    assert "ε = 2" in str(e) and e.numbers()["delta"] == DELTA
    assert [x.release_id for x in ledger.entries("site-a")] == ["j1"]
    ledger.charge("site-a", ffc_charge(0.2), release_id="j3")  # a smaller one still fits


def test_per_release_target_refusal(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, PrivacyBudget(delta=DELTA, epsilon_per_release=1.0))
    ledger.charge("s", ffc_charge(1.0), release_id="ok")  # lands just below the target
    with pytest.raises(BudgetExceeded) as err:
        ledger.charge("s", ffc_charge(2.0), release_id="too-much")
    assert err.value.limit == "per_release"
    assert len(ledger.entries("s")) == 1


def test_duplicate_release_is_refused(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, PrivacyBudget(delta=DELTA))
    ledger.charge("s", ffc_charge(), release_id="job-7", job_id="abc")
    with pytest.raises(DuplicateRelease):
        ledger.record("s", ffc_charge(), release_id="job-7")
    assert len(ledger.entries("s")) == 1 and ledger.entries("s")[0].job_id == "abc"


def test_record_without_check_and_report(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, PrivacyBudget(delta=DELTA, total_epsilon=0.1))
    entry = ledger.record("federation", ffc_charge(1.0), release_id="ffc-1")  # after the fact
    assert entry.epsilon_total > 0.1
    report = ledger.report()
    fed = report["subjects"]["federation"]
    assert fed["within_budget"] is False and fed["releases"] == 1
    assert fed["entries"][0]["mechanism"] == "skellam" and "rdp" in fed["entries"][0]
    assert fed["delta_with_truncation"] >= DELTA


def test_delta_must_match_the_budget(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, PrivacyBudget(delta=1e-6))
    with pytest.raises(ValueError, match="δ"):
        ledger.charge("s", ffc_charge(), release_id="j")


# ------------------------------------------------------------------ SQLite specifics
def test_sqlite_store_lives_in_the_owners_database(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE jobs (id TEXT)")
    conn.execute("INSERT INTO jobs VALUES ('x')")
    conn.commit()
    ledger = PrivacyLedger(SqliteLedgerStore(conn), PrivacyBudget(delta=DELTA))
    ledger.charge("p1", dpsgd_charge(1.0, 0.01, 100, DELTA, max_grad_norm=1.0), release_id="r")
    assert conn.execute("SELECT id FROM jobs").fetchall() == [("x",)]  # untouched
    assert conn.execute("SELECT 1").fetchone() == (1,)  # not closed by the store
    conn.close()
    reopened = sqlite3.connect(path)  # a restarted process sees the same ledger
    again = PrivacyLedger(SqliteLedgerStore(reopened), PrivacyBudget(delta=DELTA))
    assert [e.release_id for e in again.entries("p1")] == ["r"]
    assert again.entries("p1")[0].charge.mechanism == "dpsgd"
    reopened.close()
    with pytest.raises(ValueError):
        SqliteLedgerStore(sqlite3.connect(":memory:"), table="x; DROP TABLE jobs")


def test_participant_refuses_the_job_that_would_overrun_its_budget() -> None:
    """The participant-side flow: before joining, charge the job's planned cost (with
    the fewest contributors the job guarantees); the third job is refused."""
    ledger = PrivacyLedger(MemoryLedgerStore(), PrivacyBudget(delta=DELTA, total_epsilon=1.7))
    plan = plan_calibration_release(
        "ffc",
        dim=8,
        num_classes=3,
        participants=5,
        min_contributors=3,
        epsilon_target=1.0,
        delta=DELTA,
        max_examples=1000,
    )
    ledger.charge("me", plan.charge(plan.noise.min_contributors), release_id="job-1")
    ledger.charge("me", plan.charge(plan.noise.min_contributors), release_id="job-2")
    with pytest.raises(BudgetExceeded) as err:
        ledger.charge("me", plan.charge(plan.noise.min_contributors), release_id="job-3")
    assert err.value.spent_epsilon < 1.7 < err.value.projected_epsilon  # 1.46 -> 1.83
    assert np.isclose(err.value.release_epsilon, plan.planned_epsilon)


# ------------------------------------------------------------------ a plan at once
def test_a_plan_is_admitted_against_what_was_spent_outside_it(store: LedgerStore) -> None:
    """``check_plan``: each release within the per-release target, the plan's
    releases composed within the total beside everything charged outside the plan;
    its own charges (by prefix) are not counted twice, so the answer does not change
    as the plan's releases are charged."""
    each = dpsgd_charge(1.0, 0.1, 10, DELTA, max_grad_norm=1.0)
    whole = dpsgd_charge(1.0, 0.1, 40, DELTA, max_grad_norm=1.0)
    other = gaussian_charge("ffc", 3.0, DELTA)
    fits_alone = whole.epsilon * 1.001
    ledger = PrivacyLedger(store, PrivacyBudget(delta=DELTA, total_epsilon=fits_alone))
    for r in range(4):  # the plan's own rounds, charged as they happen: same answer
        ledger.check_plan("s", each, whole, own_prefix="plan-a/")
        ledger.charge("s", each, release_id=f"plan-a/{r}")
    assert ledger.spent("s").epsilon == pytest.approx(whole.epsilon, rel=1e-9)

    ledger.record("s", other, release_id="stats-1")  # spent outside plan b (no check)
    with pytest.raises(BudgetExceeded) as caught:
        ledger.check_plan("s", each, whole, own_prefix="plan-b/")
    e = caught.value
    curves = [np.asarray(c.curve) for c in (each,) * 8 + (other,)]  # plan a, b, the rest
    expected = epsilon(compose(curves), DELTA)[0]
    assert e.limit == "total" and e.release_epsilon == whole.epsilon
    assert e.projected_epsilon == pytest.approx(expected, rel=1e-9)
    assert e.spent_epsilon == pytest.approx(ledger.spent("s").epsilon, rel=1e-9)

    strict = PrivacyLedger(store, PrivacyBudget(delta=DELTA, epsilon_per_release=each.epsilon / 2))
    with pytest.raises(BudgetExceeded) as caught:
        strict.check_plan("t", each, whole, own_prefix="plan-c/")
    assert caught.value.limit == "per_release" and caught.value.release_epsilon == each.epsilon
