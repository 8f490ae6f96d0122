"""The calibration statistics summed by the real secure-aggregation protocol, in process.

``spherecal reference --secure-sum`` (``ReferenceConfig.secure_sum``) replaces the
reference runner's float sum of the participants' CCVR statistics by
:func:`spherecal.crypto.simulation.simulate_secure_sum`: real identity keys, pairwise masks,
Shamir shares and every check of both state machines, messages through their
canonical bytes — only the network is missing. The fixed-point scale is the one the
coordinator uses for a statistics job (:func:`spherecal.crypto.ring.choose_scale_bits` of the
participant count and the bound the coordinator derives with ``[secure_aggregation]
statistics_bound = 0``: :func:`spherecal.spherefed.stats.statistics_entry_bound` of the
head and the largest example count a site may hold), so every calibrator computed from
the result sees exactly the numbers the service's secure aggregation delivers: the
in-process evidence that a calibrator's accuracy is "delivered through secure
aggregation".
"""

from __future__ import annotations

from collections.abc import Sequence

from spherecal.spherefed.stats import CCVRStatistics

BOUND_RULE = "statistics_entry_bound"
"""How the secure sum's bound (hence its fixed-point scale) is chosen: since 2026-11-26
:func:`~spherecal.spherefed.stats.statistics_entry_bound` of the head and the largest
split (a fixed 1e6 before). Part of a ``--secure-sum`` experiment cell's identity, so
cells summed under another rule are not reused."""


def secure_sum_statistics(parts: Sequence[CCVRStatistics], *, bound: float) -> CCVRStatistics:
    """Sum per-participant CCVR statistics through the in-process secure-aggregation protocol.

    ``bound``: the declared bound on every entry (the service's:
    :func:`~spherecal.spherefed.stats.statistics_entry_bound`). Needs at least two
    participants (secure aggregation of one input would reveal it); the threshold is a
    majority, ``⌊n/2⌋ + 1``. Raises the protocol's typed errors (e.g. a value beyond
    ``bound``).
    """
    from spherecal.crypto.ring import choose_scale_bits
    from spherecal.crypto.simulation import simulate_secure_sum

    if len(parts) < 2:
        raise ValueError("secure aggregation needs at least 2 participants")
    dim, classes = parts[0].dim, parts[0].num_classes
    n = len(parts)
    summed = simulate_secure_sum(
        [p.pack() for p in parts],
        threshold=n // 2 + 1,
        scale_bits=choose_scale_bits(n, bound),
    )
    return CCVRStatistics.unpack(summed, dim, classes)
