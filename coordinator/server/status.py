"""The operator's live view of a federation: who is connected, which round and stage,
how the completed rounds went, the jobs, the privacy budget spent — never values.

:func:`federation_status` reads the running coordinator's state (registry, driver,
jobs, privacy ledger) into a :class:`pb.FederationStatus`; the same snapshot feeds
``spherecal status`` (through ``GetFederationStatus``) and the Prometheus endpoint
(``spherecal.coordinator.server.metrics``). :func:`authorize_admin` is the check on that RPC: the
status view reveals the roster and the run's progress, so it is for the operator's
certificate (``[admin] allow``), not for every participant; in plaintext loopback
mode (simulation) a loopback caller is the operator.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc

from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Peer, Registry
from spherecal.coordinator.summary_schema import RoundMetrics
from spherecal.proto import spherecal_pb2 as pb

__all__ = ["RefusalCounter", "authorize_admin", "federation_status", "job_statuses"]


class RefusalCounter:
    """Requests the service refused, by gRPC status code (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, code: grpc.StatusCode) -> None:
        with self._lock:
            self._counts[code.name] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _loopback_peer(address: str) -> bool:
    """gRPC peer strings: ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``."""
    if address.startswith("ipv4:"):
        return address[5:].startswith("127.")
    if address.startswith("ipv6:"):
        return address[5:].startswith("[::1]")
    return address.startswith("unix:")


def authorize_admin(settings: CoordinatorSettings, peer: Peer) -> str:
    """Who is asking, if allowed the status view; else PERMISSION_DENIED."""
    if peer.identity is not None:
        if peer.identity in settings.admin.allow:
            return peer.identity
        raise ServiceError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"certificate {peer.identity[:64]!r} is not on the coordinator's [admin] allow list",
        )
    if settings.server.insecure and (peer.address == "" or _loopback_peer(peer.address)):
        return "loopback"
    raise ServiceError(
        grpc.StatusCode.PERMISSION_DENIED,
        "the status view needs an operator certificate on the [admin] allow list",
    )


def job_statuses(federation: Federation) -> list[pb.JobStatus]:
    out = []
    for job in federation.board.all_jobs():
        outcome = job.outcome
        out.append(
            pb.JobStatus(
                job_id=job.job_hex,
                purpose=job.purpose,
                round=-1 if job.round is None else job.round + 1,
                state="running" if outcome is None else outcome.status,
                stage=job.stage_name,
                contributors=list(outcome.contributors) if outcome else [],
                error=(outcome.error or "") if outcome else "",
            )
        )
    return out


def _round_summary(metrics: RoundMetrics) -> pb.RoundSummary:
    summary = pb.RoundSummary(
        round=int(metrics.get("round", 0)),  # already 1-based
        selected=len(metrics.get("selected") or ()),
        contributors=len(metrics.get("contributors") or ()),
        train_loss=float(metrics.get("train_loss") or 0.0),
        seconds=float(metrics.get("seconds") or 0.0),
        dropped=sorted(metrics.get("dropped") or {}),
    )
    if (test := metrics.get("test_accuracy")) is not None:
        summary.test_accuracy = float(test)
    if (federated := metrics.get("federated_accuracy")) is not None:
        summary.federated_accuracy = float(federated)
    return summary


def federation_status(
    settings: CoordinatorSettings,
    registry: Registry,
    federation: Federation,
    refusals: RefusalCounter,
) -> pb.FederationStatus:
    """A consistent-enough snapshot (each part read under its own lock)."""
    now_wall, now = time.time(), time.monotonic()
    alive = registry.alive(now)
    board = federation.board
    with board.cond:
        task = board.task
        phase = board.phase
        done = board.done
        told = set(board.done_delivered)
    # final numbers only once ended: the driver fills ``results`` as it goes
    accuracy = federation.progress.results.get("accuracy") if done else None
    reasons = list(federation.progress.status_reasons) if done else []
    roster = [
        pb.RosterEntry(
            participant_id=m.participant_id,
            index=m.index,
            joined=m.session is not None,
            connected=m.participant_id in alive,
            seconds_since_seen=(
                0.0 if m.presence > 0 else (now_wall - m.last_contact if m.last_contact else -1.0)
            ),
            joins=m.joins,
            told_done=m.participant_id in told,
            left=m.left,
        )
        for m in registry.members()
    ]
    metrics = list(federation.round_metrics)
    errors = list(federation.errors)
    warnings = list(federation.warnings)
    job = task.job if task is not None else None
    training = phase.startswith("round ") and done is None
    status = pb.FederationStatus(
        federation_id=federation.federation_id,
        name=settings.name,
        status=done[0] if done else "running",
        phase=phase,
        rounds=settings.training.rounds,
        completed_rounds=federation.completed_rounds,
        current_round=federation.completed_rounds + 1 if training else 0,
        task=task.kind if task is not None else "",
        stage=job.stage_name if job is not None else "",
        job_id=job.job_hex if job is not None else "",
        roster=roster,
        accuracy=[
            pb.MethodAccuracy(method=method, accuracy=float(value))
            for method, value in (accuracy or {}).items()
            if value is not None
        ],
        status_reasons=reasons,
        completed=[_round_summary(m) for m in metrics],
        jobs=job_statuses(federation),
        privacy_enabled=federation.privacy is not None,
        refusals=sum(refusals.snapshot().values()),
        warnings=warnings,
        errors=errors,
        uptime_s=now - federation.started_monotonic,
    )
    if federation.privacy is not None:
        totals = federation.privacy.summary()["totals"]
        status.epsilon.append(
            pb.EpsilonSpent(subject="federation", epsilon=float(totals["federation"]))
        )
        for subject, epsilon in totals["participants"].items():
            status.epsilon.append(pb.EpsilonSpent(subject=subject, epsilon=float(epsilon)))
    return status
