"""DP calibration that is never a loss, through the real service (issue #25).

Two federations of real processes on digits (3 sites, Dirichlet α = 0.1, mlp, 2
rounds, secure aggregation, separate FFC and CCVR releases, 3 guaranteed
contributors):

* at ε = 0.1 per release the noise swamps both calibrations (measured: FFC 0.53,
  CCVR 0.13 on validation against 0.87 uncalibrated): both heads are withheld, the
  sites hold the uncalibrated model only, ``results.json`` says why for each method,
  the status is ``degraded`` with those reasons, CCVR's noisy sums were projected
  instead of stopping the run, and ``spherecal audit`` still passes;
* at ε = 1000 per release the calibrated heads beat the uncalibrated model on
  validation and ship (and the trace invariant admits the release's truncated
  features: it refused the FFC sums here before, tr V 1202.8 vs count 1212.9).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spherecal.audit import run_audit
from spherecal.results_schema import SimulationResults
from spherecal.simulate import SimulationSettings, run_simulation
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

METHODS = ("ffc", "ccvr")


def _run(out: Path, epsilon: float) -> SimulationResults:
    return run_simulation(
        SimulationSettings(
            reference=ReferenceConfig(participants=3, model="mlp", rounds=2, alpha=0.1),
            out=out,
            calibration=METHODS,
            ffc_from_ccvr=False,
            epsilon=epsilon,
            chunk_entries=8192,
            timeout_s=300,
        )
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimulationResults, Path]:
    out = tmp_path_factory.mktemp("dp-tiny")
    return _run(out, 0.1), out


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimulationResults, Path]:
    out = tmp_path_factory.mktemp("dp-large")
    return _run(out, 1000.0), out


def test_a_tiny_epsilon_withholds_the_heads_and_says_why(
    tiny: tuple[dict[str, Any], Path],
) -> None:
    results, out = tiny
    assert results["errors"] == []  # nothing failed: CCVR did not crash on its noisy sums
    release = results["calibration_release"]
    validation = results["validation_accuracy"]
    for method in METHODS:
        decision = release[method]
        assert decision["shipped"] is False and decision["dp"] is True
        assert decision["validation_accuracy"] == validation[method]
        assert decision["uncalibrated_validation_accuracy"] == validation["none"]
        assert decision["validation_accuracy"] <= decision["uncalibrated_validation_accuracy"]
        assert decision["samples"] > 0
        assert decision["reason"].startswith("DP calibrated head withheld")
        assert results["accuracy"][method] is None  # not evaluated as a shipped head
    assert results["status"] == "degraded"
    reasons = results["status_reasons"]
    assert reasons[: len(METHODS)] == [f"{m}: {release[m]['reason']}" for m in METHODS]
    # the only other honest reason here: a class the noise pushed below one sample
    assert all("statistics have no samples of class" in r for r in reasons[len(METHODS) :])
    # the sites got the uncalibrated model only, as the coordinator saved it
    assert set(results["models"]) == {"none"}
    for pid in ("p0", "p1", "p2"):
        site = out / "out" / pid
        assert sorted(p.name for p in site.glob("model_*.pt")) == ["model_none.pt"]
    # CCVR's noisy sums were projected (negative counts, if the draw gave any, were
    # made empty classes) and the projection is on record
    projection = results["statistics"]["ccvr"]["projection"]
    assert set(projection["negative_counts"]) <= set(projection["emptied_classes"])
    assert projection["clipped_eigenvalues"] > 0  # σ ≈ 60 per entry: surely indefinite
    # withholding a noisy head is not a failed integrity check
    report = dict[str, Any](run_audit(out))
    assert report["ok"], {k: v for k, v in report["checks"].items() if not v["ok"]}
    assert report["checks"]["integrity"]["withheld_dp_heads"] == sorted(METHODS)


def test_a_large_epsilon_ships_heads_that_beat_the_uncalibrated_model(
    large: tuple[dict[str, Any], Path],
) -> None:
    results, out = large
    assert results["errors"] == [], results["errors"]
    assert results["status"] == "completed", results["status_reasons"]
    release = results["calibration_release"]
    for method in METHODS:
        decision = release[method]
        assert decision["shipped"] is True and decision["dp"] is True
        assert decision["validation_accuracy"] > decision["uncalibrated_validation_accuracy"]
        assert isinstance(results["accuracy"][method], float)
    assert set(results["models"]) >= {"none", "ffc", "ccvr"}
    site = out / "out" / "p0"
    assert {p.name for p in site.glob("model_*.pt")} == {
        "model_none.pt",
        "model_ffc.pt",
        "model_ccvr.pt",
    }
