"""Two statistics jobs over disjoint sites add to the sum over their union
(``coordinator/driver/calibration_stage.py``, ``_Summed.plus``): the CCVR counts,
sums and moments add; a class only the second part has is no longer missing; DP
noise and the ridge floor it sets combine as a root sum of squares; the results say
which job summed whom."""

from __future__ import annotations

import numpy as np
import pytest

from spherecal.coordinator.driver.calibration_stage import _Summed
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
