"""The declared bounds that size a secure-aggregation job's ring.

Bonawitz et al. (2017) sum in a finite ring, so every entry a site may send needs a
bound that the sum of ``n`` of them cannot wrap; the bound then sets the job's
fixed-point scale (``spherecal.crypto.ring.choose_scale_bits``: the finest ``2^-f``
with ``bound · 2^f ≤ 2^50`` whose ``n``-fold sum fits). A bound that follows what the
federation declares (issue #24) rounds finer than a fixed one: the round's update
bound (``strategy.update_bound``, from the algorithm) and here the calibration
statistics' (from the head and ``[federation] max_examples_per_site``).

Each bound is pure in the settings, so a restarted coordinator derives the same; a
journaled job keeps the bound of its spec either way. A site whose vector leaves the
job's bound refuses to send it (a typed ``EncodingOverflow`` withdrawal), never a
wrapped sum — except where an entry is a count (an evaluation's counts, unit-norm
statistics, an update's weight): since a refusal by a count would tell the coordinator
that count past secure aggregation, a site fits those to any bound, with a random
subset of its examples or a smaller weight (``docs/privacy.md``, *A job's entry bound
is no count oracle*). Bounds derived here never make a site within the declared limits
do so.
"""

from __future__ import annotations

from dataclasses import dataclass

from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.spherefed.heads import UNIT_NORM_HEADS
from spherecal.spherefed.stats import FALLBACK_STATISTICS_BOUND, statistics_entry_bound

__all__ = [
    "DeclaredBound",
    "evaluation_bound",
    "statistics_bound",
]


@dataclass(frozen=True)
class DeclaredBound:
    """The bound on every entry of a job's vector (a round's update, the calibration
    statistics) and where it came from."""

    value: float
    source: str
    """``derived`` (from the declared limits), ``configured`` (set in
    ``[secure_aggregation]``) or ``fallback`` (nothing declared bounds it)."""
    detail: str
    what: str = "update bound"

    def describe(self) -> str:
        return f"{self.what} {self.value:g} ({self.source}: {self.detail})"


def statistics_bound(settings: CoordinatorSettings) -> DeclaredBound:
    """The bound on every entry of a calibration-statistics job without DP (a DP
    release's plan states its own).

    ``[secure_aggregation] statistics_bound > 0`` is used as configured. Otherwise
    :func:`~spherecal.spherefed.stats.statistics_entry_bound`: for a unit-norm head
    (``‖z‖ ≤ 1``) every entry of a site's FFC or CCVR statistics is at most its example
    count, so ``[federation] max_examples_per_site`` (plus float rounding's slack); for
    any other head ``FALLBACK_STATISTICS_BOUND``. The in-process reference's secure sum
    (``spherefed.privacy.secure_sum``) derives the same."""
    what = "statistics bound"
    configured = settings.secagg.statistics_bound
    if configured > 0:
        return DeclaredBound(
            configured, "configured", "[secure_aggregation] statistics_bound", what
        )
    head, n_max = settings.model.head, settings.max_examples_per_site
    value = statistics_entry_bound(head, n_max)
    if head not in UNIT_NORM_HEADS:
        detail = f"head {head!r} does not bound ‖z‖; set [secure_aggregation] statistics_bound"
        return DeclaredBound(value, "fallback", detail, what)
    detail = f"unit-norm head {head!r}, max_examples_per_site {n_max}"
    return DeclaredBound(value, "derived", detail, what)


def evaluation_bound(settings: CoordinatorSettings) -> float:
    """The bound on a federated evaluation job's entries (a site's sample and correct
    counts): ``[secure_aggregation] statistics_bound`` when set, else
    :data:`FALLBACK_STATISTICS_BOUND` — the vector is a few entries, so its scale costs
    nothing worth deriving."""
    configured = settings.secagg.statistics_bound
    return configured if configured > 0 else FALLBACK_STATISTICS_BOUND
