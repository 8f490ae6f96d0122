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
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from spherecal.results_schema import AuditCheck

__all__ = ["check_integrity"]


def check_integrity(conn: sqlite3.Connection) -> AuditCheck:
    row = conn.execute("SELECT value FROM meta WHERE key = 'integrity'").fetchone()
    if row is None:
        return {
            "ok": True,
            "summary": "no integrity record (a run before cross-checks were recorded)",
            "violations": [],
        }
    record: dict[str, Any] = json.loads(row[0])
    checks = list(record.get("checks", []))
    heads: dict[str, Any] = record.get("gate", {}).get("heads", {})
    rounds = list(record.get("gate", {}).get("rounds", []))
    violations: list[dict[str, Any]] = [
        {"cross_check": c["check"], "detail": c["detail"]} for c in checks if not c["passed"]
    ]
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
