"""What the coordinator's audit (``spherecal audit``) can see of a dishonest site, and
that its words claim no more.

Each test runs a real in-process federation (coordinator driver and service, three
participant runners, secure aggregation, SQLite) with one site that does what an
honest one would not, then audits the coordinator's database as a privacy officer
would. The audit is evidence the coordinator holds, so this is about an *honest*
coordinator's database: what the check reports must be what it checked.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from spherecal.audit import run_audit
from spherecal.audit_report import CHECK_EXPLANATIONS, verdict_label
from spherecal.coordinator.driver import integrity
from spherecal.coordinator.settings import CalibrationSettings
from spherecal.crypto.dp import NoisePlan
from spherecal.inprocess_transport import InProcessFederation
from spherecal.participant import statistics_task
from spherecal.spherefed.privacy.settings import PrivacySettings
from tests.unit.coordinator.helpers import secure_federation

pytestmark = pytest.mark.slow

SITES = ("p0", "p1", "p2")


def test_a_site_that_adds_no_dp_noise_passes_the_dp_check_which_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """p0 drops its share of the DP noise from its FFC statistics. Nothing in the
    coordinator's database can show it — the noise is masked with the input — so the
    ``dp_releases`` check passes: it re-derives the recorded *plan*. Its explanation
    said each release "carried at least the noise its plan required"; it now says
    what it checked, and that a site's own noise is not visible."""
    torch.set_num_threads(1)
    honest = statistics_task.sample_noise
    dropped: list[int] = []

    def p0_adds_none(plan: NoisePlan) -> npt.NDArray[np.int64]:
        noise = honest(plan)
        if threading.current_thread().name == "p0":
            dropped.append(int(np.count_nonzero(noise)))
            return np.zeros_like(noise)
        return noise

    monkeypatch.setattr(statistics_task, "sample_noise", p0_adds_none)
    privacy = PrivacySettings(enabled=True, epsilon=5.0)
    cs, ps = secure_federation(tmp_path, SITES, privacy=privacy)
    fed = InProcessFederation(dataclasses.replace(cs, privacy=privacy), ps).start()
    summary = fed.join(timeout=300)
    assert summary["status"] == "completed", summary.get("status_reasons")
    assert dropped and dropped[0] > 0  # p0 had noise to add, and sent none of it
    report = run_audit(tmp_path / "state" / "state.db", out=tmp_path / "audit.json")
    check = report["checks"]["dp_releases"]
    assert check["ok"] and len(check["releases"]) == 1  # the plan is all it can see
    title, words = CHECK_EXPLANATIONS["dp_releases"]
    assert "carried" not in words and "planned" in title.lower()
    assert "cannot be seen" in words and "colluders" in words


def test_a_failed_cross_check_fails_the_audit_before_the_run_records_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """p2 adds 30 fake examples per class to its statistics (every entry inside the
    job's bound); the coordinator refuses the CCVR sum by the cross-check with the
    rounds' weights and logs the failure as an error event. The integrity record is
    written when the run ends, so a privacy officer auditing the database in between
    — beside the running coordinator, or after it was killed — found none, read "a run
    before cross-checks were recorded", and the verdict PASS as configured. The check
    now counts the failed-check events the record does not hold."""
    torch.set_num_threads(1)
    monkeypatch.setenv("SPHERECAL_TEST_FAULTS", "1")
    cs, ps = secure_federation(tmp_path, SITES)
    cs = dataclasses.replace(cs, calibration=CalibrationSettings(methods=("ffc", "ccvr")))
    ps[2] = dataclasses.replace(ps[2], adversary="directions:30")
    database = tmp_path / "state" / "state.db"
    during: dict[str, Any] = {}
    noted = integrity.note

    def audited_at_the_failure(ctx: Any, check: str, passed: bool, *rest: Any) -> None:
        noted(ctx, check, passed, *rest)
        if not passed and not during:
            ctx.store.call(lambda _conn: None)  # the event posted before is written
            during["check"] = check
            during["report"] = run_audit(database, out=tmp_path / "during.json")

    monkeypatch.setattr(integrity, "note", audited_at_the_failure)
    summary = InProcessFederation(cs, ps).start().join(timeout=300)
    assert summary["status"] == "degraded"
    assert during["check"] == "training weights vs ccvr count"
    report = during["report"]
    check = report["checks"]["integrity"]
    assert not check["ok"] and verdict_label(report) == "FAIL"
    (violation,) = check["violations"]
    assert violation["cross_check"] == "training weights vs ccvr count"
    assert violation["source"] == "events"
    assert "has not ended" in check["summary"]
    # at the end the record holds it, counted once
    after = run_audit(database, out=tmp_path / "after.json")["checks"]["integrity"]
    assert after["violations"] == [
        {"cross_check": "training weights vs ccvr count", "detail": violation["detail"]}
    ]
