"""A full federation as real processes over real gRPC with mutual TLS: 5 participants,
secure aggregation of updates and of FFC + CCVR statistics.

Checks the securely aggregated FFC classifier against plaintext FFC recomputed on the
same features (within 1e-6 relative), the federation against the in-process reference
runner (within fixed-point rounding), results.json's schema and the audit log.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from spherecal.coordinator.driver.ffc_ccvr_heads import ffc_classifier
from spherecal.coordinator.summary_schema import CoordinatorSummary
from spherecal.crypto import native
from spherecal.results_schema import SimulationResults
from spherecal.simulate import SimulationSettings, clear_statistics, run_simulation
from spherecal.spherefed.reference import ReferenceConfig, run_reference
from spherecal.spherefed.stats import CCVRStatistics
from tests.evaluation_noise import within_noise
from tests.json_shape import shape_errors

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REFERENCE = ReferenceConfig(participants=5, model="mlp", rounds=2)


@pytest.fixture(scope="module")
def secure_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[SimulationResults, SimulationSettings]:
    settings = SimulationSettings(
        reference=REFERENCE,
        out=tmp_path_factory.mktemp("secure-tls"),
        calibration=("ffc", "ccvr"),
        tls=True,
        chunk_entries=8192,
        timeout_s=240,
        # exact counts: two federations (or the reference) weight alike only without the
        # sites' once-per-federation noise on their training weights
        example_count_noise_sd=0,
    )
    return run_simulation(settings), settings


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    torch.set_num_threads(1)
    return run_reference(REFERENCE)


def test_full_secure_run_completes_with_every_participant(
    secure_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, settings = secure_run
    assert results["status"] == "completed", results["errors"]
    assert results["errors"] == []
    assert results["exit_codes"] == {f"p{k}": 0 for k in range(5)}
    # the validation gate's evaluation of FFC and CCVR, then the final one on test
    assert [j["purpose"] for j in results["jobs"]] == [
        "update",
        "update",
        "ccvr",
        "evaluate",
        "evaluate",
    ]
    for job in results["jobs"]:
        assert job["status"] == "done"
        assert job["contributors"] == [f"p{k}" for k in range(5)]
    on_disk = json.loads((settings.out / "results.json").read_text())
    assert on_disk["accuracy"] == results["accuracy"]


def test_a_healthy_install_logs_no_native_code_warning(
    secure_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    """Where both native extensions are built (this installation), no process warns
    about a slow path, nor says anything at INFO about native code: the start-up line is
    at DEBUG (``native.startup_message``)."""
    _, settings = secure_run
    if native.KERNEL is None or native.CODEC is None:
        pytest.skip("the native extensions are not built here")
    for name in ["coordinator", *(f"p{k}" for k in range(5))]:
        text = (settings.out / "logs" / f"{name}.log").read_text(errors="replace")
        assert "native code:" not in text, name
        assert "DEBUG: " not in text, name  # the mark never reaches the log as text


def test_results_json_schema(secure_run: tuple[dict[str, Any], SimulationSettings]) -> None:
    results, _ = secure_run
    assert set(results["accuracy"]) == {"none", "ffc", "ccvr"}
    assert all(0.0 <= v <= 1.0 for v in results["accuracy"].values())
    assert [r["round"] for r in results["per_round"]] == [1, 2]
    for key in ("train_loss", "test_accuracy", "contributors", "dropped", "seconds"):
        assert key in results["per_round"][0]
    stages = results["timings"]["secagg_stages_s"]
    # The signed survivor-set round is on by default (participants' policy requires it).
    assert set(stages) == {"advertise", "share", "masked", "consistency", "unmask"}
    for key in ("train_s", "statistics_ccvr_s", "ffc_s", "ccvr_s", "evaluate_s", "wall_s"):
        assert key in results["timings"]
    p0 = results["bytes"]["p0"]
    for stage in ("join", "download", "advertise", "share", "masked", "unmask", "evaluate"):
        assert stage in p0
    assert p0["masked"]["received"] > 8 * 49_536  # at least the two masked model updates
    assert results["dropped"] == [] and results["drops_not_triggered"] == []
    assert Path(results["audit_log"]).exists()


def test_matches_the_reference_runner_within_fixed_point_rounding(
    secure_run: tuple[dict[str, Any], SimulationSettings], reference: dict[str, Any]
) -> None:
    results, _ = secure_run
    for name in ("none", "ffc", "ccvr"):
        # Federated evaluation covers the whole test split, so it equals central
        # evaluation; fixed-point rounding of the secure sums may move a prediction.
        # (with the sites' DP noise on the counts: equal within it, issue #19)
        sd = results["federated_evaluation"]["accuracy_sd"][name]
        assert within_noise(results["accuracy"][name], results["central_accuracy"][name], sd)
        assert abs(results["central_accuracy"][name] - reference["accuracy"][name]) <= 0.01
    # The default step (2^-16, [secure_aggregation] update_resolution) puts these
    # updates on the 32-bit ring: round 1's mean loss is the mean of the sites' losses,
    # each rounded to the ring's step, so within half a step of the reference's; from
    # round 2 the model itself differs by that rounding (a relative 1e-4 is ~25x what
    # it moved the loss here, 4.1e-6 on 2026-11-26, and far below what a wrong sum
    # would).
    updates = [j for j in results["jobs"] if j["purpose"] == "update"]
    ((ring_bits, scale_bits),) = {(j["ring_bits"], j["scale_bits"]) for j in updates}
    assert ring_bits == 32 and scale_bits >= 17  # 5 sites: 2^-18
    first, second = zip(results["per_round"], reference["per_round"], strict=True)
    half_step = 2.0 ** -(scale_bits + 1)
    assert abs(first[0]["train_loss"] - first[1]["train_loss"]) <= half_step + 1e-12
    assert second[0]["train_loss"] == pytest.approx(second[1]["train_loss"], rel=1e-4)


def test_the_64_bit_update_ring_matches_the_reference_runner_to_1e_9(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """``update_resolution = 0``: every update job on the 64-bit ring at its finest
    scale, and the service's training equals the in-process reference's to 1e-9 in
    every round (the 32-bit default above only to its step)."""
    settings = SimulationSettings(
        reference=REFERENCE,
        out=tmp_path / "run",
        calibration=("ffc",),
        update_resolution=0.0,
        timeout_s=240,
        example_count_noise_sd=0,  # the reference's weights: its exact counts
    )
    results = run_simulation(settings)
    assert results["status"] == "completed"
    updates = [j for j in results["jobs"] if j["purpose"] == "update"]
    assert len(updates) == 2 and {j["ring_bits"] for j in updates} == {64}
    for ours, theirs in zip(results["per_round"], reference["per_round"], strict=True):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-9)


def test_secure_ffc_equals_plaintext_ffc_on_the_same_features(
    secure_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, settings = secure_run
    heads = torch.load(results["models"]["classifiers"]["path"], weights_only=True)
    clear = clear_statistics(settings, [f"p{k}" for k in range(5)], "ccvr")
    assert isinstance(clear, CCVRStatistics)
    plain, _ = ffc_classifier(clear.to_ffc(), 0.0)
    secure = heads["ffc"].numpy()
    relative = np.linalg.norm(secure - plain) / np.linalg.norm(plain)
    assert relative < 1e-6, relative


def test_audit_log_has_a_hash_for_every_payload_and_no_payloads(
    secure_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    results, _ = secure_run
    db = sqlite3.connect(results["audit_log"])
    columns = {row[1] for row in db.execute("PRAGMA table_info(audit)")}
    assert columns == {
        "id",
        "ts",
        "sender",
        "job",
        "stage",
        "kind",
        "bytes",
        "sha256",
        "status",
        "code",
        "detail",
    }
    rows = db.execute(
        "SELECT stage, count(*), min(length(sha256)) FROM audit WHERE status='accepted' "
        "GROUP BY stage"
    ).fetchall()
    by_stage = {stage: (count, hash_len) for stage, count, hash_len in rows}
    # evaluation counts travel through secure aggregation: no plaintext report
    assert "evaluate" not in by_stage
    for stage in ("join", "advertise", "share", "masked", "unmask"):
        assert by_stage[stage][1] == 64
    assert by_stage["advertise"][0] == 25  # 5 participants × 5 jobs
    jobs = db.execute("SELECT purpose, status FROM jobs ORDER BY created").fetchall()
    assert jobs == [
        ("update", "done"),
        ("update", "done"),
        ("ccvr", "done"),
        ("evaluate", "done"),  # the validation gate's
        ("evaluate", "done"),
    ]


def test_each_site_audits_its_own_releases_with_their_rosters(
    secure_run: tuple[dict[str, Any], SimulationSettings],
) -> None:
    """``spherecal audit --site`` on each site's state directory alone (issue #19):
    every job of the run is one release there, summed with the job's contributors,
    the evaluation with its ε; no differencing pair."""
    from spherecal.site_audit import read_site_audit

    results, settings = secure_run
    for k in range(5):
        audit = read_site_audit(settings.out / "state" / f"p{k}")
        released = [r for r in audit.releases if r.state == "released"]
        # two rounds, the CCVR moments (FFC solved from them), then the evaluations:
        # the validation gate's and the final test evaluation
        kinds = [r.kind for r in released]
        assert kinds[:3] == ["update", "update", "ccvr"], kinds
        assert kinds[3:] and set(kinds[3:]) == {"evaluate"}, kinds
        assert [r.kind for r in released] == [
            {"update": "update", "ccvr": "ccvr", "evaluate": "evaluate"}[j["purpose"]]
            for j in results["jobs"]
        ]
        for release, job in zip(released, results["jobs"], strict=True):
            assert release.job == job["job_id"]
            assert release.survivors == sorted(job["contributors"])
            # the site's audit and the coordinator's summary count rounds alike
            assert release.round == job["round"], (release, job)
        for evaluation in released[3:]:
            assert evaluation.noised and (evaluation.epsilon or 0) > 0
        assert audit.pairs == [] and audit.refusals == [] and audit.ok


def test_written_documents_match_their_declared_shapes(
    secure_run: tuple[SimulationResults, SimulationSettings],
) -> None:
    """``results.json`` and ``summary.json`` as written, against their declarations."""
    _, settings = secure_run
    for path, shape in [
        (settings.out / "results.json", SimulationResults),
        (settings.out / "coordinator" / "out" / "summary.json", CoordinatorSummary),
    ]:
        assert shape_errors(json.loads(path.read_text()), shape) == [], path.name
