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

import numpy as np
import numpy.typing as npt
import pytest
import torch

from spherecal.audit import run_audit
from spherecal.audit_report import CHECK_EXPLANATIONS
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
