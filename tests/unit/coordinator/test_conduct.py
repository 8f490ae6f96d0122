"""The coordinator's record of refusals and exclusions
(``spherecal.coordinator.driver.conduct``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from spherecal.coordinator.driver.conduct import Conduct, should_exclude
from spherecal.coordinator.state.store import Store
from spherecal.proto import spherecal_pb2 as pb


def test_a_strict_majority_of_other_holders_excludes() -> None:
    assert should_exclude(3, 4) and should_exclude(4, 4) and should_exclude(1, 1)
    assert not should_exclude(2, 4)  # half is not a majority: two liars cannot exclude
    assert not should_exclude(1, 2) and not should_exclude(0, 0)


def test_exclusion_and_refusal_are_recorded_and_survive_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    conduct = Conduct(store)
    entry = conduct.exclude("p3", job="ab" * 16, purpose="update", complainants=("p0", "p1"))
    assert entry is not None and "p0, p1" in entry.reason
    assert conduct.exclude("p3", job="cd" * 16, purpose="ffc", complainants=("p2",)) is None
    assert conduct.eligible(["p0", "p3", "p4"]) == ["p0", "p4"]
    conduct.refusal(
        participant="p4",
        job="ef" * 16,
        purpose="ffc",
        kind=pb.POLICY_REFUSAL,
        rule=pb.RULE_RELEASE_REPEATED,
        reason="already released",
    )
    summary = conduct.summary()
    assert [e["participant"] for e in summary["excluded"]] == ["p3"]
    assert summary["excluded"][0]["complainants"] == ["p0", "p1"]
    assert summary["refusals"] == [
        {
            "participant": "p4",
            "job": "ef" * 16,
            "purpose": "ffc",
            "kind": "POLICY_REFUSAL",
            "rule": "RULE_RELEASE_REPEATED",
            "reason": "already released",
        }
    ]
    store.close()
    reopened = Store(tmp_path / "state.db")
    again = Conduct(reopened)
    assert again.is_excluded("p3") and not again.is_excluded("p4")
    assert [r.rule for r in again.refusals] == ["RULE_RELEASE_REPEATED"]
    rows = reopened.query("SELECT type, participant FROM policy_events ORDER BY id")
    assert rows == [("exclusion", "p3"), ("refusal", "p4")]
    reopened.close()


def test_a_restart_keeps_every_exclusion_whole(tmp_path: Path) -> None:
    """``results.json`` ``excluded`` (``Conduct.summary``) reads the same after a
    coordinator resumes from its state directory: complainants included, in order."""
    store = Store(tmp_path / "state.db")
    conduct = Conduct(store)
    conduct.exclude("p3", job="ab" * 16, purpose="update", complainants=("p0", "p1", "p4"))
    conduct.exclude("p2", job="cd" * 16, purpose="ccvr", complainants=("p4", "p0"))
    before = conduct.summary()
    store.close()
    reopened = Store(tmp_path / "state.db")
    after = Conduct(reopened).summary()
    reopened.close()
    assert after == before
    assert [e["complainants"] for e in after["excluded"]] == [["p0", "p1", "p4"], ["p4", "p0"]]


def test_a_database_from_before_the_complainants_column_is_migrated(tmp_path: Path) -> None:
    """A state directory written before complainants were stored opens, gains the
    column, keeps its exclusion (with no complainant list: none was recorded) and
    records the next one whole."""
    path = tmp_path / "state.db"
    legacy = sqlite3.connect(path)
    legacy.execute(
        "CREATE TABLE policy_events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, "
        "type TEXT NOT NULL, participant TEXT NOT NULL, job TEXT, purpose TEXT, "
        "kind TEXT NOT NULL, rule TEXT, reason TEXT NOT NULL)"
    )
    legacy.execute(
        "INSERT INTO policy_events (ts, type, participant, job, purpose, kind, rule, reason) "
        "VALUES (1.0, 'exclusion', 'p3', 'ab', 'update', 'SHARE_AUTHENTICATION', NULL, 'old')"
    )
    legacy.commit()
    legacy.close()
    store = Store(path)
    conduct = Conduct(store)
    assert conduct.is_excluded("p3")
    assert conduct.excluded["p3"].complainants == ()
    conduct.exclude("p1", job="cd" * 16, purpose="ffc", complainants=("p0", "p2"))
    store.close()
    reopened = Store(path)
    again = Conduct(reopened)
    reopened.close()
    assert again.excluded["p1"].complainants == ("p0", "p2")
    assert again.excluded["p3"].reason == "old"
