"""Two statistics jobs over disjoint sites add to the sum over their union
(``coordinator/driver/calibration_stage.py``, ``_Summed.plus``): the CCVR counts,
sums and moments add; a class only the second part has is no longer missing; DP
noise and the ridge floor it sets combine as a root sum of squares; the results say
which job summed whom. Two final evaluations over disjoint sites add their counts the
same way (``evaluation_stage.add_evaluations``)."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

from spherecal.coordinator.driver.calibration_stage import _Summed
from spherecal.coordinator.driver.evaluation_stage import add_evaluations
from spherecal.coordinator.summary_schema import EvaluationNoise, FederatedEvaluation
from spherecal.spherefed.privacy.evaluation_noise import accuracy_sd
from spherecal.spherefed.stats import CCVRStatistics, ccvr_statistics

ORDER = {f"p{k}": k for k in range(6)}.__getitem__


def _part(
    contributors: list[str], seed: int, classes: list[int], sigma: float, *, noised: bool
) -> _Summed:
    rng = np.random.default_rng(seed)
    labels = np.array(classes * 5)
    features = rng.normal(size=(len(labels), 4))
    stats = ccvr_statistics(features, labels, num_classes=3)
    return _Summed(
        stats=stats,
        contributors=contributors,
        record={
            "contributors": contributors,
            "samples": float(stats.counts.sum()),
            "missing_classes": [c for c in range(3) if c not in classes],
            "noise_sigma": sigma,
        },
        dp_ridge={"ccvr": 2.0 * sigma, "ffc-from-ccvr": 3.0 * sigma} if noised else {},
        vector=stats.pack(),
        seconds=1.0,
        noised=noised,
    )


def test_two_parts_add_to_the_sum_over_their_union() -> None:
    first = _part(["p0", "p2", "p4"], 0, [0, 1], 3.0, noised=True)
    second = _part(["p1", "p3"], 1, [2], 4.0, noised=True)
    both = first.plus(second, ORDER)
    assert isinstance(both.stats, CCVRStatistics) and isinstance(first.stats, CCVRStatistics)
    assert isinstance(second.stats, CCVRStatistics)
    np.testing.assert_array_equal(both.stats.counts, [5, 5, 5])
    np.testing.assert_array_equal(
        both.stats.second_moments, first.stats.second_moments + second.stats.second_moments
    )
    np.testing.assert_array_equal(both.vector, first.vector + second.vector)
    assert both.contributors == ["p0", "p1", "p2", "p3", "p4"]
    assert both.record["contributors"] == both.contributors
    assert both.record["samples"] == 15.0
    assert both.record["missing_classes"] == []  # class 2 came with the second part
    assert both.record["noise_sigma"] == pytest.approx(5.0)
    assert both.dp_ridge == pytest.approx({"ccvr": 10.0, "ffc-from-ccvr": 15.0})
    assert [p["contributors"] for p in both.record["parts"]] == [
        ["p0", "p2", "p4"],
        ["p1", "p3"],
    ]
    # a third part keeps one list of parts
    third = _part(["p5"], 2, [0], 0.0, noised=True)
    assert [p["contributors"] for p in both.plus(third, ORDER).record["parts"]] == [
        ["p0", "p2", "p4"],
        ["p1", "p3"],
        ["p5"],
    ]


def test_parts_that_share_a_site_are_never_added() -> None:
    first = _part(["p0", "p1"], 0, [0], 0.0, noised=False)
    with pytest.raises(ValueError, match=r"share \['p1'\]"):
        first.plus(_part(["p1", "p2"], 1, [1], 0.0, noised=False), ORDER)


def _evaluation(
    participants: list[str], total: float, correct: dict[str, float], sum_sd: float | None
) -> FederatedEvaluation:
    noise: EvaluationNoise | None = (
        None
        if sum_sd is None
        else {
            "mechanism": "discrete_gaussian",
            "sd_target": 2.0,
            "site_sd": 1.0,
            "sum_sd": sum_sd,
            "sum_bound": 4 * sum_sd,
            "contributors": len(participants),
        }
    )
    return {
        "accuracy": {n: c / total for n, c in correct.items()},
        "participants": participants,
        "samples": total,
        "accuracy_sd": {n: None for n in correct},
        "noise": noise,
        "dropped": {},
        "secure": True,
        "error": None,
        "counts": {"total": total, "correct": correct},
    }


def test_two_final_evaluations_over_disjoint_sites_add_their_counts() -> None:
    kept = _evaluation(["p0", "p2"], 300.0, {"none": 150.0, "ffc": 240.0}, 3.0)
    more = _evaluation(["p1"], 100.0, {"none": 90.0, "ffc": 80.0}, 4.0)
    both = add_evaluations(kept, more, ORDER)
    assert both["participants"] == ["p0", "p1", "p2"]
    assert both["counts"] == {"total": 400.0, "correct": {"none": 240.0, "ffc": 320.0}}
    assert both["accuracy"] == {"none": 0.6, "ffc": 0.8}
    assert both["samples"] == 400
    assert both["noise"] is not None and both["noise"]["sum_sd"] == pytest.approx(5.0)
    assert both["noise"]["sum_bound"] == pytest.approx(28.0)
    assert both["noise"]["contributors"] == 3
    assert both["accuracy_sd"]["ffc"] == pytest.approx(accuracy_sd(320.0, 400.0, 5.0))
    assert both["parts"] == [["p0", "p2"], ["p1"]]
    # a retry that summed nothing leaves the evaluation kept as it was
    failed = {**more, "error": "too few survivors", "participants": []}
    del failed["counts"]
    assert add_evaluations(kept, cast(FederatedEvaluation, failed), ORDER) is kept
    with pytest.raises(ValueError, match=r"share \['p0'\]"):
        add_evaluations(kept, _evaluation(["p0"], 1.0, {"none": 1.0, "ffc": 1.0}, 1.0), ORDER)


def test_exact_counts_add_exactly() -> None:
    kept = _evaluation(["p1"], 7.0, {"none": 3.0}, None)
    both = add_evaluations(kept, _evaluation(["p0"], 5.0, {"none": 5.0}, None), ORDER)
    assert both["accuracy"] == {"none": 8.0 / 12.0} and both["samples"] == 12.0
    assert both["noise"] is None and both["accuracy_sd"] == {"none": None}


def test_a_training_rounds_parts_add_to_the_sum_over_their_union() -> None:
    """A round's short sum kept and a retry over the others (``training_rounds``):
    FedAvg's ``Σ n_k Δ_k``, ``Σ n_k`` and the losses add; overlapping parts are
    refused (a retry never asks a site whose update is in the sum kept)."""
    from spherecal.coordinator.driver.stages import Gathered
    from spherecal.coordinator.driver.training_rounds import _KeptSum

    rng = np.random.default_rng(3)
    updates = {f"p{k}": rng.normal(size=6) for k in range(5)}
    nothing = _KeptSum()
    first = ["p3", "p0", "p1"]
    kept = nothing.plus(Gathered(np.sum([updates[p] for p in first], axis=0), first, {}), ORDER)
    assert nothing.parts == [] and nothing.values is None  # plus leaves its operand as it was
    second = ["p4", "p2"]
    part = Gathered(np.sum([updates[p] for p in second], axis=0), second, {"p9": "gone"})
    total = kept.plus(part, ORDER)
    assert kept.contributors == ["p0", "p1", "p3"]
    union = total.gathered({"p9": "gone"})
    assert union.contributors == ["p0", "p1", "p2", "p3", "p4"]
    assert total.parts == [["p0", "p1", "p3"], ["p2", "p4"]]
    assert union.values is not None
    np.testing.assert_allclose(
        union.values, np.sum(list(updates.values()), axis=0), rtol=0, atol=1e-12
    )
    assert union.dropped == {"p9": "gone"} and union.error is None
    nothing.take(total)  # what the driver keeps of a short sum
    assert nothing.contributors == union.contributors and nothing.parts == total.parts
    with pytest.raises(ValueError, match=r"share contributors \['p2'\]"):
        total.plus(Gathered(updates["p2"], ["p2"], {}), ORDER)
