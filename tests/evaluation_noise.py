"""Comparing a federated accuracy, which carries the sites' DP noise on the counts
(issue #19, ``spherecal.spherefed.privacy.evaluation_noise``), with an exact one.

Federated evaluation over the whole test split equals central evaluation *in its
counts*; with the noise it equals it within the stated standard deviation. A
tolerance of ``SDS`` standard deviations makes a false failure practically
impossible (two-sided normal tail at 6σ ≈ 2e-9) while a wrong count of even a few
examples (several σ at the test sizes used) still fails. Without noise (plaintext
evaluation) the comparison is exact.
"""

from __future__ import annotations

from collections.abc import Mapping

from spherecal.coordinator.summary_schema import CoordinatorSummary
from spherecal.results_schema import SimulationResults

SDS = 6.0


def within_noise(federated: float | None, exact: float | None, sd: float | None) -> bool:
    """``federated`` equals ``exact`` up to ``SDS`` of its noise (exactly when none)."""
    if federated is None or exact is None:
        return federated is exact
    if sd is None:
        return federated == exact
    return abs(federated - exact) <= SDS * sd


def assert_accuracy_within_noise(
    results: CoordinatorSummary | SimulationResults,
    exact: Mapping[str, float | None] | None,
    names: tuple[str, ...] = ("none", "ffc", "ccvr"),
) -> None:
    """Each head's federated accuracy in ``results`` against ``exact``."""
    fed, accuracy = results["federated_evaluation"], results["accuracy"]
    assert fed is not None and accuracy is not None and exact is not None
    spread = fed["accuracy_sd"]
    for name in names:
        got, want, sd = accuracy[name], exact[name], spread.get(name)
        assert within_noise(got, want, sd), f"{name}: {got} vs {want} (sd {sd})"
