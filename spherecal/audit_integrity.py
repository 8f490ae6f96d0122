"""``spherecal audit``: the integrity section (issue #22).

Secure aggregation hides each site's input, so the audit cannot check that a site
told the truth; it can check that the coordinator held the sums it had against each
other and against the per-site bound, and that it shipped no calibrated head that
the federated validation split rejected. Reads the ``integrity`` record the
coordinator writes into the database's ``meta`` table at the end of a run
(``spherecal.coordinator.driver.integrity``): the bound ``max_examples_per_site``,
every cross-check, the validation gate's decision per head and per round.

The check fails when any cross-check failed, any head was rejected by the gate, or
any round was flagged (a head from a DP release that the gate withheld because it
did not beat the uncalibrated model is listed, not failed: noise explains it): the
run's result is then not what an all-honest federation would have produced, and the
report must not read PASS.

The record is written when the run ends; each failed cross-check is also an error
event the moment it fails (``integrity check failed: …``, in the ``events`` table).
So the check also fails on such an event the record does not hold: a database
audited while its coordinator runs, or left by one killed before its end was
recorded, holds no record yet — until 2026-11-27 that read "a run before
cross-checks were recorded" and passed, just after a dishonest site's statistics
had been refused — and a coordinator that resumed starts its record afresh, so the
failures before the restart are in the events alone.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from spherecal.results_schema import AuditCheck

__all__ = ["check_integrity"]


FAILED_CHECK_EVENT = "integrity check failed: "
"""How :func:`spherecal.coordinator.driver.integrity.note` begins the error event of a
failed check (``integrity check failed: CHECK: DETAIL``)."""


def _failed_check_events(conn: sqlite3.Connection) -> list[str]:
    """The messages of every failed-check event, oldest first (none in a database
    without the table)."""
    try:
        rows = conn.execute(
            "SELECT message FROM events WHERE level = 'error' AND substr(message, 1, ?) = ? "
            "ORDER BY ts",
            (len(FAILED_CHECK_EVENT), FAILED_CHECK_EVENT),
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    return [str(r[0]) for r in rows]


def _event_violations(events: list[str], recorded: set[str]) -> list[dict[str, Any]]:
    """A violation for each failed-check event whose check the record does not hold."""
    out = []
    for message in events:
        if message in recorded:
            continue
        check, _, detail = message[len(FAILED_CHECK_EVENT) :].partition(": ")
        out.append({"cross_check": check, "detail": detail, "source": "events"})
    return out


def check_integrity(conn: sqlite3.Connection) -> AuditCheck:
    events = _failed_check_events(conn)
    row = conn.execute("SELECT value FROM meta WHERE key = 'integrity'").fetchone()
    if row is None:
        ended = conn.execute("SELECT value FROM meta WHERE key = 'status'").fetchone()
        logged = _event_violations(events, set())
        why = (
            "a run before cross-checks were recorded"
            if ended is not None
            else "the run has not ended, or its coordinator stopped before recording its end"
        )
        return {
            "ok": not logged,
            "summary": f"no integrity record ({why}); "
            f"{len(logged)} failed cross-check(s) in its event log",
            "violations": logged,
        }
    record: dict[str, Any] = json.loads(row[0])
    checks = list(record.get("checks", []))
    heads: dict[str, Any] = record.get("gate", {}).get("heads", {})
    rounds = list(record.get("gate", {}).get("rounds", []))
    violations: list[dict[str, Any]] = [
        {"cross_check": c["check"], "detail": c["detail"]} for c in checks if not c["passed"]
    ]
    # failures of before a resume (the resumed coordinator's record starts afresh)
    earlier = _event_violations(
        events, {f"{FAILED_CHECK_EVENT}{c['check']}: {c['detail']}" for c in checks}
    )
    violations += earlier
    # A head from a DP release withheld because it did not beat the uncalibrated model
    # is the noise's doing, not a dishonest site's, and what shipped is no worse than
    # no calibration (issue #25): listed, not a violation.
    withheld = {n: h for n, h in heads.items() if not h.get("shipped") and h.get("rule") == "dp"}
    violations += [
        {"rejected_head": name, "reason": h.get("reason")}
        for name, h in heads.items()
        if not h.get("shipped") and name not in withheld
    ]
    violations += [
        {"flagged_round": r["round"], "before": r.get("before"), "after": r.get("after")}
        for r in rounds
        if r.get("flagged")
    ]
    bound = record.get("max_examples_per_site")
    passed = sum(1 for c in checks if c["passed"])
    gate = "on" if record.get("validation_gate", True) else "OFF"
    summary = (
        f"{passed}/{len(checks)} cross-checks agree; each site bounded at {bound} examples; "
        f"validation gate {gate}: {sum(1 for h in heads.values() if h.get('shipped'))} "
        f"head(s) shipped, {sum(1 for h in heads.values() if not h.get('shipped')) - len(withheld)}"
        f" rejected, {len(withheld)} DP head(s) withheld (no better than uncalibrated); "
        f"round gate {record.get('round_gate', 'off')}"
        + (f", {sum(1 for r in rounds if r.get('flagged'))} round(s) flagged" if rounds else "")
        + (
            f"; {len(earlier)} failed cross-check(s) before a restart, from its event log"
            if earlier
            else ""
        )
    )
    return {
        "ok": not violations,
        "summary": summary,
        "max_examples_per_site": bound,
        "cross_checks": checks,
        "gate": {"heads": heads, "rounds": rounds},
        "withheld_dp_heads": sorted(withheld),
        "violations": violations,
    }
