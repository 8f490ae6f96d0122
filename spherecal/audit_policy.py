"""``spherecal audit``: participants' typed refusals and the coordinator's exclusions.

Reads the coordinator database's ``policy_events`` table (written by
``spherecal.coordinator.driver.conduct``); each exclusion lists the participants whose signed
complaints caused it. Refusals are evidence, not failures: a site refusing what
its policy forbids is the system working. The check fails only when an excluded
participant appears in a job created after its exclusion — the coordinator would then
not have honoured its own record.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from spherecal.results_schema import AuditCheck

__all__ = ["check_policy"]


def check_policy(conn: sqlite3.Connection) -> AuditCheck:
    if not conn.execute("SELECT name FROM sqlite_master WHERE name='policy_events'").fetchall():
        return {
            "ok": True,
            "summary": "no policy records (older database)",
            "refusals": [],
            "violations": [],
        }
    columns = {row[1] for row in conn.execute("PRAGMA table_info(policy_events)")}
    named = "complainants" if "complainants" in columns else "NULL"  # older databases
    rows = conn.execute(
        "SELECT ts, type, participant, job, purpose, kind, rule, reason, "
        f"{named} FROM policy_events ORDER BY id"
    ).fetchall()
    refusals: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    for ts, type_, participant, job, purpose, kind, rule, reason, complainants in rows:
        entry = {
            "participant": participant,
            "job": job,
            "purpose": purpose,
            "kind": kind,
            "rule": rule,
            "reason": reason,
            "ts": ts,
        }
        if type_ == "refusal":
            refusals.append(entry)
        else:
            # who filed the signed complaints that excluded it (a strict majority of
            # its other share holders); empty for exclusions recorded before the column
            entry["complainants"] = sorted(json.loads(complainants)) if complainants else []
            excluded.append(entry)
    violations = []
    for entry in excluded:
        for job_id, participants in conn.execute(
            "SELECT job_id, participants FROM jobs WHERE created > ?", (entry["ts"],)
        ).fetchall():
            if entry["participant"] in json.loads(participants):
                violations.append({"participant": entry["participant"], "job": job_id})
    ok = not violations
    summary = f"{len(refusals)} typed refusals, {len(excluded)} exclusions" + (
        "" if ok else f"; {len(violations)} later jobs include an excluded participant"
    )
    return {
        "ok": ok,
        "summary": summary,
        "refusals": refusals,
        "excluded": excluded,
        "violations": violations,
    }
