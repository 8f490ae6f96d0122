"""``spherecal audit PATH``: the privacy report a privacy officer signs off on.

Reads only what the coordinator persisted — its SQLite database (``state.db``) — plus,
for a ``spherecal simulate`` output directory, each participant's own local ledger
(``state/<id>/privacy.db``) and config. It never needs the coordinator to be running
and never sees plaintext (the coordinator never had any). Checks, each a named entry
in ``audit.json`` with ``ok`` and the evidence:

``payloads``            every payload received: who, job, stage, kind, bytes, SHA-256
``no_plaintext_statistics``
                        no calibration statistic was accepted unmasked (an accepted
                        plaintext upload of a statistics task is a violation)
``masked_uniformity``   a chi-square test on the bytes of each kept masked-upload
                        sample (the coordinator keeps a bounded prefix per sender per
                        job): masked bytes must look uniform
``mask_reuse``          the same test on the ring difference of one sender's samples
                        across jobs: a reused mask cancels and leaves structured bytes
``aggregate_inputs``    every finished job aggregated at least ``max(t, min_participants)``
``share_reveals``       no owner had both its self-mask seed and its mask key revealed
``dp_releases``         every statistics job of a DP federation is a DP release, and
                        each release's recorded plan is re-derived from its public
                        inputs: noise parameter at least the plan's, ε within the
                        target, the contributors' planned shares together meeting the
                        target variance. The noise the sites added is inside the masked
                        sum: a site that adds less than its share passes this check (the
                        plan covers it only as one of its ``[privacy] colluders``)
``budgets``             ε spent per participant (and the federation) against budget
``integrity``           the cross-checks between independent sums, each site's bound and
                        the validation gate's decisions (:mod:`spherecal.audit_integrity`)

``--empirical`` adds a canary audit of the calibration mechanism
(:func:`spherecal.spherefed.privacy.empirical.run_canary_audit`): ``epsilon_claimed``,
``epsilon_empirical_lower`` and ``tightness`` at the top level of ``audit.json`` — on a
DP run only; without DP there is no claim to test and it says so.

``protection`` says in words what protected model updates and calibration statistics
(:mod:`spherecal.audit_report`); ``--html FILE`` renders everything as one
self-contained page for a privacy officer (:mod:`spherecal.audit_html`).

Statistical tests use a family-wise false-alarm rate of ``1e-3`` (Bonferroni over
all tests run), so a correct federation practically never fails them while a
plaintext or reused-mask upload of a few kilobytes fails with p ≈ 0.

Every check of ``audit.json`` is here, so that the person signing off reads the whole
audit in one place; the words are in :mod:`spherecal.audit_report`, the HTML in
:mod:`spherecal.audit_html`.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Unpack, get_args

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.state.read_only import read_only
from spherecal.coordinator.summary_schema import JsonObject
from spherecal.results_schema import (
    AuditCheck,
    AuditChecks,
    AuditDocument,
    AuditEvidence,
    EmpiricalAudit,
    Payloads,
)

__all__ = ["AuditError", "run_audit"]

FAMILY_ALPHA = 1e-3
MIN_SAMPLE_BYTES = 1024
MAX_PAIRS_PER_SENDER = 200


class AuditError(Exception):
    """The path is not something ``spherecal audit`` can read."""


# ----------------------------------------------------------------- inputs
def locate(path: Path) -> tuple[Path, Path | None]:
    """(coordinator database, simulate output directory or None)."""
    if path.is_file():
        return path, None
    if path.is_dir():
        for candidate in (
            path / "coordinator" / "state" / "state.db",
            path / "state" / "state.db",
            path / "state.db",
        ):
            if candidate.is_file():
                return candidate, path if (path / "participants").is_dir() else None
    raise AuditError(
        f"{path}: neither a coordinator database nor a directory holding one "
        "(coordinator/state/state.db of a simulate run, or state.db)"
    )


def default_output(db: Path, sim_dir: Path | None) -> Path:
    """Where ``audit.json`` goes without ``--out``: into a simulate output directory
    (its documented place, beside ``results.json``), else ``audit.json`` in the
    current directory — never into the coordinator's state directory. Auditing a
    deployment's ``state.db`` used to write ``state/audit.json`` there: a read-only
    check writing into the live directory a coordinator resumes from (and that its
    operator backs up and copies whole). Run from that directory, it is refused: an
    :class:`AuditError` saying to give ``--out``."""
    if sim_dir is not None:
        return sim_dir / "audit.json"
    target = Path("audit.json")
    if Path.cwd().resolve() == db.parent.resolve():
        raise AuditError(
            f"the current directory holds the coordinator's database {db}: audit.json is "
            "not written into its state directory; run it from another directory or give "
            "--out FILE"
        )
    return target


def _rows(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    rows = _rows(conn, "SELECT value FROM meta WHERE key=?", (key,))
    return str(rows[0][0]) if rows else None


# ----------------------------------------------------------------- statistics
def byte_chi_square(data: bytes) -> tuple[float, float]:
    """(chi-square statistic, p-value) of the bytes against the uniform distribution
    over the 256 byte values (Pearson's goodness-of-fit test, 255 degrees of freedom;
    the tail is SciPy's exact regularised incomplete gamma, right far into the tail
    where the Bonferroni threshold sits)."""
    from scipy.stats import chisquare

    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    result = chisquare(counts)
    return float(result.statistic), float(result.pvalue)


def ring_difference(a: bytes, b: bytes) -> bytes:
    """``a - b`` entry-wise in ``Z_2^64`` over the common prefix (whole entries)."""
    n = min(len(a), len(b)) // 8 * 8
    x = np.frombuffer(a[:n], dtype="<u8")
    y = np.frombuffer(b[:n], dtype="<u8")
    diff: npt.NDArray[np.uint64] = x - y  # wraps: ring arithmetic
    return diff.astype("<u8").tobytes()


# ----------------------------------------------------------------- checks
def _check(ok: bool, summary: str, **evidence: Unpack[AuditEvidence]) -> AuditCheck:
    return {"ok": ok, "summary": summary, **evidence}


def check_payloads(conn: sqlite3.Connection) -> tuple[Payloads, AuditCheck]:
    rows = _rows(
        conn,
        "SELECT ts, sender, job, stage, kind, bytes, sha256, status, code FROM audit ORDER BY id",
    )
    payloads = [
        {
            "ts": r[0],
            "sender": r[1],
            "job": r[2],
            "stage": r[3],
            "kind": r[4],
            "bytes": r[5],
            "sha256": r[6],
            "status": r[7],
            "code": r[8],
        }
        for r in rows
    ]
    plain = [
        p
        for p in payloads
        if p["status"] == "accepted" and p["stage"] == "statistics" and p["kind"] == "TensorUpload"
    ]
    check = _check(
        not plain,
        "no calibration statistic arrived unmasked"
        if not plain
        else f"{len(plain)} calibration statistic upload(s) arrived UNMASKED",
        violations=[{k: p[k] for k in ("sender", "job", "bytes", "sha256")} for p in plain],
    )
    return {"count": len(payloads), "rows": payloads}, check


def check_uniformity(conn: sqlite3.Connection) -> tuple[AuditCheck, AuditCheck]:
    rows = _rows(conn, "SELECT job, sender, purpose, ts, sample FROM masked_samples ORDER BY ts")
    samples = [(str(r[0]), str(r[1]), r[2], bytes(r[4])) for r in rows]
    usable = [s for s in samples if len(s[3]) >= MIN_SAMPLE_BYTES]
    by_sender: dict[str, list[tuple[str, str | None, bytes]]] = {}
    for job, sender, purpose, data in usable:
        by_sender.setdefault(sender, []).append((job, purpose, data))
    pairs: list[tuple[str, str, str, bytes, bytes]] = []
    for sender, items in sorted(by_sender.items()):
        count = 0
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                if count >= MAX_PAIRS_PER_SENDER:
                    break
                pairs.append((sender, items[i][0], items[j][0], items[i][2], items[j][2]))
                count += 1
    tests = max(1, len(usable) + len(pairs))
    threshold = FAMILY_ALPHA / tests
    single_fail: list[JsonObject] = []
    for job, sender, purpose, data in usable:
        stat, p = byte_chi_square(data)
        if p < threshold:
            single_fail.append(
                {
                    "job": job,
                    "sender": sender,
                    "purpose": purpose,
                    "bytes": len(data),
                    "chi2": stat,
                    "p_value": p,
                }
            )
    reuse_fail: list[JsonObject] = []
    for sender, job_a, job_b, a, b in pairs:
        diff = ring_difference(a, b)
        if len(diff) < MIN_SAMPLE_BYTES:
            continue
        stat, p = byte_chi_square(diff)
        if p < threshold:
            reuse_fail.append(
                {
                    "sender": sender,
                    "jobs": [job_a, job_b],
                    "bytes": len(diff),
                    "chi2": stat,
                    "p_value": p,
                }
            )
    uniform = _check(
        not single_fail,
        f"{len(usable)} masked samples tested, {len(single_fail)} not uniform"
        + ("" if samples else " (no samples kept: audit_sample_bytes = 0 or an older database)"),
        samples=len(usable),
        p_threshold=threshold,
        violations=single_fail,
    )
    reuse = _check(
        not reuse_fail,
        f"{len(pairs)} cross-job differences tested, {len(reuse_fail)} show mask reuse",
        pairs=len(pairs),
        p_threshold=threshold,
        violations=reuse_fail,
    )
    return uniform, reuse


def check_aggregates(conn: sqlite3.Connection) -> AuditCheck:
    floor_meta = _meta(conn, "secagg_min_participants")
    min_participants = int(floor_meta) if floor_meta is not None else 2
    rows = _rows(
        conn,
        "SELECT job_id, purpose, round, status, participants, threshold, contributors "
        "FROM jobs ORDER BY created",
    )
    jobs, bad = [], []
    for job_id, purpose, rnd, status, participants, threshold, contributors in rows:
        ids = json.loads(participants or "[]")
        got = json.loads(contributors or "[]")
        needed = max(int(threshold), min(len(ids), max(2, min_participants)))
        entry = {
            "job": job_id,
            "purpose": purpose,
            "round": rnd,
            "status": status,
            "inputs": len(got),
            "needed": needed,
        }
        jobs.append(entry)
        if status == "done" and len(got) < needed:
            bad.append(entry)
    return _check(
        not bad,
        f"{sum(1 for j in jobs if j['status'] == 'done')} aggregates, "
        f"{len(bad)} below their minimum of inputs",
        min_participants=min_participants,
        jobs=jobs,
        violations=bad,
    )


def check_reveals(conn: sqlite3.Connection) -> AuditCheck:
    rows = _rows(conn, "SELECT job, owner, kind, holder FROM revealed_shares")
    kinds: dict[tuple[str, str], set[str]] = {}
    for job, owner, kind, _holder in rows:
        kinds.setdefault((str(job), str(owner)), set()).add(str(kind))
    both: list[JsonObject] = [
        {"job": job, "owner": owner, "kinds": [*sorted(k)]}
        for (job, owner), k in sorted(kinds.items())
        if {"seed", "mask_key"} <= k
    ]
    return _check(
        not both,
        f"{len(rows)} revealed shares over {len(kinds)} (job, owner) pairs; "
        f"{len(both)} owners with BOTH self-mask and mask-key shares revealed",
        violations=both,
    )


def _recomputed_epsilon(plan_json: dict[str, Any], charge: dict[str, Any]) -> dict[str, Any]:
    """Re-plan a release from its public inputs and re-account the *recorded* noise."""
    from spherecal.crypto.dp import NoisePlan
    from spherecal.spherefed.privacy.plan import plan_calibration_release

    noise = plan_json["noise"]
    plan = plan_calibration_release(
        plan_json["kind"],
        dim=int(plan_json["dim"]),
        num_classes=int(plan_json["num_classes"]),
        participants=int(noise["participants"]),
        min_contributors=int(noise["min_contributors"]),
        epsilon_target=float(plan_json["target_epsilon"]),
        delta=float(plan_json["delta"]),
        max_examples=int(plan_json["sensitivity"]["max_examples"]),
        mechanism=str(plan_json["mechanism"]),
        quant_bits=int(plan_json["quant_bits"]),
        colluders=int(noise["colluders"]),
    )
    recorded = charge.get("noise", {})
    parameter = int(recorded.get("parameter", noise["parameter"]))
    contributors = int(recorded.get("contributors", noise["min_contributors"]))
    as_recorded = replace(plan, noise=replace(plan.noise, parameter=parameter))
    assert isinstance(as_recorded.noise, NoisePlan)
    real = as_recorded.charge(contributors)
    return {
        "required_parameter": plan.noise.parameter,
        "recorded_parameter": parameter,
        "contributors": contributors,
        "epsilon_recomputed": real.epsilon,
        "meets_target": bool(real.noise["meets_target"]),
        "target_epsilon": plan.target_epsilon,
    }


def check_dp(conn: sqlite3.Connection) -> AuditCheck:
    privacy = json.loads(_meta(conn, "privacy") or "{}")
    enabled = bool(privacy.get("enabled"))
    releases = _rows(
        conn, "SELECT job_id, kind, plan_json, contributors, charge_json FROM dp_releases"
    )
    released = {str(r[0]) for r in releases}
    stats_jobs = _rows(
        conn, "SELECT job_id, purpose FROM jobs WHERE purpose IN ('ffc', 'ccvr') AND status='done'"
    )
    violations: list[dict[str, Any]] = []
    if enabled:
        for job_id, purpose in stats_jobs:
            if job_id not in released:
                violations.append(
                    {
                        "job": job_id,
                        "kind": purpose,
                        "problem": "statistics released without DP noise",
                    }
                )
    ledger = {
        str(r[0]): json.loads(r[1])
        for r in _rows(
            conn, "SELECT release_id, charge_json FROM privacy_ledger WHERE subject='federation'"
        )
    }
    checked = []
    for job_id, kind, plan_text, _contributors, _charge_text in releases:
        plan_json = json.loads(plan_text)
        charge = ledger.get(str(job_id), json.loads(_charge_text))
        try:
            r = _recomputed_epsilon(plan_json, charge)
        except (ValueError, KeyError, TypeError) as exc:
            violations.append({"job": job_id, "kind": kind, "problem": f"cannot re-plan: {exc}"})
            continue
        r.update({"job": job_id, "kind": kind, "epsilon_recorded": charge.get("epsilon")})
        checked.append(r)
        problems = []
        if r["recorded_parameter"] < r["required_parameter"]:
            problems.append(
                f"noise parameter {r['recorded_parameter']} below the plan's "
                f"{r['required_parameter']}"
            )
        if r["epsilon_recomputed"] > r["target_epsilon"] * (1 + 1e-6):
            problems.append(
                f"ε = {r['epsilon_recomputed']:.4g} exceeds the target {r['target_epsilon']:g}"
            )
        if not r["meets_target"]:
            problems.append(
                "the contributors' planned noise misses the target variance (too few contributors)"
            )
        recorded = charge.get("epsilon")
        if recorded is not None and float(recorded) < r["epsilon_recomputed"] * (1 - 1e-6):
            problems.append(
                f"the ledger records ε = {float(recorded):.4g}, less than the recomputed "
                f"{r['epsilon_recomputed']:.4g}"
            )
        if problems:
            violations.append({"job": job_id, "kind": kind, "problem": "; ".join(problems)})
    summary = (
        "DP not enabled in this federation"
        if not enabled and not releases
        else f"{len(checked)} DP releases re-derived from public inputs, "
        f"{len(violations)} problem(s)"
    )
    return _check(not violations, summary, enabled=enabled, releases=checked, violations=violations)


def _ledger_totals(conn: sqlite3.Connection, delta: float) -> dict[str, dict[str, Any]]:
    from spherecal.spherefed.privacy.ledger import PrivacyBudget, PrivacyLedger, SqliteLedgerStore

    if not _rows(conn, "SELECT name FROM sqlite_master WHERE name='privacy_ledger'"):
        return {}
    ledger = PrivacyLedger(SqliteLedgerStore(conn), PrivacyBudget(delta=delta))
    out = {}
    for subject in ledger.store.subjects():
        spent = ledger.spent(subject)
        timeline = [
            {"ts": e.created_at, "epsilon_total": e.epsilon_total, "kind": e.charge.kind}
            for e in ledger.store.entries(subject)
        ]
        out[subject] = {"releases": spent.releases, "epsilon": spent.epsilon, "timeline": timeline}
    return out


def check_budgets(conn: sqlite3.Connection, sim_dir: Path | None) -> AuditCheck:
    privacy = json.loads(_meta(conn, "privacy") or "{}")
    delta = float(privacy.get("delta", 1e-5))
    total = privacy.get("total_epsilon")
    per_release = privacy.get("epsilon")
    budget = total if total is not None else None
    subjects: dict[str, dict[str, Any]] = {}
    for subject, spent in _ledger_totals(conn, delta).items():
        subjects[subject] = {
            "coordinator_view_epsilon": spent["epsilon"],
            "releases": spent["releases"],
            "budget_epsilon": budget,
            "timeline": spent["timeline"],
        }
    if sim_dir is not None:
        from spherecal.config import load_participant_config

        for config in sorted((sim_dir / "participants").glob("*.toml")):
            try:
                settings = load_participant_config(config)
            except ValueError:
                continue
            db = settings.state_dir / "privacy.db"
            if not db.is_file():
                continue
            with read_only(db) as pconn:
                spent_local = _ledger_totals(pconn, settings.privacy.delta).get(
                    settings.participant_id
                )
            entry = subjects.setdefault(settings.participant_id, {"budget_epsilon": None})
            if settings.privacy.enabled:
                entry["budget_epsilon"] = settings.privacy.total_epsilon
            if spent_local is not None:
                entry["local_ledger_epsilon"] = spent_local["epsilon"]
                entry["local_releases"] = spent_local["releases"]
                entry["timeline"] = spent_local["timeline"]  # the site's own record wins
    over = []
    for subject, entry in sorted(subjects.items()):
        b = entry.get("budget_epsilon")
        spent_values = [
            v for k, v in entry.items() if k.endswith("_epsilon") and k != "budget_epsilon"
        ]
        worst = max((float(v) for v in spent_values), default=0.0)
        entry["epsilon"] = worst
        entry["within_budget"] = b is None or worst <= float(b) * (1 + 1e-9)
        if not entry["within_budget"]:
            over.append(subject)
    return _check(
        not over,
        f"{len(subjects)} ledger subjects; over budget: {over or 'none'}",
        delta=delta,
        epsilon_per_release=per_release,
        total_epsilon=total,
        subjects=subjects,
        violations=over,
    )


CheckName = Literal[
    "no_plaintext_statistics",
    "masked_uniformity",
    "mask_reuse",
    "aggregate_inputs",
    "share_reveals",
    "dp_releases",
    "budgets",
    "participant_policy",
    "integrity",
]
CHECKS: tuple[CheckName, ...] = get_args(CheckName)
"""The keys of ``audit.json`` ``checks``, in the report's order."""


# ----------------------------------------------------------------- driver
def run_audit(
    path: Path,
    *,
    out: Path | None = None,
    empirical: bool = False,
    trials: int = 2000,
    html: Path | None = None,
) -> AuditDocument:
    """Run every check; write ``audit.json`` (:func:`default_output`, or ``out``) and,
    with ``html``, the one-page report for a privacy officer; return the report."""
    from spherecal.audit_integrity import check_integrity
    from spherecal.audit_policy import check_policy
    from spherecal.audit_report import describe_protection, run_identity

    db, sim_dir = locate(path)
    target = out if out is not None else default_output(db, sim_dir)
    # nothing is created or changed beside the database (its -wal/-shm included)
    with read_only(db) as conn:
        payloads, plaintext = check_payloads(conn)
        uniform, reuse = check_uniformity(conn)
        checks: AuditChecks = {
            "no_plaintext_statistics": plaintext,
            "masked_uniformity": uniform,
            "mask_reuse": reuse,
            "aggregate_inputs": check_aggregates(conn),
            "share_reveals": check_reveals(conn),
            "dp_releases": check_dp(conn),
            "budgets": check_budgets(conn, sim_dir),
            "participant_policy": check_policy(conn),
            "integrity": check_integrity(conn),
        }
        privacy = json.loads(_meta(conn, "privacy") or "{}")
        federation_id = _meta(conn, "federation_id")
        protection = describe_protection(conn, sim_dir, privacy)
        run = run_identity(conn, db, sim_dir)
    report: AuditDocument = {
        "schema": "spherecal.audit/1",
        "database": str(db),
        "federation_id": federation_id,
        "run": run,
        "ok": all(checks[name]["ok"] for name in CHECKS),
        "privacy": privacy,
        "protection": protection,
        "checks": checks,
        "payloads": payloads,
    }
    if empirical:
        report.update(empirical_audit(privacy, trials=trials))
        report["ok"] = report["ok"] and not report["empirical"].get("exceeds_claim", False)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2, default=str) + "\n")
    report["path"] = str(target)
    if html is not None:
        from spherecal.audit_html import render_html

        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(render_html(report), encoding="utf-8")
        report["html"] = str(html)
    return report


def empirical_audit(privacy: JsonObject, *, trials: int) -> EmpiricalAudit:
    """The canary audit on a small setting with this federation's mechanism, δ and
    target ε. A federation without DP made no noisy release, so there is no claim to
    test: say so rather than audit a made-up target."""
    from spherecal.spherefed.privacy.empirical import AuditSettings, run_canary_audit

    epsilon = privacy.get("epsilon") or privacy.get("total_epsilon")
    if not privacy.get("enabled") or epsilon is None:
        return {
            "empirical": {
                "skipped": True,
                "reason": "differential privacy was not enabled in this federation, so no "
                "release claims an ε to test",
            }
        }
    delta = privacy.get("delta", 1e-5)
    if not isinstance(epsilon, int | float) or not isinstance(delta, int | float):
        raise AuditError(f"the run's privacy settings have no numeric ε and δ: {privacy}")
    settings = AuditSettings(
        mechanism=str(privacy.get("mechanism", "skellam")),
        delta=float(delta),
        epsilon=float(epsilon),
        trials=trials,
    )
    result = run_canary_audit(settings)
    return {
        "epsilon_claimed": result.epsilon_claimed,
        "epsilon_empirical_lower": result.epsilon_empirical_lower,
        "tightness": result.tightness,
        "empirical": result.to_json(),
    }
