"""The coordinator's Prometheus endpoint (``[metrics] listen``; off by default).

A custom collector reads the live state at scrape time — the same snapshot as the
status view (``spherecal.coordinator.server.status``) plus the byte accounting — so the driver
carries
no instrumentation and a scrape can never disagree with ``spherecal status``.
Metadata only: counts, durations, bytes, ε; never statistics, updates or keys.

Metrics (all prefixed ``spherecal_``):

- ``participants`` {state=roster|joined|connected}
- ``round_current``, ``rounds_completed``, ``rounds_total``
- ``phase_info`` {phase, task, stage} = 1
- ``secagg_stage`` {stage} = 1 for the current job's stage
- ``jobs`` {purpose, state}: how many jobs ended in each state
- ``job_duration_seconds`` {purpose}: summary (count, sum) over finished jobs
- ``round_duration_seconds``: summary over completed rounds
- ``bytes_total`` {direction=sent|received, stage}: payload bytes on the wire
- ``refusals_total`` {code}: refused requests by gRPC status code
- ``epsilon_spent`` {subject}: (ε, δ)-DP budget spent (with ``[privacy]`` on)
- ``uptime_seconds``

Plain HTTP: a non-loopback ``listen`` is refused unless ``allow_remote`` (then put
it behind the network's access controls).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.server.status import federation_status
from spherecal.proto.address import is_loopback, split_host_port

__all__ = ["MetricsServer", "start_metrics"]


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
            ("spherecal_rounds_total", st.rounds, "Configured training rounds"),
            ("spherecal_uptime_seconds", st.uptime_s, "Seconds since the coordinator started"),
        ):
            yield GaugeMetricFamily(name, text, value=value)
        phase = GaugeMetricFamily(
            "spherecal_phase_info", "Current phase", labels=["phase", "task", "stage", "status"]
        )
        phase.add_metric([st.phase, st.task, st.stage, st.status], 1)
        yield phase
        stage = GaugeMetricFamily(
            "spherecal_secagg_stage", "Stage of the running secure job", labels=["stage"]
        )
        if st.stage:
            stage.add_metric([st.stage], 1)
        yield stage
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
            "spherecal_bytes", "Payload bytes on the wire", labels=["direction", "stage"]
        )
        for (direction, stage), n in sorted(totals.items()):
            family.add_metric([direction, stage], n)
        yield family


class MetricsServer:
    """A running ``/metrics`` endpoint; ``close()`` stops it."""

    def __init__(self, server: Any, thread: threading.Thread, port: int) -> None:
        self._server = server
        self._thread = thread
        self.port = port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics(service: CoordinatorService) -> MetricsServer | None:
    """Serve ``/metrics`` when ``[metrics] listen`` is set; None otherwise."""
    m = service.settings.metrics
    if m.listen is None:
        return None
    host, port = split_host_port(m.listen)
    if not is_loopback(host) and not m.allow_remote:
        raise ValueError(
            f"[metrics] listen = {m.listen!r} is not a loopback address; the endpoint is "
            "plain HTTP, so set [metrics] allow_remote = true to expose it deliberately"
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FederationCollector(service))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ValueError(
            f"[metrics] listen = {m.listen!r}: cannot listen ({exc.strerror})"
        ) from None
    return MetricsServer(server, thread, int(server.server_address[1]))
