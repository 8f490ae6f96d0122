"""The validation gate's DP rule (issue #25): a head from a DP release ships only when
it beats the uncalibrated model on federated validation; otherwise it is withheld,
``results.json`` says why, the status is ``degraded``, and the audit lists it
without failing integrity.

The gate reads the validation accuracies the federated evaluation recorded; they are
set here directly (the evaluation itself runs in the integration tests), with a real
coordinator ``Store``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spherecal.audit_integrity import check_integrity
from spherecal.coordinator.driver.integrity import integrity_record
from spherecal.coordinator.driver.stages import StageContext
from spherecal.coordinator.driver.validation_gate import dp_source, gate_heads
from spherecal.coordinator.driver.verdict import assess
from spherecal.coordinator.settings import CalibrationSettings, CoordinatorSettings
from tests.unit.coordinator.helpers import stage_context

ROSTER = ("p0", "p1", "p2")
HEAD = np.eye(3, 4)


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[StageContext]:
    settings = CoordinatorSettings(
        participants=ROSTER,
        state_dir=tmp_path,
        calibration=CalibrationSettings(methods=("ffc", "ccvr")),
    )
    with stage_context(settings, tmp_path) as ctx:
        yield ctx


def _validated(
    ctx: StageContext, accuracy: dict[str, float], *, sigma: float, samples: int = 400
) -> None:
    """What the statistics stage and the validation evaluation left behind."""
    ctx.progress.results["statistics"] = {
        kind: {"contributors": list(ROSTER), "noise_sigma": sigma, "missing_classes": []}
        for kind in ("ffc", "ccvr")
    }
    ctx.progress.results["validation_accuracy"] = dict(accuracy)
    ctx.progress.results["validation_evaluation"] = {"samples": samples}


def test_a_dp_head_that_does_not_beat_none_is_withheld(ctx: StageContext) -> None:
    # 0.79 vs 0.80 on 400 samples: within the exact-statistics gate's margin (≈ 0.085)
    _validated(ctx, {"none": 0.80, "ffc": 0.79, "ccvr": 0.86}, sigma=3.0)
    shipped = gate_heads(ctx, np.zeros(1), {"ffc": HEAD, "ccvr": HEAD})
    assert set(shipped) == {"ccvr"}
    release = ctx.progress.results["calibration_release"]
    assert release["ffc"] == {
        "shipped": False,
        "dp": True,
        "validation_accuracy": 0.79,
        "uncalibrated_validation_accuracy": 0.80,
        "samples": 400,
        "reason": release["ffc"]["reason"],
    }
    assert "does not beat the uncalibrated model's 0.8000" in release["ffc"]["reason"]
    assert "the sites keep the uncalibrated head" in release["ffc"]["reason"]
    assert release["ccvr"]["shipped"] is True and release["ccvr"]["dp"] is True
    # not an error (noise explains it) but not what was asked for: degraded, with why
    assert ctx.progress.errors == []
    verdict = assess(ctx.settings, ctx.progress, set(shipped))
    assert verdict.status == "degraded"
    assert verdict.reasons == [f"ffc: {release['ffc']['reason']}"]
    # a tie does not beat it either
    _validated(ctx, {"none": 0.80, "ffc": 0.80}, sigma=3.0)
    assert gate_heads(ctx, np.zeros(1), {"ffc": HEAD}) == {}


def test_mutation_the_same_numbers_from_exact_statistics_ship(ctx: StageContext) -> None:
    """Without DP noise the gate gives a head within its uncertainty the benefit of
    the doubt (issue #22): the DP rule is what withholds it."""
    _validated(ctx, {"none": 0.80, "ffc": 0.79}, sigma=0.0)
    assert dp_source(ctx, "ffc") is None
    shipped = gate_heads(ctx, np.zeros(1), {"ffc": HEAD})
    assert set(shipped) == {"ffc"}
    assert ctx.progress.results["calibration_release"]["ffc"]["dp"] is False


def test_a_dp_head_that_cannot_be_checked_is_withheld(ctx: StageContext) -> None:
    _validated(ctx, {"none": 0.80, "ffc": 0.95}, sigma=3.0, samples=0)
    assert gate_heads(ctx, np.zeros(1), {"ffc": HEAD}) == {}
    reason = ctx.progress.results["calibration_release"]["ffc"]["reason"]
    assert "could not be compared" in reason and "no validation samples" in reason


def test_dp_source_follows_the_statistics_each_head_is_solved_from(ctx: StageContext) -> None:
    ctx.progress.results["statistics"] = {"ccvr": {"noise_sigma": 2.0}}
    assert dp_source(ctx, "ffc") == "ccvr"  # FFC from the CCVR sums
    assert dp_source(ctx, "lda") == "ccvr"
    ctx.progress.results["statistics"] = {"ffc": {"noise_sigma": 0.0}, "ccvr": {"noise_sigma": 2}}
    assert dp_source(ctx, "ffc") is None and dp_source(ctx, "qda") == "ccvr"


def test_the_audit_lists_withheld_dp_heads_without_failing(ctx: StageContext) -> None:
    _validated(ctx, {"none": 0.80, "ffc": 0.50, "ccvr": 0.86}, sigma=3.0)
    gate_heads(ctx, np.zeros(1), {"ffc": HEAD, "ccvr": HEAD})
    record = integrity_record(ctx.progress, ctx.settings)
    ctx.store.set_meta("integrity", json.dumps(record))
    conn = sqlite3.connect(ctx.store.path)
    try:
        report = check_integrity(conn)
        assert report["ok"], report["violations"]
        assert report["withheld_dp_heads"] == ["ffc"]
        assert "1 DP head(s) withheld" in report["summary"]
        # mutation: the same rejection without the DP rule is an integrity failure
        record["gate"]["heads"]["ffc"].pop("rule")
        ctx.store.set_meta("integrity", json.dumps(record))
        assert not check_integrity(conn)["ok"]
    finally:
        conn.close()
