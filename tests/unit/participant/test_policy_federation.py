"""The participant policy in a whole (in-process) federation: advertise before local
work, evaluation counts through secure aggregation, a weakened policy logged at
WARNING, a refusal recorded typed in the summary and the audit table."""

from __future__ import annotations

import logging
import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from spherecal.inprocess_transport import InProcessFederation
from spherecal.participant.policy import PolicySettings
from tests.evaluation_noise import SDS
from tests.unit.coordinator.helpers import secure_federation

pytestmark = pytest.mark.slow

IDS = ("p0", "p1", "p2", "p3")


def _federation(tmp: Path, *, max_heads_p3: int = 2) -> InProcessFederation:
    torch.set_num_threads(1)
    cs, ps = secure_federation(tmp, IDS)
    # p3 weakens one key (logged) and refuses evaluations with any calibrated head
    ps[3] = replace(ps[3], policy=PolicySettings(min_inputs=2, max_evaluation_heads=max_heads_p3))
    return InProcessFederation(cs, ps)


def _order(messages: list[str], pid: str) -> list[str]:
    return [m for m in messages if m.startswith(f"[{pid}]")]


def test_secure_federation_under_the_participant_policy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="spherecal.participant")
    fed = _federation(tmp_path, max_heads_p3=0).start()
    summary = fed.join(timeout=240)
    assert summary["status"] == "completed", summary.get("errors")
    # the weakened key is logged at WARNING, once, by p3 only
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["policy weakened: min_inputs = 2 (default 3)"]

    # advertise before local work: in each participant's own log the advertisement of
    # a job precedes the training / statistics it feeds
    for pid in IDS:
        lines = _order(fed.messages, pid)
        first = {
            what: next(i for i, m in enumerate(lines) if re.search(pattern, m))
            for what, pattern in {
                "advertise-update": r"advertised keys \(update\)",
                "trained": r"trained \d+ steps",
                "advertise-ffc": r"advertised keys \(ffc\)",
                "ffc": r"ffc statistics:",
            }.items()
        }
        assert first["advertise-update"] < first["trained"], pid
        assert first["advertise-ffc"] < first["ffc"], pid

    # evaluation through secure aggregation: federation totals only, no plaintext report
    fed_eval = summary["federated_evaluation"]
    assert isinstance(fed_eval, dict) and fed_eval["secure"] is True
    honest = [p for p in IDS if p != "p3"]  # p3 refused the head "ffc"
    assert fed_eval["participants"] == honest
    exact = sum(fed.runners[p].data.test_size for p in honest)
    noise = fed_eval["noise"]
    assert noise is not None
    assert abs(fed_eval["samples"] - exact) <= SDS * noise["sum_sd"] + 0.5
    accuracy = summary["accuracy"]
    none, ffc = accuracy["none"], accuracy["ffc"]
    assert none is not None and ffc is not None
    assert 0.0 <= none <= 1.0 and 0.0 <= ffc <= 1.0

    # p3's refusal is typed in the summary and in the audit table
    refusals = summary["refusals"]
    assert isinstance(refusals, list)
    (refusal,) = refusals
    assert refusal["participant"] == "p3" and refusal["purpose"] == "evaluate"
    assert (refusal["kind"], refusal["rule"]) == ("POLICY_REFUSAL", "RULE_EVALUATION_HEADS")
    conn = sqlite3.connect(tmp_path / "state" / "state.db")
    try:
        reports = conn.execute("SELECT count(*) FROM audit WHERE kind='EvaluationReport'")
        assert reports.fetchone() == (0,)
        rows = conn.execute("SELECT type, participant, rule FROM policy_events").fetchall()
        assert rows == [("refusal", "p3", "RULE_EVALUATION_HEADS")]
    finally:
        conn.close()
