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

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.driver.board import Board
from spherecal.coordinator.driver.conduct import Conduct, should_exclude
from spherecal.coordinator.driver.halts import halt_from_env
from spherecal.coordinator.driver.secure_job import Halt, JobOutcome, SecureJob
from spherecal.coordinator.driver.tasks import Task
from spherecal.coordinator.settings import CoordinatorSettings, SecAggSettings
from spherecal.coordinator.state.job_journal import JobJournal, JournaledJob
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.spool import Spool, ordered_sum
from spherecal.coordinator.state.store import Store
from spherecal.coordinator.summary_schema import DriverResults, JobSummary, RoundMetrics
from spherecal.crypto import JobSpec
from spherecal.proto import spherecal_pb2 as pb

__all__ = [
    "Gathered",
    "Progress",
    "Say",
    "StageContext",
    "continue_journaled_job",
    "default_slot",
    "with_first_cause",
]


def default_slot(purpose: str, round_index: int | None) -> str:
    """What a job computes, as the journal finds it again: ``update:r3``, ``ffc``."""
    return purpose if round_index is None else f"{purpose}:r{round_index + 1}"


def with_first_cause(error: str, dropped: dict[str, str]) -> str:
    """``error`` followed by the sites' own reasons for leaving, when any withdrew.

    Why (issues #20, #23): a job that lost its quorum fails with its symptom —
    ``TooFewSurvivors: … only 2 remained`` — while the cause is a site's refusal
    (``p0 withdrew at masked: BAD_INPUT: this site withholds its input to this job:
    it is outside the job's declared bound …``). The reason a round, and then the
    federation, fails with names that first cause. Sites that withdrew at the same
    stage for the same reason are named together, the reason once (every site
    refusing a repeated release says the same sentence; ten copies of it would bury
    the rest of the status).
    ``dropped`` maps a site to ``"stage: why"``."""
    causes: dict[tuple[str, str], list[str]] = {}
    for site, why in dropped.items():
        stage, _, rest = why.partition(": ")
        if rest.startswith("withdrew: "):
            text = rest[len("withdrew: ") :][:240]
            causes.setdefault((stage, text), []).append(site)
    if not causes:
        return error
    return f"{error} — first cause: " + "; ".join(
        f"{', '.join(sites)} withdrew at {stage}: {text}" for (stage, text), sites in causes.items()
    )


def continue_journaled_job(
    record: JournaledJob,
    *,
    settings: SecAggSettings,
    stage_s: float,
    journal: JobJournal,
    halt: Halt | None = None,
    rejoin_s: float = 0.0,
) -> SecureJob:
    """Rebuild a job a previous coordinator process journaled and continue it at the
    stage it reached (or with its journaled result): same spec, same directory."""
    message = pb.SecAggJob.FromString(record.job)
    spec = JobSpec.from_bytes(message.spec)
    directory = list(message.directory)
    job = SecureJob(
        purpose=record.purpose,
        round_index=record.round,
        participants=list(spec.participants),
        identity_keys={e.participant_id: bytes(e.identity_public_key) for e in directory},
        directory=directory,
        settings=settings,
        length=spec.length,
        bound=spec.bound,
        first_stage_s=record.first_stage_s,
        stage_s=stage_s,
        spec=spec,
        journal=journal,
        halt=halt,
        rejoin_s=rejoin_s,
    )
    job.resumed = True
    if record.result is not None:
        r = record.result
        job.outcome = JobOutcome(
            status="done",
            values=r.values,
            contributors=r.contributors,
            dropouts=r.dropouts,
            excluded=r.excluded,
        )
        return job
    job.replay(record)
    journal.resumed(job.job_hex, len(record.entries))
    return job


def _journaled_participants(record: JournaledJob) -> tuple[str, ...]:
    return JobSpec.from_bytes(pb.SecAggJob.FromString(record.job).spec).participants


Say = Callable[[str], None]


@dataclass
class Progress:
    """The run's mutable record; what the summary and the status RPC report."""

    global_vector: npt.NDArray[np.float64]
    completed_rounds: int = 0
    resumed_from: int | None = None
    round_metrics: list[RoundMetrics] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=lambda: {"secagg_stages_s": {}})
    results: DriverResults = field(default_factory=lambda: DriverResults())
    job_summaries: list[JobSummary] = field(default_factory=list)
    peak_secagg_bytes: int = 0
    dp_ridge: dict[str, float] = field(default_factory=dict)
    retries: list[dict[str, Any]] = field(default_factory=list)
    """Every wait between two attempts (``rejoin.RetryRecord``), in order."""
    status_reasons: list[str] = field(default_factory=list)
    """Why the status is not ``completed`` (``verdict.assess``); empty when it is."""


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
        shared_plan: Callable[[], pb.Plan] | None = None,
    ) -> None:
        self.conduct = conduct if conduct is not None else Conduct(store)
        self.shared_plan: Callable[[], pb.Plan] = shared_plan or pb.Plan
        """The plan every member joins under (its per-member index left at 0): part of
        each job's task context (:func:`spherecal.proto.task_context.task_context`)."""
        self.settings = settings
        self.store = store
        self.registry = registry
        self.board = board
        self.spool = spool
        self.progress = progress
        self.say = say
        self.journal = JobJournal(store)
        self.journal.sweep()  # blobs a killed process left without their rows
        self.halt = halt_from_env()
        self._resumable: dict[str, JournaledJob | None] = {}

    # ---------------------------------------------------------------- resuming
    def journaled(self, slot: str) -> JournaledJob | None:
        """The job a previous coordinator process journaled for ``slot`` and did not
        see fail: the driver continues it (same participants, same spec) instead of
        asking the sites for a new release (``state.job_journal``)."""
        if slot not in self._resumable:
            self._resumable[slot] = self.journal.find(slot)
        return self._resumable[slot]

    def task_id(self, slot: str) -> str:
        """The task id of ``slot``'s task: derived from the federation and the slot, so
        that after a restart a site sees the *same* task again (a plaintext release
        is keyed by its task id in the site's release ledger: the same task is the
        same release, admitted again; a new id would be refused as a second one)."""
        federation = self.store.get_meta("federation_id") or ""
        return hashlib.sha256(f"{federation}\x00{slot}".encode()).hexdigest()[:16]

    def resume_participants(self, slot: str, participants: list[str]) -> list[str]:
        """``participants``, or the journaled job's when one is continued."""
        record = self.journaled(slot)
        if record is None:
            return participants
        return list(_journaled_participants(record))

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
        *,
        context: bytes,
        slot: str | None = None,
    ) -> SecureJob:
        """A new job for ``slot`` (default ``purpose:round``) — or, after a restart,
        the journaled one, continued where it stopped.

        ``context``: the digest of the task the job serves
        (:func:`spherecal.proto.task_context.task_context`), written into the spec so
        that every member computes on the same model and inputs; a continued job
        keeps its journaled spec, whose members refuse a task that differs."""
        slot = slot if slot is not None else default_slot(purpose, round_index)
        record = self.journaled(slot)
        if record is not None:
            self._resumable[slot] = None  # continued once; a retry is a new job
            job = continue_journaled_job(
                record,
                settings=self.settings.secagg,
                stage_s=self.settings.timeouts.stage_s,
                journal=self.journal,
                halt=self.halt,
                rejoin_s=self.settings.timeouts.rejoin_grace_s,
            )
            where = (
                "with its journaled result"
                if job.outcome is not None
                else f"at stage {job.stage_name}"
            )
            line = f"{job.label()}: continued after a restart {where} (no new release asked)"
            self.say(line)
            self.store.event("info", line)
            return job
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
            spec_arguments={**(spec_arguments or {}), "context": context},
            journal=self.journal,
            halt=self.halt,
            rejoin_s=self.settings.timeouts.rejoin_grace_s,
            colluders=self.settings.privacy.colluders,
        )
        self.store.job_created(
            job.job_hex, purpose, round_index, ids, job.threshold, length, job.spec_sha256
        )
        # durable before anyone sees the job: a restart continues it
        self.journal.created(
            job_id=job.job_hex,
            slot=slot,
            purpose=purpose,
            round_index=round_index,
            job=job.journal_message(),
            first_stage_s=first_stage_s,
        )
        self.say(
            f"{job.label()}: {len(ids)} participants, threshold {job.threshold}, "
            f"{job.spec.graph} graph, {length} entries, {job.spec.ring_bits}-bit ring, "
            f"scale 2^-{job.spec.scale_bits}"
        )
        return job

    def _await_rejoin(self, job: SecureJob) -> None:
        """A continued job first waits (up to ``[timeouts] rejoin_grace_s``) for its
        participants to reconnect: right after a restart nobody is connected yet, and
        a stage that closed at once would drop them all. A member that left (its
        certificate revoked) cannot come back and is not waited for."""
        wanted = frozenset(job.spec.participants) - self.registry.left().keys()
        grace_end = time.monotonic() + self.settings.timeouts.rejoin_grace_s
        while time.monotonic() < grace_end and self.board.stopping is None:
            missing = wanted - self.registry.alive()
            if not missing:
                break
            self.board.wait(0.2)
        missing = wanted - self.registry.alive()
        if missing:
            self.say(f"{job.label()}: continuing without {sorted(missing)} (not back in time)")
        job.restart_clock()

    def _drop_left(self, job: SecureJob) -> None:
        """A member of ``job`` that left the federation — its certificate was revoked,
        so it cannot come back — withdraws from the job, with why: its stage closes
        without the ``rejoin_grace_s`` a restarting site is waited for
        (``stage_grace``), and the protocol treats it as any dropout of that stage.
        (Until 2026-11-27 each stage waited for it, up to the grace.)"""
        for pid, why in self.registry.left().items():
            if pid in job.spec.participants and pid not in job.withdrawn:
                job.withdraw(pid, f"left the federation: it {why}")

    def drive_job(self, job: SecureJob) -> JobOutcome:
        board, progress = self.board, self.progress
        if job.resumed and job.outcome is None:
            self._await_rejoin(job)
        while job.outcome is None:
            if board.stopping is not None:
                job.abort(f"stopped: {board.stopping}")
                break
            with job.lock:
                progress.peak_secagg_bytes = max(
                    progress.peak_secagg_bytes, job.server.memory_bytes()
                )
            self._drop_left(job)
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
            progress.errors.append(
                with_first_cause(f"{job.label()}: {outcome.error}", outcome.dropped)
            )
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
