"""Participants SIGKILLed at every stage of secure aggregation — real processes.

One run of 8 participants (default majority threshold, consistency round on — what
participants' default policy demands) loses a participant at each stage:
``train`` (round 1), ``advertise`` (round 2), ``share`` and ``masked`` (mid-stream:
the FFC job's upload is cut after its first chunk) and ``unmask`` (CCVR). Every
aggregate must still be exact over its survivors. A second, 3-participant run with
threshold 3 loses one participant at ``masked``: the job must end with a clear
too-few-survivors error while the coordinator carries on serving the others.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np
import pytest
import torch

from spherecal.coordinator.driver.ffc_ccvr_heads import ffc_classifier
from spherecal.participant.faults import HaltPoint
from spherecal.simulate import Drop, SimulationSettings, clear_statistics, run_simulation
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

DROPS = (
    Drop("p7", HaltPoint("train", "r1")),
    Drop("p6", HaltPoint("advertise", "r2")),
    Drop("p5", HaltPoint("share", "ffc")),
    Drop("p4", HaltPoint("masked", "ffc")),
    Drop("p3", HaltPoint("unmask", "ccvr")),
)


@pytest.fixture(scope="module")
def dropout_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], SimulationSettings]:
    from spherecal.spherefed.reference import ReferenceConfig

    settings = SimulationSettings(
        reference=ReferenceConfig(participants=8, model="mlp", rounds=2, alpha=0.5),
        out=tmp_path_factory.mktemp("drops"),
        calibration=("ffc", "ccvr"),
        ffc_from_ccvr=False,
        drops=DROPS,
        chunk_entries=1024,  # FFC: 10 chunks, so the masked kill lands mid-stream
        save_statistics=True,
        timeout_s=300,
        # p3 (killed at unmask) never comes back: do not wait the default minute for it
        rejoin_grace_s=2.0,
    )
    return dict[str, Any](run_simulation(settings)), settings


def _job(results: dict[str, Any], purpose: str, round_: int | None = None) -> dict[str, Any]:
    for job in results["jobs"]:
        if job["purpose"] == purpose and job["round"] == round_:
            return job
    raise AssertionError(f"no {purpose} job for round {round_}")


def test_every_kill_landed_where_asked(
    dropout_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, _ = dropout_run
    # Every aggregate is exact, but the calibration lacks three sites that trained
    # (p6 died in round 2, p5 and p4 in the FFC job, p3 counted): honest coverage
    # (issue #20) says so.
    assert results["status"] == "degraded", results["errors"]
    assert results["status_reasons"] == [
        "ffc statistics lack 3 of the federation's 7 participants: ['p4', 'p5', 'p6']",
        "ccvr statistics lack 3 of the federation's 7 participants: ['p4', 'p5', 'p6']",
    ]
    assert results["drops_not_triggered"] == []
    landed = {(d["participant"], d["stage"], d["job"]) for d in results["dropped"]}
    assert landed == {
        ("p7", "train", "update"),
        ("p6", "advertise", "update"),
        ("p5", "share", "ffc"),
        ("p4", "masked", "ffc"),
        ("p3", "unmask", "ccvr"),
    }
    assert {p: results["exit_codes"][p] for p in ("p0", "p1", "p2")} == {"p0": 0, "p1": 0, "p2": 0}
    assert all(results["exit_codes"][p] == -9 for p in ("p3", "p4", "p5", "p6", "p7"))


def test_each_job_is_exact_over_its_survivors(
    dropout_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, settings = dropout_run
    r1, r2 = _job(results, "update", 1), _job(results, "update", 2)
    assert r1["excluded"] == ["p7"] and len(r1["contributors"]) == 7
    assert r2["excluded"] == ["p6"] and "p7" not in r2["participants"]
    ffc = _job(results, "ffc")
    assert ffc["excluded"] == ["p5"]  # never shared: left out before masking
    assert ffc["dropouts"] == ["p4"]  # shared, then died mid-upload: masks recovered
    assert ffc["contributors"] == ["p0", "p1", "p2", "p3"]
    ccvr = _job(results, "ccvr")
    assert ccvr["contributors"] == ["p0", "p1", "p2", "p3"]  # p3's masked input counts
    assert "p3" in ccvr["dropped"] and ccvr["dropped"]["p3"].startswith("unmask")
    assert results["per_round"][0]["contributors"] == r1["contributors"]

    heads = torch.load(results["models"]["classifiers"]["path"], weights_only=True)
    clear_ffc = clear_statistics(settings, ffc["contributors"], "ffc")
    assert isinstance(clear_ffc, FFCStatistics)
    plain, _ = ffc_classifier(clear_ffc, 0.0)
    rel = np.linalg.norm(heads["ffc"].numpy() - plain) / np.linalg.norm(plain)
    assert rel < 1e-6, rel
    assert results["statistics"]["ffc"]["samples"] == clear_ffc.count

    # CCVR: the aggregated sums are exact up to the job's fixed-point scale. (Its
    # classifier is not compared: the virtual features are drawn through the
    # covariances' eigenvectors, which rounding in the last bits may rotate within
    # near-degenerate eigenspaces — same distribution, different draws.)
    clear_ccvr = clear_statistics(settings, ccvr["contributors"], "ccvr")
    assert isinstance(clear_ccvr, CCVRStatistics)
    with np.load(results["saved_statistics"]["ccvr"], allow_pickle=False) as saved:
        aggregate = saved["vector"]
    scale = 2.0 ** -next(j["scale_bits"] for j in results["jobs"] if j["purpose"] == "ccvr")
    np.testing.assert_allclose(aggregate, clear_ccvr.pack(), rtol=0, atol=4 * scale + 1e-12)
    assert results["statistics"]["ccvr"]["samples"] == float(clear_ccvr.counts.sum())


def test_broken_masked_upload_left_only_audit_rows(
    dropout_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, _ = dropout_run
    ffc = _job(results, "ffc")
    db = sqlite3.connect(results["audit_log"])
    chunks = db.execute(
        "SELECT count(*) FROM audit WHERE sender='p4' AND job=? AND stage='masked'",
        (ffc["job_id"],),
    ).fetchone()[0]
    # Usually 1 (the stream is cut after its first chunk); never the whole input.
    assert chunks < 10


@pytest.fixture(scope="module")
def too_few_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], SimulationSettings]:
    from spherecal.spherefed.reference import ReferenceConfig

    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=1),
        out=tmp_path_factory.mktemp("too-few"),
        calibration=("ffc",),
        threshold=3,
        drops=(Drop("p2", HaltPoint("masked", "ffc")),),
        timeout_s=240,
        rejoin_grace_s=1.0,  # p2 never comes back: do not wait the default minute
    )
    return dict[str, Any](run_simulation(settings)), settings


def test_too_few_survivors_fail_the_job_and_the_coordinator_carries_on(
    too_few_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, _ = too_few_run
    ffc = _job(results, "ffc")
    assert ffc["status"] == "failed"
    assert "TooFewSurvivors" in ffc["error"] and "needed at least 3" in ffc["error"]
    assert any("too few" in e for e in results["errors"])
    # Still serving: the federation saved the model and told the survivors — and says
    # honestly that FFC is missing, after retrying the job. Evaluation counts are
    # securely aggregated too, and two survivors are below the policy's minimum of
    # three inputs, so the federation reports no accuracy rather than a two-party sum.
    assert results["status"] == "degraded"
    assert any(r.startswith("ffc: no calibrated classifier") for r in results["status_reasons"])
    stages = [r["stage"] for r in results["retries"]["log"]]
    assert stages.count("statistics ffc") == 2  # three attempts at the FFC job
    assert results["accuracy"] == {"none": None, "ffc": None, "ccvr": None}
    evaluation = results["federated_evaluation"]
    assert evaluation["secure"] is True and evaluation["participants"] == []
    assert results["exit_codes"]["p0"] == 0 and results["exit_codes"]["p1"] == 0
