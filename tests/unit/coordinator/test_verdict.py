"""The honest final status: ``completed`` only when every requested calibration has its
head from statistics over at least the calibration minimum and the final evaluation
covers that many; otherwise ``degraded`` with reasons naming what and who."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest

from spherecal.coordinator.driver.stages import Progress
from spherecal.coordinator.driver.verdict import assess, coverage, headline_coverage
from spherecal.coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    SecAggSettings,
    TrainingSettings,
)
from spherecal.coordinator.summary_schema import JobSummary, RoundMetrics

ROSTER = ("p0", "p1", "p2", "p3")


def _settings(**calibration: Any) -> CoordinatorSettings:
    return CoordinatorSettings(
        participants=ROSTER,
        calibration=CalibrationSettings(methods=("ffc", "ccvr"), **calibration),
    )


def _progress(*, ccvr: list[str] | None = None, evaluated: list[str] | None = None) -> Progress:
    progress = Progress(global_vector=np.zeros(1))
    if ccvr is not None:
        progress.results["statistics"] = {"ccvr": {"contributors": ccvr, "samples": 10.0}}
    progress.results["federated_evaluation"] = {
        "participants": list(ROSTER) if evaluated is None else evaluated,
        "samples": 400 if evaluated is None else 100 * len(evaluated),
        "accuracy": {"none": 0.5},
        "accuracy_sd": {"none": None},
        "noise": None,
        "dropped": {},
        "secure": True,
        "error": None,
    }
    return progress


def test_every_head_from_everyone_is_completed() -> None:
    verdict = assess(_settings(), _progress(ccvr=list(ROSTER)), {"ffc", "ccvr"})
    assert verdict.status == "completed" and verdict.reasons == []


def test_a_missing_head_is_degraded_with_the_statistics_error_as_reason() -> None:
    progress = _progress()
    progress.errors.append("ccvr statistics failed: too few survivors (2 < threshold 3)")
    verdict = assess(_settings(), progress, set())
    assert verdict.status == "degraded"
    # FFC derives from the CCVR job here, so both name the CCVR failure.
    assert len(verdict.reasons) == 2
    assert verdict.reasons[0].startswith("ffc: no calibrated classifier (ccvr statistics failed")
    assert verdict.reasons[1].startswith("ccvr: no calibrated classifier (ccvr statistics")


def test_a_method_states_its_cause_once_not_once_per_attempt() -> None:
    """Each failed job of a retried statistics kind is in ``errors`` (one per attempt),
    and the stage's conclusion after them: the reason takes the conclusion, once."""
    progress = _progress()
    chain = "TooFewSurvivors: … — first cause: p0, p1 withdrew at advertise: POLICY_REFUSAL"
    progress.errors.extend(f"ccvr job {k}a2b3c4d: {chain}" for k in range(3))
    progress.errors.append(f"ccvr statistics failed: 3 attempts failed; the last: {chain}")
    verdict = assess(_settings(), progress, set())
    for method, reason in zip(("ffc", "ccvr"), verdict.reasons, strict=True):
        assert reason == (
            f"{method}: no calibrated classifier (ccvr statistics failed: 3 attempts "
            f"failed; the last: {chain})"
        )
    # without a conclusion, the jobs' own lines still say why (each once)
    bare = _progress()
    bare.errors.extend([f"ccvr job 1a2b3c4d: {chain}"] * 2)
    (first, _) = assess(_settings(), bare, set()).reasons
    assert first == f"ffc: no calibrated classifier (ccvr job 1a2b3c4d: {chain})"


def test_statistics_below_the_minimum_are_degraded_and_name_who_is_missing() -> None:
    verdict = assess(_settings(), _progress(ccvr=["p1"]), {"ffc", "ccvr"})
    assert verdict.status == "degraded"
    assert verdict.reasons == [
        "ccvr statistics summed 1 participants (minimum 3); missing ['p0', 'p2', 'p3']"
    ]


def test_a_headline_from_too_few_participants_is_degraded() -> None:
    progress = _progress(ccvr=list(ROSTER), evaluated=["p2"])
    verdict = assess(_settings(), progress, {"ffc", "ccvr"})
    assert verdict.status == "degraded"
    assert verdict.reasons == [
        "the final evaluation covered 1 participants (100 test samples; minimum 3); "
        "missing ['p0', 'p1', 'p3']"
    ]
    assert headline_coverage(_settings(), progress) == {
        "participants": 1,
        "of": 4,
        "test_samples": 100,
        "missing": ["p0", "p1", "p3"],
    }


def test_at_the_minimum_is_completed_and_an_explicit_minimum_applies() -> None:
    progress = _progress(ccvr=["p0", "p1", "p3"], evaluated=["p0", "p1", "p3"])
    assert assess(_settings(), progress, {"ffc", "ccvr"}).status == "completed"
    strict = _settings(min_participants=4)
    assert assess(strict, progress, {"ffc", "ccvr"}).status == "degraded"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, 3),  # secure statistics: the secure-aggregation minimum (3) beats training's 2
        ({"secagg": SecAggSettings(statistics=False)}, 2),  # plaintext: training's minimum
        ({"training": TrainingSettings(min_participants=4)}, 4),
        ({"calibration": CalibrationSettings(min_participants=1)}, 1),  # explicit wins
    ],
)
def test_calibration_minimum(kwargs: dict[str, Any], expected: int) -> None:
    assert CoordinatorSettings(participants=ROSTER, **kwargs).calibration_minimum == expected


def test_a_calibration_minimum_beyond_the_roster_is_refused() -> None:
    with pytest.raises(ValueError, match="calibration min_participants=5"):
        CoordinatorSettings(
            participants=ROSTER, calibration=CalibrationSettings(min_participants=5)
        )
    with pytest.raises(ValueError, match=">= 0"):
        CalibrationSettings(min_participants=-1)


def test_coverage_lists_per_round_and_per_job_who_was_missing_and_how_many_summed() -> None:
    progress = _progress(ccvr=["p0", "p1", "p2"])
    progress.round_metrics.append(
        cast(
            RoundMetrics,
            {
                "round": 2,
                "attempt": 2,
                "selected": list(ROSTER),
                "contributors": ["p0", "p2", "p3"],
                "dropped": {"p1": "disconnected / heartbeat timeout"},
            },
        )
    )
    progress.job_summaries.append(
        cast(
            JobSummary,
            {
                "purpose": "ccvr",
                "round": None,
                "status": "failed",
                "participants": ["p0", "p1", "p2"],
                "contributors": ["p0", "p1"],
                "dropped": {"p2": "disconnected"},
                "error": "too few survivors",
            },
        )
    )
    report = coverage(_settings(), progress)
    assert report["rounds"] == [
        {
            "round": 2,
            "attempt": 2,
            "selected": 4,
            "summed": 3,
            "missing": {"p1": "disconnected / heartbeat timeout"},
        }
    ]
    assert report["jobs"] == [
        {
            "purpose": "ccvr",
            "round": None,
            "status": "failed",
            "asked": 3,
            "summed": 0,  # a failed job summed nothing
            "missing": {"p2": "disconnected"},
            "not_asked": ["p3"],
            "error": "too few survivors",
        }
    ]
    assert report["evaluation"]["participants"] == 4


# ---------------------------------------------------------------- coverage (issue #20)
def _covered(
    ccvr: list[str], *, trained: list[str], missing_classes: list[int] | None = None
) -> Progress:
    progress = _progress(ccvr=ccvr)
    progress.results["statistics"]["ccvr"]["missing_classes"] = missing_classes or []
    progress.round_metrics = [
        cast(RoundMetrics, {"round": 1, "selected": trained, "contributors": trained})
    ]
    return progress


def test_statistics_lacking_a_site_that_trained_are_degraded_naming_it() -> None:
    progress = _covered(["p0", "p1", "p3"], trained=list(ROSTER))
    verdict = assess(_settings(), progress, {"ffc", "ccvr"})
    assert verdict.status == "degraded"
    assert verdict.reasons == ["ccvr statistics lack 1 of the federation's 4 participants: ['p2']"]


def test_a_site_that_never_shaped_the_model_is_not_a_gap() -> None:
    """p3 was asked for statistics but no round summed its update (excluded from every
    job for misconduct): the calibration completes the model the others trained."""
    progress = _covered(["p0", "p1", "p2"], trained=["p0", "p1", "p2"])
    progress.job_summaries = [
        cast(JobSummary, {"purpose": "ccvr", "round": None, "participants": list(ROSTER)})
    ]
    assert assess(_settings(), progress, {"ffc", "ccvr"}).status == "completed"


def test_a_site_that_never_took_part_is_not_a_gap() -> None:
    """p3 never joined (the join window's warning says so): not the calibration's gap."""
    progress = _covered(["p0", "p1", "p2"], trained=["p0", "p1", "p2"])
    assert assess(_settings(), progress, {"ffc", "ccvr"}).status == "completed"


def test_statistics_without_a_class_are_degraded_naming_the_class() -> None:
    progress = _covered(list(ROSTER), trained=list(ROSTER), missing_classes=[0])
    verdict = assess(_settings(), progress, {"ffc", "ccvr"})
    assert verdict.status == "degraded"
    assert verdict.reasons == [
        "ccvr statistics have no samples of class(es) [0] (of 10): the calibrated heads "
        "cannot represent them"
    ]


def test_below_the_minimum_the_gap_is_named_once() -> None:
    progress = _covered(["p1"], trained=list(ROSTER))
    verdict = assess(_settings(), progress, {"ffc", "ccvr"})
    assert verdict.reasons == [
        "ccvr statistics summed 1 participants (minimum 3); missing ['p0', 'p2', 'p3']"
    ]
