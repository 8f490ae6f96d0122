"""The audit in plain words: what a run protected, what each ε means, what each check
verified — shared by the text report (``spherecal audit``) and the HTML report
(``--html``, :mod:`spherecal.audit_html`).

Why a separate module: the checks (:mod:`spherecal.audit`) produce evidence for a
specialist; a privacy officer signing off on a run needs the same facts as
sentences, without χ² statistics or share kinds, and needs to be told plainly what
was *not* protected (model updates without DP noise, say) rather than infer it from
an absent row. Every sentence here is derived from the report dictionary, so the
text and the HTML can never disagree.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

__all__ = [
    "CHECK_EXPLANATIONS",
    "describe_protection",
    "epsilon_meanings",
    "format_report",
    "human_bytes",
    "verdict_sentence",
]

#: One sentence per check: what it verified, in words a non-specialist can sign.
CHECK_EXPLANATIONS: dict[str, tuple[str, str]] = {
    "no_plaintext_statistics": (
        "Statistics never sent in the clear",
        "No site's calibration statistics reached the coordinator as readable numbers; "
        "they arrived only masked, so only their sum over sites could be recovered.",
    ),
    "masked_uniformity": (
        "Masked uploads look like random noise",
        "A statistical test (chi-square) on samples of each masked upload found them "
        "indistinguishable from random bytes, as they must be if masking works.",
    ),
    "mask_reuse": (
        "No mask used twice",
        "No site reused a mask in two jobs; a reused mask would cancel when the "
        "coordinator subtracts two uploads and expose the difference of the data.",
    ),
    "aggregate_inputs": (
        "Every sum combines enough sites",
        "Every sum the coordinator unmasked combined at least the configured minimum "
        "number of sites, so no result is one site's data alone.",
    ),
    "share_reveals": (
        "No site could be unmasked on its own",
        "For no site did the coordinator collect both secret keys that together "
        "would remove that site's mask (the protocol reveals at most one of the two).",
    ),
    "dp_releases": (
        "Noise as planned in every private release",
        "Each differentially private release carried at least the noise its plan "
        "required, recomputed here from public inputs only.",
    ),
    "budgets": (
        "Privacy budgets respected",
        "Neither the federation nor any site spent more privacy budget (ε) than it allowed.",
    ),
    "participant_policy": (
        "Refusals and exclusions",
        "What sites refused under their own privacy policy, which participants were excluded "
        "for dealing shares that failed authentication, and that no excluded participant "
        "took part in a later job.",
    ),
    "integrity": (
        "Integrity of the result",
        "The sums the coordinator holds agreed with each other (example counts in the "
        "training weights, the statistics and the evaluations), stayed within what each "
        "site's declared data could give, and no calibrated head that scored worse than "
        "the uncalibrated model on the sites' validation data was shipped. A failure "
        "means one site may have sent data that is not what its data gives.",
    ),
}


def human_bytes(n: float) -> str:
    """``1536 -> "1.5 KB"`` (powers of 1000, as a privacy officer reads a file size)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"  # pragma: no cover - the loop always returns


# ----------------------------------------------------------------- facts
def describe_protection(
    conn: sqlite3.Connection, sim_dir: Path | None, privacy: dict[str, Any]
) -> dict[str, Any]:
    """What protected model updates and calibration statistics in this run, read from
    the database (jobs and accepted payloads) and, for a simulate directory, each
    site's local ledger (DP-SGD shows there as ``mechanism = 'dpsgd'`` entries)."""

    def count(sql: str) -> int:
        try:
            return int(conn.execute(sql).fetchone()[0])
        except sqlite3.OperationalError:
            return 0

    secure_updates = count("SELECT COUNT(*) FROM jobs WHERE purpose = 'update'")
    plain_updates = count(
        "SELECT COUNT(*) FROM audit WHERE stage = 'update' AND kind = 'TensorUpload' "
        "AND status = 'accepted'"
    )
    secure_stats = count("SELECT COUNT(*) FROM jobs WHERE purpose IN ('ffc', 'ccvr')")
    plain_stats = count(
        "SELECT COUNT(*) FROM audit WHERE stage = 'statistics' AND kind = 'TensorUpload' "
        "AND status = 'accepted'"
    )
    dp_releases = count("SELECT COUNT(*) FROM dp_releases")
    dpsgd_sites = sorted(_dpsgd_sites(conn, sim_dir))
    dp_on = bool(privacy.get("enabled"))

    def transport(secure: int, plain: int) -> str:
        if plain:
            return "sent in the clear to the coordinator (secure aggregation off)"
        if secure:
            return "secure aggregation (the coordinator saw only the sum over sites)"
        return "none sent in this run"

    if plain_updates == 0 and secure_updates == 0:
        updates_dp = "no model updates were sent"
    elif dpsgd_sites:
        updates_dp = f"DP-SGD at {', '.join(dpsgd_sites)} (the other sites: no DP)"
    else:
        updates_dp = "no DP"
    if dp_on and dp_releases:
        stats_dp = f"DP noise in {dp_releases} release(s) ({privacy.get('mechanism')})"
    elif dp_on:
        stats_dp = "DP requested, but no release recorded"
    else:
        stats_dp = "no DP"
    return {
        "model_updates": {
            "transport": transport(secure_updates, plain_updates),
            "dp": updates_dp,
            "secure_jobs": secure_updates,
            "plaintext_uploads": plain_updates,
            "dpsgd_sites": dpsgd_sites,
        },
        "calibration_statistics": {
            "transport": transport(secure_stats, plain_stats),
            "dp": stats_dp,
            "secure_jobs": secure_stats,
            "plaintext_uploads": plain_stats,
            "dp_releases": dp_releases,
        },
        "updates_without_dp": (secure_updates + plain_updates) > 0 and not dpsgd_sites,
    }


def _dpsgd_sites(conn: sqlite3.Connection, sim_dir: Path | None) -> set[str]:
    sites: set[str] = set()
    queries = [(conn, "SELECT DISTINCT subject FROM privacy_ledger WHERE mechanism = 'dpsgd'")]
    local: list[sqlite3.Connection] = []
    if sim_dir is not None:
        for db in sorted((sim_dir / "state").glob("*/privacy.db")):
            c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            local.append(c)
            queries.append(
                (c, "SELECT DISTINCT subject FROM privacy_ledger WHERE mechanism = 'dpsgd'")
            )
    try:
        for c, sql in queries:
            try:
                sites.update(str(r[0]) for r in c.execute(sql).fetchall())
            except sqlite3.OperationalError:
                continue
    finally:
        for c in local:
            c.close()
    sites.discard("federation")
    return sites


# ----------------------------------------------------------------- sentences
def verdict_sentence(report: dict[str, Any]) -> str:
    """The first thing a reader sees: did the run keep its promises, in one breath."""
    checks = report["checks"]
    failed = [CHECK_EXPLANATIONS.get(n, (n, ""))[0] for n, c in checks.items() if not c["ok"]]
    empirical = report.get("empirical") or {}
    if empirical.get("exceeds_claim"):
        failed.append("Empirical test of the noise")
    if failed:
        integrity_only = [n for n, c in checks.items() if not c["ok"]] == ["integrity"]
        return f"{len(failed)} of the checks below failed ({'; '.join(failed)}). " + (
            "The privacy checks passed, but do not rely on this run's model until the "
            "integrity failure is explained."
            if integrity_only and not empirical.get("exceeds_claim")
            else "Do not rely on this run's privacy until each failure is explained."
        )
    protection = report.get("protection", {})
    stats = protection.get("calibration_statistics", {})
    updates = protection.get("model_updates", {})
    said = f"All {len(checks)} checks passed: the run kept the protections it was configured with."
    if stats:
        said += f" Calibration statistics: {stats['transport']}, {stats['dp']}."
    if updates:
        said += f" Model updates: {updates['transport']}, {updates['dp']}."
    return said


def epsilon_meanings(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One ε per subject (the federation, then each site), with what it means."""
    budgets = report["checks"]["budgets"]
    delta = float(budgets.get("delta", 1e-5))
    out = []
    for subject, entry in sorted(
        budgets.get("subjects", {}).items(), key=lambda kv: (kv[0] != "federation", kv[0])
    ):
        eps = float(entry.get("epsilon", 0.0))
        budget = entry.get("budget_epsilon")
        factor = math.exp(eps) if eps < 50 else math.inf
        if subject == "federation":
            meaning = (
                f"All releases together: whether any one record at any site was used "
                f"changes the chance of any result by at most a factor e^ε ≈ {factor:.3g} "
                f"(except with probability δ = {delta:g}); counted with the sites that "
                "actually added noise."
            )
        elif eps == 0.0:
            meaning = (
                f"Nothing charged: {subject} took part in no private release (a site "
                "refuses a release that would exceed its budget)."
            )
        else:
            meaning = (
                f"Charged by {subject} to its own budget for its records (factor "
                f"≈ {factor:.3g}); cautious: it assumes only the minimum number of sites "
                "added noise, so it is at least the federation's figure."
            )
        out.append(
            {
                "subject": subject,
                "epsilon": eps,
                "budget": budget,
                "within_budget": bool(entry.get("within_budget", True)),
                "releases": entry.get("releases", entry.get("local_releases", 0)),
                "meaning": meaning,
            }
        )
    return out


# ----------------------------------------------------------------- text report
def format_report(report: dict[str, Any]) -> str:
    """The terminal report: protection first, then payloads, checks and ε."""
    lines = [f"spherecal audit of {report['database']}"]
    lines.append(f"{'PASS' if report['ok'] else 'FAIL'}: {verdict_sentence(report)}")
    protection = report.get("protection")
    if protection:
        lines.append("\nwhat was protected in this run:")
        for label, key in (
            ("model updates", "model_updates"),
            ("calibration statistics", "calibration_statistics"),
        ):
            item = protection[key]
            lines.append(f"  {label + ':':<24}{item['transport']}; {item['dp']}")
        if protection.get("updates_without_dp"):
            lines.append(
                "  NOTE: model updates carry NO differential privacy; any DP guarantee "
                "below covers the calibration statistics only."
            )
    payloads = report["payloads"]["rows"]
    by: dict[tuple[str, str], list[int]] = {}
    for p in payloads:
        if p["status"] == "accepted":
            by.setdefault((p["sender"], p["stage"]), []).append(int(p["bytes"]))
    lines.append(f"\npayloads received: {report['payloads']['count']} (sender, stage: n, bytes)")
    for (sender, stage), sizes in sorted(by.items()):
        lines.append(f"  {sender:<12} {stage:<12} {len(sizes):>5}  {sum(sizes):>12}")
    lines.append("\nchecks:")
    for name, check in report["checks"].items():
        lines.append(f"  [{'PASS' if check['ok'] else 'FAIL'}] {name}: {check['summary']}")
        for v in check.get("violations", [])[:10]:
            lines.append(f"         - {json.dumps(v, default=str)}")
    budgets = report["checks"]["budgets"]["subjects"]
    if budgets:
        delta = report["checks"]["budgets"]["delta"]
        lines.append(f"\nε spent (δ = {delta:g}) vs budget:")
        for subject, e in sorted(budgets.items()):
            b = e.get("budget_epsilon")
            lines.append(
                f"  {subject:<12} ε = {e['epsilon']:.4g}  budget "
                + ("none" if b is None else f"{float(b):g}")
            )
    empirical = report.get("empirical")
    if empirical is not None and empirical.get("skipped"):
        lines.append(f"\nempirical canary audit: nothing to audit — {empirical['reason']}")
    elif "epsilon_claimed" in report:
        lines.append(
            f"\nempirical canary audit: claimed ε = {report['epsilon_claimed']:.4g}, "
            f"empirical lower bound = {report['epsilon_empirical_lower']:.4g}, "
            f"tightness = {report['tightness']:.3f}"
        )
    lines.append(f"\nverdict: {'PASS' if report['ok'] else 'FAIL'}  (written {report['path']})")
    if report.get("html"):
        lines.append(f"readable report: {report['html']}")
    return "\n".join(lines)
