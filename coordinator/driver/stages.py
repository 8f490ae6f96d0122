"""What every stage of the driver shares: waiting on a task, driving a secure job,
and the ONE aggregation helper both modes go through.

Why one helper: a round's update, a statistics job and (later) anything else the
participants sum reach the coordinator either as one secure-aggregation job (the
coordinator sees only the masked sum) or, when a deployment turns secure
aggregation off, as plaintext uploads spooled to disk and summed in roster order.
:meth:`StageContext.gather` hides that difference: it returns the summed vector *in
the job's layout* either way, plus who contributed and who was dropped, so a stage
reads its sums from one place and cannot diverge between the modes.

:class:`Progress` is the run's mutable record (global vector, per-round metrics,
errors, timings, results); the summary is rendered from it (``outputs``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.driver.board import Board
from spherecal.coordinator.driver.conduct import Conduct, should_exclude
from spherecal.coordinator.driver.secure_job import JobOutcome, SecureJob
from spherecal.coordinator.driver.tasks import Task
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.spool import Spool, ordered_sum
from spherecal.coordinator.state.store import Store

__all__ = ["Gathered", "Progress", "Say", "StageContext"]

Say = Callable[[str], None]


@dataclass
class Progress:
    """The run's mutable record; what the summary and the status RPC report."""

    global_vector: npt.NDArray[np.float64]
    completed_rounds: int = 0
    resumed_from: int | None = None
    round_metrics: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=lambda: {"secagg_stages_s": {}})
    results: dict[str, Any] = field(default_factory=dict)
    job_summaries: list[dict[str, Any]] = field(default_factory=list)
    peak_secagg_bytes: int = 0
    dp_ridge: dict[str, float] = field(default_factory=dict)
    retries: list[dict[str, Any]] = field(default_factory=list)
    status_reasons: list[str] = field(default_factory=list)
    """Why the status is not ``completed`` (``status.assess``); empty when it is."""
    """Every wait between two attempts (``rejoin.RetryRecord``), in order."""


@dataclass(frozen=True)
class Gathered:
    """A task's sum. ``values`` is None when the aggregation failed (``error``) or fewer
    than the requested minimum contributed (plaintext: nothing was summed)."""

    values: npt.NDArray[np.float64] | None
    contributors: list[str]
    dropped: dict[str, str]
    error: str | None = None
    job: SecureJob | None = None


class StageContext:
    """The services a stage needs; one per federation, shared by every stage."""

    def __init__(
        self,
        *,
        settings: CoordinatorSettings,
        store: Store,
        registry: Registry,
        board: Board,
        spool: Spool,
        progress: Progress,
        say: Say,
        conduct: Conduct | None = None,
    ) -> None:
        self.conduct = conduct if conduct is not None else Conduct(store)
        self.settings = settings
        self.store = store
        self.registry = registry
        self.board = board
        self.spool = spool
        self.progress = progress
        self.say = say

    # ---------------------------------------------------------------- waiting
    def wait_task(self, task: Task, timeout_s: float) -> dict[str, str]:
        """Wait until every live expected participant finished, or the deadline;
        returns who was given up on and why."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.board.check_stop()
            alive = self.registry.alive()
            outstanding = task.outstanding(alive)
            if not outstanding:
                break
            if time.monotonic() >= deadline:
                for p in outstanding:
                    task.withdraw(p, "deadline")
                break
            self.board.wait(0.2)
        dropped: dict[str, str] = {}
        for p in sorted(task.expected):
            if p in task.withdrawn:
                dropped[p] = task.withdrawn[p]
            elif not task.finished(p):
                dropped[p] = "disconnected / heartbeat timeout"
        return dropped

    # ---------------------------------------------------------------- secure jobs
    def new_job(
        self,
        purpose: str,
        round_index: int | None,
        participants: list[str],
        length: int,
        bound: float,
        first_stage_s: float,
        spec_arguments: dict[str, Any] | None = None,
    ) -> SecureJob:
        ids = sorted(participants)
        job = SecureJob(
            purpose=purpose,
            round_index=round_index,
            participants=ids,
            identity_keys=self.registry.identity_keys(ids),
            directory=self.registry.directory(ids),
            settings=self.settings.secagg,
            length=length,
            bound=bound,
            first_stage_s=first_stage_s,
            stage_s=self.settings.timeouts.stage_s,
            spec_arguments=spec_arguments,
        )
        self.store.job_created(
            job.job_hex, purpose, round_index, ids, job.threshold, length, job.spec_sha256
        )
        self.say(
            f"{job.label()}: {len(ids)} participants, threshold {job.threshold}, "
            f"{job.spec.graph} graph, {length} entries, {job.spec.ring_bits}-bit ring, "
            f"scale 2^-{job.spec.scale_bits}"
        )
        return job

    def drive_job(self, job: SecureJob) -> JobOutcome:
        board, progress = self.board, self.progress
        while job.outcome is None:
            if board.stopping is not None:
                job.abort(f"stopped: {board.stopping}")
                break
            with job.lock:
                progress.peak_secagg_bytes = max(
                    progress.peak_secagg_bytes, job.server.memory_bytes()
                )
            lines = job.advance(self.registry.alive())
            for line in lines:
                self.say(line)
                self.store.event("info", line)
            if lines:
                board.notify()
            else:
                board.wait(0.1)
        outcome = job.outcome
        assert outcome is not None
        stages = progress.timings["secagg_stages_s"]
        for stage, seconds in outcome.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
        self.store.job_finished(
            job.job_hex,
            outcome.status,
            contributors=list(outcome.contributors),
            dropouts=list(outcome.dropouts),
            excluded=list(outcome.excluded),
            error=outcome.error,
        )
        progress.job_summaries.append(
            {
                "job_id": job.job_hex,
                "purpose": job.purpose,
                "round": None if job.round is None else job.round + 1,
                "status": outcome.status,
                "participants": list(job.spec.participants),
                "threshold": job.threshold,
                "graph": job.spec.graph,
                "vector_length": job.spec.length,
                "scale_bits": job.spec.scale_bits,
                "ring_bits": job.spec.ring_bits,
                "bound": job.spec.bound,
                "contributors": list(outcome.contributors),
                "dropouts": list(outcome.dropouts),
                "excluded": list(outcome.excluded),
                "dropped": dict(outcome.dropped),
                "stage_seconds": dict(outcome.stage_seconds),
                "error": outcome.error,
            }
        )
        if outcome.status == "failed":
            progress.errors.append(f"{job.label()}: {outcome.error}")
        self.exclude_accused(job)
        return outcome

    def exclude_accused(self, job: SecureJob) -> list[str]:
        """Exclude every dealer a strict majority of its other share holders signed a
        complaint about (``spherecal.coordinator.driver.conduct``); returns the newly excluded."""
        out = []
        for dealer, (complainants, holders) in job.accused().items():
            if not should_exclude(len(complainants), holders):
                line = (
                    f"{job.label()}: {dealer} accused by {len(complainants)} of its "
                    f"{holders} other share holders; not excluded (no majority)"
                )
                self.say(line)
                self.store.event("warning", line)
                continue
            entry = self.conduct.exclude(
                dealer, job=job.job_hex, purpose=job.purpose, complainants=complainants
            )
            if entry is not None:
                self.say(f"EXCLUDED {dealer}: {entry.reason}")
                out.append(dealer)
        return out

    def eligible(self, participants: list[str]) -> list[str]:
        """Who may take part in a new task: ``participants`` minus the excluded."""
        return self.conduct.eligible(participants)

    # ---------------------------------------------------------------- the one sum
    def gather(
        self,
        task: Task,
        *,
        timeout_s: float,
        phase_after: str,
        minimum: int = 1,
    ) -> Gathered:
        """Wait for ``task`` and sum what came back, securely or in plaintext.

        Secure (``task.job`` set): drive the job; the result is its unmasked sum.
        Plaintext: wait for the uploads — the same vector a participant would mask —
        and sum them in roster order (bit-identical to the reference runner's loop,
        see ``spool``). Both modes return the same layout.
        """
        job = task.job
        if job is not None:
            outcome = self.drive_job(job)
            self.board.set_task(None, phase_after)
            if outcome.status != "done":
                return Gathered(
                    None,
                    list(outcome.contributors),
                    dict(outcome.dropped),
                    outcome.error or "secure aggregation failed",
                    job,
                )
            return Gathered(
                np.asarray(outcome.values, dtype=np.float64),
                list(outcome.contributors),
                dict(outcome.dropped),
                None,
                job,
            )
        dropped = self.wait_task(task, timeout_s)
        self.board.set_task(None, phase_after)
        order = sorted(task.uploads, key=self.registry.index_of)
        if len(order) < max(minimum, 1):
            self.spool.discard(task.task_id)
            return Gathered(None, order, dropped)
        total = ordered_sum([task.uploads[p].path for p in order], task.expected_shape[0])
        self.spool.discard(task.task_id)
        return Gathered(total, order, dropped)
