"""``spherecal audit``'s participant-policy check: exclusions name their
complainants, older databases (no ``complainants`` column) still audit, and an
excluded participant in a later job fails the check."""

from __future__ import annotations

import json
import sqlite3

from spherecal.audit_policy import check_policy

POLICY = """CREATE TABLE policy_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, type TEXT NOT NULL,
    participant TEXT NOT NULL, job TEXT, purpose TEXT, kind TEXT NOT NULL, rule TEXT,
    reason TEXT NOT NULL{extra})"""
JOBS = "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, created REAL NOT NULL, participants TEXT)"


def _db(*, with_complainants: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute(POLICY.format(extra=", complainants TEXT" if with_complainants else ""))
    conn.execute(JOBS)
    cols = "ts, type, participant, job, purpose, kind, rule, reason"
    exclusion = [10.0, "exclusion", "p3", "j1", "update", "SHARES_FAILED", None, "forged"]
    refusal = [5.0, "refusal", "p1", "j0", "ffc", "POLICY_REFUSAL", "RELEASE", "repeat"]
    if with_complainants:
        cols += ", complainants"
        exclusion.append(json.dumps(["p4", "p0", "p2"]))
        refusal.append(None)
    marks = ", ".join("?" * len(exclusion))
    conn.execute(f"INSERT INTO policy_events ({cols}) VALUES ({marks})", refusal)
    conn.execute(f"INSERT INTO policy_events ({cols}) VALUES ({marks})", exclusion)
    conn.execute("INSERT INTO jobs VALUES ('j0', 1.0, ?)", (json.dumps(["p0", "p3"]),))
    conn.execute("INSERT INTO jobs VALUES ('j2', 11.0, ?)", (json.dumps(["p0", "p1"]),))
    return conn


def test_exclusions_name_their_complainants() -> None:
    report = check_policy(_db(with_complainants=True))
    assert report["ok"] and report["violations"] == []
    assert [e["participant"] for e in report["excluded"]] == ["p3"]
    assert report["excluded"][0]["complainants"] == ["p0", "p2", "p4"]
    assert [e["rule"] for e in report["refusals"]] == ["RELEASE"]
    assert "complainants" not in report["refusals"][0]


def test_an_older_database_audits_with_no_complainants_named() -> None:
    report = check_policy(_db(with_complainants=False))
    assert report["ok"] and report["excluded"][0]["complainants"] == []


def test_an_excluded_participant_in_a_later_job_fails_the_check() -> None:
    conn = _db(with_complainants=True)
    conn.execute("INSERT INTO jobs VALUES ('j3', 12.0, ?)", (json.dumps(["p0", "p3"]),))
    report = check_policy(conn)
    assert not report["ok"]
    assert report["violations"] == [{"participant": "p3", "job": "j3"}]
