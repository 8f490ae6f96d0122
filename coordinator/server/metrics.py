"""The coordinator's Prometheus metrics (``[metrics] listen``; off by default).

A custom collector reads the live state at scrape time — the same snapshot as the
status view (``spherecal.coordinator.server.status``) plus the byte accounting — so the
driver carries no instrumentation and a scrape can never disagree with ``spherecal
status``. Metadata only: counts, durations, bytes, ε; never statistics, updates or
keys. The listener (``/metrics``, ``/healthz``, ``/readyz``) is
:mod:`spherecal.coordinator.server.probes`.

Names follow Prometheus' conventions (issue #26; ``promtool check metrics`` is clean,
tested): ``_total`` only on counters, base units in names (``_seconds``,
``_bytes``), and every label takes a small fixed set of values — the round number
is a gauge, never a label; the phase and status are *state sets* (one series per
value of a short enum, 1 for the current one). All prefixed ``spherecal_``:

- ``participants`` {state=roster|joined|connected} (gauge)
- ``round_current``, ``rounds_completed``, ``rounds_configured`` (gauges)
- ``phase`` {phase=starting|waiting|training|aggregating|calibrating|evaluating|ended|other}
- ``federation_status`` {status=running|completed|degraded|failed|other}
- ``secagg_stage`` {stage=advertise|share|masked|consistency|unmask|done|aborted}
  (all 0 when no secure job is running)
- ``jobs`` {purpose, state}: how many jobs are in each state (gauge)
- ``job_duration_seconds`` {purpose}: summary (count, sum) over finished jobs
- ``round_duration_seconds``: summary over completed rounds
- ``payload_bytes_total`` {direction=sent|received, stage}: payload bytes on the wire
- ``refusals_total`` {code}: refused requests by gRPC status code (counter)
- ``epsilon_spent`` {subject}: (ε, δ)-DP budget spent (with ``[privacy]`` on; one
  subject per roster member and ``federation``)
- ``uptime_seconds`` (gauge)
- ``crl_next_update_timestamp_seconds``: Unix time of the ``nextUpdate`` of the
  ``[tls] crl`` list in force (no sample without one): alert before it passes, as
  for a certificate's expiry

plus ``prometheus_client``'s default ``process_*``, ``python_info`` and
``python_gc_*`` collectors. :data:`EXPORTED` lists every family name (the Grafana
dashboard in ``docs/grafana-dashboard.json`` is tested against it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.server.status import federation_status

__all__ = [
    "EXPORTED",
    "PHASES",
    "SECAGG_STAGES",
    "STATUSES",
    "metrics_registry",
    "phase_of",
]

PHASES = (
    "starting",
    "waiting",
    "training",
    "aggregating",
    "calibrating",
    "evaluating",
    "ended",
    "other",
)
STATUSES = ("running", "completed", "degraded", "failed", "other")
SECAGG_STAGES = ("advertise", "share", "masked", "consistency", "unmask", "done", "aborted")

#: Every family the federation collector exports (sample names add ``_count``/``_sum``
#: to summaries and ``_total`` to counters).
EXPORTED = (
    "spherecal_participants",
    "spherecal_round_current",
    "spherecal_rounds_completed",
    "spherecal_rounds_configured",
    "spherecal_uptime_seconds",
    "spherecal_phase",
    "spherecal_federation_status",
    "spherecal_secagg_stage",
    "spherecal_jobs",
    "spherecal_job_duration_seconds",
    "spherecal_round_duration_seconds",
    "spherecal_payload_bytes",
    "spherecal_refusals",
    "spherecal_epsilon_spent",
    "spherecal_crl_next_update_timestamp_seconds",
)


def phase_of(phase: str, status: str) -> str:
    """The bounded phase enum for the driver's free-text phase (``"round 41/120:
    training"`` → ``training``): a label value per round would be a new series each
    round."""
    if status != "running":
        return "ended"
    if phase == "starting":
        return "starting"
    if phase.startswith("waiting"):
        return "waiting"
    if phase.startswith("round "):
        return "aggregating" if phase.endswith("aggregating") else "training"
    if phase.startswith(("statistics", "calibrat")):
        return "calibrating"
    if phase.startswith("evaluat"):
        return "evaluating"
    return "other"


def _state_set(name: str, text: str, label: str, values: tuple[str, ...], now: str) -> Any:
    family = GaugeMetricFamily(name, text, labels=[label])
    for value in values:
        family.add_metric([value], 1.0 if value == now else 0.0)
    return family


class _FederationCollector(Collector):
    def __init__(self, service: CoordinatorService) -> None:
        self.service = service

    def collect(self) -> Iterator[Any]:
        s = self.service
        st = federation_status(s.settings, s.registry, s.federation, s.refusals)
        people = GaugeMetricFamily(
            "spherecal_participants", "Participants by state", labels=["state"]
        )
        people.add_metric(["roster"], len(st.roster))
        people.add_metric(["joined"], sum(1 for r in st.roster if r.joined))
        people.add_metric(["connected"], sum(1 for r in st.roster if r.connected))
        yield people
        for name, value, text in (
            ("spherecal_round_current", st.current_round, "Round in progress (0: none)"),
            ("spherecal_rounds_completed", st.completed_rounds, "Completed training rounds"),
            ("spherecal_rounds_configured", st.rounds, "Configured training rounds"),
            ("spherecal_uptime_seconds", st.uptime_s, "Seconds since the coordinator started"),
        ):
            yield GaugeMetricFamily(name, text, value=value)
        status = st.status if st.status in STATUSES else "other"
        yield _state_set(
            "spherecal_phase",
            "Current phase of the federation (1 for the current one)",
            "phase",
            PHASES,
            phase_of(st.phase, st.status),
        )
        yield _state_set(
            "spherecal_federation_status",
            "Status of the federation (1 for the current one)",
            "status",
            STATUSES,
            status,
        )
        yield _state_set(
            "spherecal_secagg_stage",
            "Stage of the running secure-aggregation job (all 0: none running)",
            "stage",
            SECAGG_STAGES,
            st.stage,
        )
        yield from self._jobs(st.jobs)
        rounds = SummaryMetricFamily(
            "spherecal_round_duration_seconds", "Duration of completed rounds"
        )
        rounds.add_metric([], len(st.completed), sum(r.seconds for r in st.completed))
        yield rounds
        yield from self._bytes()
        refusals = CounterMetricFamily(
            "spherecal_refusals", "Refused requests by gRPC status code", labels=["code"]
        )
        for code, count in sorted(s.refusals.snapshot().items()):
            refusals.add_metric([code], count)
        yield refusals
        epsilon = GaugeMetricFamily(
            "spherecal_epsilon_spent", "Differential-privacy epsilon spent", labels=["subject"]
        )
        for entry in st.epsilon:
            epsilon.add_metric([entry.subject], entry.epsilon)
        yield epsilon
        crl = GaugeMetricFamily(
            "spherecal_crl_next_update_timestamp_seconds",
            "Unix time of the nextUpdate of the revocation list in force",
        )
        ends = s.revocation.next_update() if s.revocation is not None else None
        if ends is not None:
            crl.add_metric([], ends.timestamp())
        yield crl

    def _jobs(self, jobs: Any) -> Iterator[Any]:
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for job in jobs:
            counts[(job.purpose, job.state)] += 1
        family = GaugeMetricFamily(
            "spherecal_jobs", "Secure-aggregation jobs by state", labels=["purpose", "state"]
        )
        for (purpose, state), n in sorted(counts.items()):
            family.add_metric([purpose, state], n)
        yield family
        durations: dict[str, list[float]] = defaultdict(list)
        board = self.service.federation.board
        with board.cond:
            finished = list(board.jobs.values())
        for job in finished:
            outcome = job.outcome
            if outcome is not None:
                durations[job.purpose].append(sum(outcome.stage_seconds.values()))
        summary = SummaryMetricFamily(
            "spherecal_job_duration_seconds",
            "Duration of finished secure-aggregation jobs",
            labels=["purpose"],
        )
        for purpose, values in sorted(durations.items()):
            summary.add_metric([purpose], len(values), sum(values))
        yield summary

    def _bytes(self) -> Iterator[Any]:
        totals: dict[tuple[str, str], int] = defaultdict(int)
        for stages in self.service.traffic.snapshot().values():
            for stage, counts in stages.items():
                if stage == "total":
                    continue
                totals[("sent", stage)] += counts["sent"]
                totals[("received", stage)] += counts["received"]
        family = CounterMetricFamily(
            "spherecal_payload_bytes", "Payload bytes on the wire", labels=["direction", "stage"]
        )
        for (direction, stage), n in sorted(totals.items()):
            family.add_metric([direction, stage], n)
        yield family


def metrics_registry(service: CoordinatorService) -> CollectorRegistry:
    """The federation collector plus the default process, platform and GC collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FederationCollector(service))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
