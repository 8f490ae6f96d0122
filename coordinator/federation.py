"""The federation: a linear driver (rounds → statistics → calibration → evaluation)
plus the shared state the RPC handlers read to answer "what do I do next?".

Why a linear driver: the reference runner is a loop, and the service must reproduce
it. Writing the coordinator as the same loop — publish a task, wait (with deadlines
and liveness) until the participants are done, aggregate, step — keeps the
correspondence obvious; concurrency lives only at the edges (RPC handlers feed
results in under locks, the driver waits on a condition variable).

Round ``r`` (0-based) reproduces ``spherefed.runner.run_reference``:

* participants ``select_participants(config, r)`` of the roster (index = roster
  position), each training with seed ``derive_seed(seed, "train", r, k)``;
* ``Σ_k n_k Δ_k`` and ``Σ_k n_k`` from plaintext uploads summed in roster order, or
  from one secure-aggregation job over ``[n_k Δ_k, n_k, mean_loss_k]``;
* the strategy's server step (FedAvg/FedProx: ``θ + Σ n_k Δ_k / Σ n_k``;
  FedAdam/FedYogi: a server optimiser on that average);
* a checkpoint of the new global vector, committed before the next round starts, so
  a killed coordinator resumes from the last completed round.

After training: one statistics job per configured kind (CCVR implies FFC by default,
as in the reference runner), FFC / CCVR solved on the aggregate, then a final
federated evaluation of the model without calibration and with each calibrated
classifier (and a central one when the coordinator has test data).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

import crypto
from proto import spherecal_pb2 as pb
from proto.codec import header_for
from spherefed.fl import derive_seed
from spherefed.privacy.plan import CalibrationPlan
from spherefed.runner import ReferenceConfig, select_participants
from spherefed.stats import CCVRStatistics, FFCStatistics, ccvr_layout_size, ffc_layout_size

from .calibration import ccvr_classifier, ffc_classifier, unpack_statistics
from .evaluation import CentralEvaluator
from .model import Checkpoints, GlobalModel, file_sha256
from .privacy import CoordinatorPrivacy
from .registry import Member, Registry
from .secure_job import JobOutcome, SecureJob, guaranteed_inputs
from .settings import CoordinatorSettings
from .spool import Spool, ordered_sum
from .store import Store
from .strategy import Strategy, make_strategy
from .tasks import EvaluationResult, Task

__all__ = ["Federation", "FederationFailed"]

Say = Callable[[str], None]


class FederationFailed(RuntimeError):
    """The federation cannot continue (e.g. a round failed every attempt)."""


@dataclass(frozen=True)
class _Published:
    header: pb.TensorHeader
    array: npt.NDArray[np.float64]


class Federation:
    """Shared state + the driver thread's program."""

    def __init__(
        self,
        settings: CoordinatorSettings,
        store: Store,
        registry: Registry,
        *,
        say: Say,
        model: GlobalModel | None = None,
        evaluator: CentralEvaluator | None = None,
        strategy: Strategy | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.registry = registry
        self.say = say
        self.model = model if model is not None else GlobalModel(settings.model.spec(settings.seed))
        self.evaluator = evaluator
        self.strategy = strategy if strategy is not None else make_strategy(settings.training)
        self.spool = Spool(settings.state_dir / "spool")
        self.checkpoints = Checkpoints(settings.state_dir / "checkpoints")
        self.cond = threading.Condition()
        self.phase = "starting"
        self.task: Task | None = None
        self._past_tasks: dict[str, str] = {}
        self.jobs: dict[str, SecureJob] = {}
        self.job_summaries: list[dict[str, Any]] = []
        self.tensors: dict[str, _Published] = {}
        self.global_vector = self.model.initial_vector.copy()
        self.completed_rounds = 0
        self.resumed_from: int | None = None
        self.round_metrics: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.timings: dict[str, Any] = {"secagg_stages_s": {}}
        self.results: dict[str, Any] = {}
        self.done: tuple[str, str] | None = None
        self.done_delivered: set[str] = set()
        self.federation_id = ""
        self._reference = ReferenceConfig(
            participants=len(settings.participants),
            sample_fraction=settings.training.sample_fraction,
            seed=settings.seed,
        )
        self._started = time.monotonic()
        self.started_monotonic = self._started
        self._prepared = False
        self.peak_secagg_bytes = 0
        self._stopping: str | None = None
        self.privacy: CoordinatorPrivacy | None = (
            CoordinatorPrivacy(settings.privacy, store.path) if settings.privacy.enabled else None
        )
        self._dp_ridge: dict[str, float] = {}

    # ================================================================ shared state
    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def stop(self, reason: str) -> None:
        """Ask the driver to end the federation now (SIGTERM, tests); it fails the
        current stage, records ``reason`` and tells participants it is over."""
        with self.cond:
            self._stopping = reason
            self.cond.notify_all()

    def _check_stop(self) -> None:
        if self._stopping is not None:
            raise FederationFailed(f"stopped: {self._stopping}")

    def plan_for(self, member: Member) -> pb.Plan:
        s = self.settings
        spec = self.model.spec
        h, w = s.model.image_size
        plan = self.strategy.local_plan(0)
        return pb.Plan(
            federation_id=self.federation_id,
            model=pb.ModelSpec(
                extractor=spec.extractor,
                head=spec.head,
                norm=spec.norm,
                classifier=spec.classifier,
                classifier_seed=spec.classifier_seed,
                init_seed=spec.init_seed,
                num_classes=spec.num_classes,
                in_channels=spec.in_channels,
                image_height=h,
                image_width=w,
                feature_dim=spec.feature_dim or 0,
            ),
            training=pb.LocalTraining(
                epochs=plan.epochs,
                batch_size=plan.batch_size,
                lr=plan.lr,
                momentum=plan.momentum,
                weight_decay=plan.weight_decay,
                loss=plan.loss,
                prox_mu=plan.prox_mu,
            ),
            rounds=s.training.rounds,
            heartbeat_interval_ms=int(s.timeouts.heartbeat_interval_s * 1000),
            secure_updates=s.secagg.updates,
            secure_statistics=s.secagg.statistics,
            calibration=list(s.calibration.methods),
            participant_index=member.index,
            num_participants=len(s.participants),
            max_chunk_bytes=s.server.max_chunk_bytes,
        )

    def instruction_for(self, member: Member) -> pb.Instruction:
        pid = member.participant_id
        with self.cond:
            if self.done is not None:
                self.done_delivered.add(pid)
                status, message = self.done
                return pb.Instruction(done=pb.Done(status=status, message=message))
            task = self.task
            phase = self.phase
        if task is not None and member.session is not None:
            instruction = task.instruction_for(pid, member.session)
            if instruction is not None:
                return instruction
            if task.job is not None and pid in task.expected:
                step = task.job.step_for(pid)
                if step is not None:
                    return pb.Instruction(task_id=task.task_id, secagg=step)
        return pb.Instruction(wait=pb.Wait(retry_after_ms=200, reason=phase))

    def wait_instruction(self, member: Member, timeout_s: float) -> pb.Instruction:
        """Long poll: the next non-Wait instruction, or Wait after ``timeout_s``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            instruction = self.instruction_for(member)
            remaining = deadline - time.monotonic()
            if not instruction.HasField("wait") or remaining <= 0:
                return instruction
            with self.cond:
                self.cond.wait(min(remaining, 0.5))

    def tensor(self, name: str) -> _Published | None:
        with self.cond:
            return self.tensors.get(name)

    def current_task(self, task_id: str) -> Task | str:
        """The current task with that id, or why there is none ("over"/"unknown")."""
        with self.cond:
            if self.task is not None and self.task.task_id == task_id:
                return self.task
            return "over" if task_id in self._past_tasks else "unknown"

    def job(self, job_id: bytes) -> SecureJob | None:
        with self.cond:
            return self.jobs.get(bytes(job_id).hex())

    def _publish(self, name: str, array: npt.NDArray[np.float64]) -> pb.TensorRef:
        frozen = np.ascontiguousarray(array, dtype=np.float64).copy()
        frozen.setflags(write=False)
        header = header_for(frozen)
        with self.cond:
            self.tensors[name] = _Published(header, frozen)
        return pb.TensorRef(name=name, header=header)

    def _set_task(self, task: Task | None, phase: str) -> None:
        with self.cond:
            if self.task is not None:
                self._past_tasks[self.task.task_id] = self.task.kind
            self.task = task
            self.phase = phase
            if task is not None and task.job is not None:
                self.jobs[task.job.job_hex] = task.job
            self.cond.notify_all()

    # ================================================================ driver
    def run(self) -> None:
        """The whole federation; never raises for federation-level failures (they
        are recorded and announced with ``Done(status="failed")``)."""
        try:
            self.prepare()
            self._await_participants()
            t0 = time.monotonic()
            for r in range(self.completed_rounds, self.settings.training.rounds):
                self._run_round(r)
            self.timings["train_s"] = time.monotonic() - t0
            aggregates = self._statistics()
            heads = self._calibrate(aggregates)
            self._final_evaluation(heads)
            self._save_outputs(heads)
            self._finish("completed", "federation completed")
        except FederationFailed as exc:
            self.errors.append(str(exc))
            self.say(f"FAILED: {exc}")
            self.store.event("error", str(exc))
            self._finish("failed", str(exc))
        finally:
            self.timings["total_s"] = time.monotonic() - self._started

    def _finish(self, status: str, message: str) -> None:
        self._set_task(None, status)
        with self.cond:
            self.done = (status, message)
            self.cond.notify_all()
        self.store.set_meta("status", status)
        self.store.event("info", f"federation {status}: {message}")

    def linger(self) -> None:
        """After the end: keep answering until every live participant was told Done."""
        deadline = time.monotonic() + self.settings.timeouts.linger_s
        while time.monotonic() < deadline and self._stopping is None:
            alive = self.registry.alive()
            with self.cond:
                if alive <= self.done_delivered:
                    return
                self.cond.wait(0.2)

    # ---------------------------------------------------------------- setup / resume
    def prepare(self) -> None:
        """Open or resume the federation's state (idempotent). Call before serving, so
        that joining participants already get the federation id and plan."""
        if self._prepared:
            return
        self._setup()
        self._prepared = True

    def _setup(self) -> None:
        fingerprint = self.settings.fingerprint()
        stored = self.store.get_meta("fingerprint")
        if stored is not None and stored != fingerprint:
            raise FederationFailed(
                f"state directory {self.settings.state_dir} belongs to a federation with "
                "different settings (participants, seed, model or training); refusing to "
                "resume it — use a fresh state_dir"
            )
        if stored is None:
            self.store.set_meta("fingerprint", fingerprint)
            self.store.set_meta("federation_id", secrets.token_hex(8))
        self.federation_id = self.store.get_meta("federation_id") or ""
        # What `spherecal audit` checks against (the audit reads only the database).
        self.store.set_meta("secagg_min_participants", str(self.settings.secagg.min_participants))
        self.store.set_meta("privacy", json.dumps(asdict(self.settings.privacy), sort_keys=True))
        records = self.store.completed_rounds()
        if [r.round for r in records] != list(range(len(records))):
            raise FederationFailed("the database's completed rounds are not contiguous")
        if records:
            last = records[-1]
            if last.checkpoint_path is None or last.checkpoint_sha256 is None:
                raise FederationFailed(f"round {last.round + 1} has no checkpoint recorded")
            try:
                vector, strategy_state = Checkpoints.load_with_state(
                    last.checkpoint_path, last.checkpoint_sha256, self.model.length
                )
                self.strategy.load_state_dict(strategy_state)
            except (OSError, ValueError) as exc:
                raise FederationFailed(f"cannot resume: {exc}") from None
            self.global_vector = vector.copy()
            self.completed_rounds = len(records)
            self.resumed_from = len(records)
            self.round_metrics = [r.metrics for r in records]
            self.say(
                f"resuming federation {self.federation_id} after round {len(records)} "
                f"(checkpoint {last.checkpoint_path})"
            )
            self.store.event("info", f"resumed after round {len(records)}")
        else:
            self.say(
                f"federation {self.federation_id}: {len(self.settings.participants)} "
                f"participants, {self.settings.training.rounds} rounds, "
                f"secure updates {'on' if self.settings.secagg.updates else 'off'}, "
                f"secure statistics {'on' if self.settings.secagg.statistics else 'off'}"
            )

    def _await_participants(self) -> None:
        self._set_task(None, "waiting for participants")
        roster = set(self.settings.participants)
        deadline = time.monotonic() + self.settings.timeouts.join_s
        needed = max(self.settings.training.min_participants, 2 if self.settings.secure else 1)
        while True:
            self._check_stop()
            joined = self.registry.joined()
            if joined >= roster:
                break
            if time.monotonic() >= deadline:
                if len(joined) >= needed:
                    missing = sorted(roster - joined)
                    warning = (
                        f"join window of {self.settings.timeouts.join_s:.0f}s expired: "
                        f"continuing with {len(joined)} of {len(roster)} participants, "
                        f"without {missing}"
                    )
                    self.warnings.append(warning)
                    self.say(f"WARNING: {warning}")
                    self.store.event("warning", warning)
                    break
                raise FederationFailed(
                    f"only {len(joined)} of {len(roster)} participants joined within "
                    f"{self.settings.timeouts.join_s:.0f}s (need {needed})"
                )
            with self.cond:
                self.cond.wait(0.2)
        self.say(f"{len(self.registry.joined())}/{len(roster)} participants joined")

    # ---------------------------------------------------------------- waiting helpers
    def _wait_task(self, task: Task, timeout_s: float) -> dict[str, str]:
        """Wait until every live expected participant finished, or the deadline;
        returns who was given up on and why."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_stop()
            alive = self.registry.alive()
            outstanding = task.outstanding(alive)
            if not outstanding:
                break
            if time.monotonic() >= deadline:
                for p in outstanding:
                    task.withdraw(p, "deadline")
                break
            with self.cond:
                self.cond.wait(0.2)
        dropped: dict[str, str] = {}
        for p in sorted(task.expected):
            if p in task.withdrawn:
                dropped[p] = task.withdrawn[p]
            elif not task.finished(p):
                dropped[p] = "disconnected / heartbeat timeout"
        return dropped

    def _drive_job(self, job: SecureJob) -> JobOutcome:
        while job.outcome is None:
            if self._stopping is not None:
                job.abort(f"stopped: {self._stopping}")
                break
            with job.lock:
                self.peak_secagg_bytes = max(self.peak_secagg_bytes, job.server.memory_bytes())
            lines = job.advance(self.registry.alive())
            for line in lines:
                self.say(line)
                self.store.event("info", line)
            if lines:
                self.notify()
            else:
                with self.cond:
                    self.cond.wait(0.1)
        outcome = job.outcome
        assert outcome is not None
        stages = self.timings["secagg_stages_s"]
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
        self.job_summaries.append(
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
            self.errors.append(f"{job.label()}: {outcome.error}")
        return outcome

    def _new_job(
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
            f"{job.spec.graph} graph, {length} entries, scale 2^-{job.spec.scale_bits}"
        )
        return job

    # ---------------------------------------------------------------- rounds
    def _run_round(self, r: int) -> None:
        s = self.settings
        last_error = ""
        for attempt in range(1, s.training.max_round_attempts + 1):
            self._check_stop()
            outcome = self._attempt_round(r, attempt)
            if outcome is None:
                return
            last_error = outcome
            self.say(f"round {r + 1} attempt {attempt} failed: {outcome}")
            self.store.event("warning", f"round {r + 1} attempt {attempt} failed: {outcome}")
            self.store.round_finished(r, "failed", {"error": outcome, "attempt": attempt})
            time.sleep(min(2.0, s.timeouts.heartbeat_interval_s))
        raise FederationFailed(
            f"round {r + 1} failed {s.training.max_round_attempts} times; last: {last_error}"
        )

    def _attempt_round(self, r: int, attempt: int) -> str | None:
        """One attempt at round ``r``; returns None on success, else the reason."""
        s = self.settings
        t0 = time.monotonic()
        self.store.round_started(r, attempt)
        roster = s.participants
        selected = [roster[k] for k in select_participants(self._reference, r)]
        alive = self.registry.alive()
        candidates = [p for p in selected if p in alive]
        dropped = {p: "not connected at round start" for p in selected if p not in alive}
        if len(candidates) < s.training.min_participants:
            return (
                f"only {len(candidates)} of the {len(selected)} selected participants are "
                f"connected (minimum {s.training.min_participants})"
            )
        ref = self._publish(f"global-r{r}", self.global_vector)
        length = self.model.length
        job: SecureJob | None = None
        if s.secagg.updates:
            try:
                job = self._new_job(
                    "update",
                    r,
                    candidates,
                    length + 2,
                    s.secagg.update_bound,
                    s.timeouts.round_s,
                )
            except (crypto.SecAggError, ValueError) as exc:
                return f"cannot create the secure job: {exc}"
        instructions = {
            p: pb.Instruction(
                train=pb.TrainTask(
                    round=r,
                    model=ref,
                    seed=derive_seed(s.seed, "train", r, self.registry.index_of(p)),
                    secure=job.job_message() if job is not None else None,
                )
            )
            for p in candidates
        }
        task = Task(
            kind="train",
            expected=frozenset(candidates),
            instructions=instructions,
            round=r,
            purpose="update",
            job=job,
            expected_shape=(length,),
        )
        self._set_task(task, f"round {r + 1}/{s.training.rounds}: training")
        self.say(
            f"round {r + 1}/{s.training.rounds}: training on {len(candidates)} participants"
            + (f" (not connected: {sorted(dropped)})" if dropped else "")
        )
        if job is not None:
            outcome = self._drive_job(job)
            dropped.update(outcome.dropped)
            if outcome.status != "done":
                self._set_task(None, f"round {r + 1}: failed")
                return outcome.error or "secure aggregation failed"
            values = np.asarray(outcome.values, dtype=np.float64)
            contributors = list(outcome.contributors)
            if len(contributors) < s.training.min_participants:
                return f"only {len(contributors)} updates (minimum {s.training.min_participants})"
            delta_sum = values[:length].copy()
            weight_sum = float(values[length])
            train_loss = float(values[length + 1]) / max(len(contributors), 1)
        else:
            dropped.update(self._wait_task(task, s.timeouts.round_s))
            self._set_task(None, f"round {r + 1}: aggregating")
            order = sorted(task.uploads, key=self.registry.index_of)
            contributors = order
            if len(order) < s.training.min_participants:
                self.spool.discard(task.task_id)
                return f"only {len(order)} updates (minimum {s.training.min_participants})"
            uploads = [task.uploads[p] for p in order]
            delta_sum = ordered_sum([u.path for u in uploads], length)
            weight_sum = float(sum(int(u.num_samples) for u in uploads))
            train_loss = float(np.mean([u.mean_loss for u in uploads]))
            self.spool.discard(task.task_id)
        self._set_task(None, f"round {r + 1}: aggregating")
        if weight_sum <= 0:
            return "the round's updates carry no samples (weight sum 0)"
        self.global_vector = self.strategy.aggregate(self.global_vector, delta_sum, weight_sum)
        with self.cond:
            self.tensors.pop(f"global-r{r}", None)
        metrics: dict[str, Any] = {
            "round": r + 1,
            "attempt": attempt,
            "selected": selected,
            "contributors": sorted(contributors, key=self.registry.index_of),
            "dropped": dropped,
            "train_loss": train_loss,
            "test_accuracy": None,
            "federated_accuracy": None,
            "secure_job": job.job_hex if job is not None else None,
        }
        if self.evaluator is not None:
            metrics["test_accuracy"] = self.evaluator.accuracy(self.global_vector)
        every = s.evaluation.federated_every
        if every > 0 and (r + 1) % every == 0:
            fed = self._federated_evaluation({}, round_index=r)
            metrics["federated_accuracy"] = fed["accuracy"].get("none")
        metrics["seconds"] = time.monotonic() - t0
        checkpoint = self.checkpoints.save(r, self.global_vector, self.strategy.state_dict())
        self.store.round_finished(r, "completed", metrics, checkpoint)
        self.round_metrics.append(metrics)
        self.completed_rounds = r + 1
        acc = metrics["test_accuracy"]
        self.say(
            f"round {r + 1}/{s.training.rounds}: {len(contributors)} updates, loss "
            f"{train_loss:.4f}"
            + (f", test acc {acc:.4f}" if acc is not None else "")
            + (f", dropped {dropped}" if dropped else "")
            + f" ({metrics['seconds']:.1f}s)"
        )
        return None

    # ---------------------------------------------------------------- statistics
    def _statistics(self) -> dict[str, FFCStatistics | CCVRStatistics]:
        s = self.settings
        out: dict[str, FFCStatistics | CCVRStatistics] = {}
        final = self._publish("final", self.global_vector)
        dim, classes = self.model.feature_dim, self.model.num_classes
        for kind in s.calibration.jobs:
            t0 = time.monotonic()
            length = (
                ffc_layout_size(dim, classes) if kind == "ffc" else ccvr_layout_size(dim, classes)
            )
            participants = sorted(self.registry.alive(), key=self.registry.index_of)
            job: SecureJob | None = None
            plan: CalibrationPlan | None = None
            if s.secagg.statistics:
                try:
                    if self.privacy is not None:
                        n = len(participants)
                        plan = self.privacy.plan(
                            kind,
                            dim=dim,
                            num_classes=classes,
                            n=n,
                            t=guaranteed_inputs(s.secagg, n),
                        )
                    job = self._new_job(
                        kind,
                        None,
                        participants,
                        length,
                        s.secagg.statistics_bound,
                        s.timeouts.round_s,
                        spec_arguments=plan.job_spec_arguments() if plan is not None else None,
                    )
                except (crypto.SecAggError, ValueError) as exc:
                    self._record_statistics_failure(kind, f"cannot create the job: {exc}")
                    continue
            code = pb.FFC if kind == "ffc" else pb.CCVR
            task = Task(
                kind="statistics",
                expected=frozenset(participants),
                instructions={
                    p: pb.Instruction(
                        statistics=pb.StatisticsTask(
                            kind=code,
                            model=final,
                            secure=job.job_message() if job is not None else None,
                            privacy=(
                                self.privacy.release_message(plan)
                                if self.privacy is not None and plan is not None
                                else None
                            ),
                        )
                    )
                    for p in participants
                },
                purpose=kind,
                job=job,
                expected_shape=(length,),
            )
            self._set_task(task, f"statistics: {kind}")
            self.say(f"statistics {kind}: {len(participants)} participants, {length} entries")
            if job is not None:
                outcome = self._drive_job(job)
                self._set_task(None, f"statistics: {kind} done")
                if self.privacy is not None:
                    for line in self.privacy.note_refusals(job.job_hex, kind, outcome.dropped):
                        self.say(line)
                        self.store.event("warning", line)
                if outcome.status != "done":
                    self._record_statistics_failure(kind, outcome.error or "failed")
                    continue
                vector = np.asarray(outcome.values, dtype=np.float64)
                contributors = list(outcome.contributors)
                if self.privacy is not None and plan is not None:
                    release = self.privacy.record(job.job_hex, plan, contributors)
                    self.store.dp_release(job.job_hex, kind, plan.to_json(), contributors, release)
                    sigma = float(release["stddev_real_units"])
                    self._dp_ridge[kind] = self.privacy.ridge(plan, sigma)
                    if kind == "ccvr":
                        self._dp_ridge["ffc-from-ccvr"] = self.privacy.ridge(
                            plan, sigma, summed_blocks=classes
                        )
                    self.say(
                        f"{kind} DP release: {plan.mechanism}, ε = {release['epsilon']:.4g} "
                        f"at δ = {plan.delta:g} with {len(contributors)} contributors"
                    )
            else:
                dropped = self._wait_task(task, s.timeouts.round_s)
                self._set_task(None, f"statistics: {kind} done")
                order = sorted(task.uploads, key=self.registry.index_of)
                contributors = order
                if not order:
                    self._record_statistics_failure(kind, "no participant uploaded statistics")
                    continue
                vector = ordered_sum([task.uploads[p].path for p in order], length)
                self.spool.discard(task.task_id)
                self.job_summaries.append(
                    {
                        "job_id": None,
                        "purpose": kind,
                        "round": None,
                        "status": "done",
                        "participants": participants,
                        "contributors": order,
                        "dropped": dropped,
                        "secure": False,
                        "vector_length": length,
                    }
                )
            if s.calibration.save_statistics:
                target = s.out_dir / f"statistics_{kind}.npz"
                s.out_dir.mkdir(parents=True, exist_ok=True)
                np.savez(target, vector=vector, dim=dim, num_classes=classes)
                self.results.setdefault("saved_statistics", {})[kind] = str(target)
            stats = unpack_statistics(kind, vector, dim, classes, isometric=plan is not None)
            out[kind] = stats
            self.timings[f"statistics_{kind}_s"] = time.monotonic() - t0
            samples = (
                float(np.sum(stats.counts)) if isinstance(stats, CCVRStatistics) else stats.count
            )
            self.results.setdefault("statistics", {})[kind] = {
                "contributors": sorted(contributors, key=self.registry.index_of),
                "samples": samples,
            }
        return out

    def _record_statistics_failure(self, kind: str, error: str) -> None:
        message = f"{kind} statistics failed: {error}"
        if message not in self.errors:
            self.errors.append(message)
        self.say(message)
        self.store.event("error", message)

    # ---------------------------------------------------------------- calibration
    def _calibrate(
        self, aggregates: dict[str, FFCStatistics | CCVRStatistics]
    ) -> dict[str, npt.NDArray[np.float64]]:
        s = self.settings
        self._set_task(None, "calibrating")
        heads: dict[str, npt.NDArray[np.float64]] = {}
        ccvr = aggregates.get("ccvr")
        ffc = aggregates.get("ffc")
        if "ffc" in s.calibration.methods:
            source = (
                ffc
                if ffc is not None
                else (ccvr.to_ffc() if isinstance(ccvr, CCVRStatistics) else None)
            )
            if isinstance(source, FFCStatistics):
                t0 = time.monotonic()
                try:
                    ridge = s.calibration.ffc_ridge
                    dp_ridge = self._dp_ridge.get("ffc" if ffc is not None else "ffc-from-ccvr")
                    if dp_ridge is not None and dp_ridge > ridge:
                        self.say(f"ffc: ridge {dp_ridge:.4g} (≈ 2√l·σ of the DP noise)")
                        ridge = dp_ridge
                    self.results.setdefault("ffc_ridge", ridge)
                    heads["ffc"], notes = ffc_classifier(source, ridge)
                    for note in notes:
                        self.say(f"ffc: {note}")
                except ValueError as exc:
                    self._record_statistics_failure("ffc", f"solve failed: {exc}")
                self.timings["ffc_s"] = time.monotonic() - t0
        if "ccvr" in s.calibration.methods and isinstance(ccvr, CCVRStatistics):
            t0 = time.monotonic()
            try:
                init = self.model.head_weight(self.global_vector)
                heads["ccvr"], notes = ccvr_classifier(ccvr, init, s.calibration.ccvr, s.seed)
                for note in notes:
                    self.say(f"ccvr: {note}")
                self.results["ccvr"] = {
                    "empty_classes": [int(c) for c in np.flatnonzero(ccvr.counts == 0)],
                    "singleton_classes": [int(c) for c in np.flatnonzero(ccvr.counts == 1)],
                }
            except (ValueError, FloatingPointError) as exc:
                self._record_statistics_failure("ccvr", f"calibration failed: {exc}")
            self.timings["ccvr_s"] = time.monotonic() - t0
        return heads

    # ---------------------------------------------------------------- evaluation
    def _federated_evaluation(
        self, heads: dict[str, npt.NDArray[np.float64]], round_index: int | None
    ) -> dict[str, Any]:
        s = self.settings
        model_name = "final" if round_index is None else f"eval-r{round_index}"
        model_ref = self._publish(model_name, self.global_vector)
        refs = [
            pb.NamedTensorRef(name=name, tensor=self._publish(f"head-{name}", weight))
            for name, weight in heads.items()
        ]
        participants = sorted(self.registry.alive(), key=self.registry.index_of)
        task = Task(
            kind="evaluate",
            expected=frozenset(participants),
            instructions={
                p: pb.Instruction(
                    evaluate=pb.EvaluateTask(
                        model=model_ref,
                        heads=refs,
                        round=-1 if round_index is None else round_index,
                    )
                )
                for p in participants
            },
            round=round_index,
            purpose="evaluate",
            heads=("none", *heads),
        )
        self._set_task(task, "evaluating")
        dropped = self._wait_task(task, s.timeouts.evaluation_s)
        self._set_task(None, "evaluated")
        with self.cond:
            if round_index is not None:
                self.tensors.pop(model_name, None)
        results: list[EvaluationResult] = [task.evaluations[p] for p in sorted(task.evaluations)]
        total = sum(r.total for r in results)
        accuracy: dict[str, float | None] = {}
        for name in task.heads:
            correct = sum(r.correct.get(name, 0) for r in results)
            accuracy[name] = correct / total if total else None
        return {
            "accuracy": accuracy,
            "participants": sorted(task.evaluations, key=self.registry.index_of),
            "samples": total,
            "dropped": dropped,
        }

    def _final_evaluation(self, heads: dict[str, npt.NDArray[np.float64]]) -> None:
        t0 = time.monotonic()
        fed = self._federated_evaluation(heads, round_index=None)
        acc = {name: fed["accuracy"].get(name) for name in ("none", "ffc", "ccvr")}
        self.results["accuracy"] = acc
        self.results["federated_evaluation"] = fed
        if self.evaluator is not None:
            central: dict[str, float | None] = {
                "none": self.evaluator.accuracy(self.global_vector),
                "ffc": None,
                "ccvr": None,
            }
            for name, weight in heads.items():
                central[name] = self.evaluator.accuracy(self.global_vector, weight)
            self.results["central_accuracy"] = central
            self.results["central_test_samples"] = self.evaluator.size
        else:
            self.results["central_accuracy"] = None
        self.timings["evaluate_s"] = time.monotonic() - t0
        shown = ", ".join(f"{k} {v:.4f}" for k, v in acc.items() if v is not None)
        self.say(
            f"federated accuracy ({fed['samples']} test samples on "
            f"{len(fed['participants'])} participants): {shown}"
        )

    # ---------------------------------------------------------------- outputs
    def _save_outputs(self, heads: dict[str, npt.NDArray[np.float64]]) -> None:
        out = self.settings.out_dir
        out.mkdir(parents=True, exist_ok=True)
        models: dict[str, Any] = {}
        for name in ("none", "ffc", "ccvr"):
            if name != "none" and name not in heads:
                continue
            path = out / f"model_{name}.pt"
            digest = self.model.save(self.global_vector, path, heads.get(name))
            models[name] = {"path": str(path), "sha256": digest}
        spec = self.model.spec
        (out / "model_spec.json").write_text(
            json.dumps(
                {
                    "extractor": spec.extractor,
                    "head": spec.head,
                    "norm": spec.norm,
                    "classifier": spec.classifier,
                    "classifier_seed": spec.classifier_seed,
                    "init_seed": spec.init_seed,
                    "num_classes": spec.num_classes,
                    "in_channels": spec.in_channels,
                    "image_size": list(self.settings.model.image_size),
                    "feature_dim": self.model.feature_dim,
                },
                indent=2,
            )
            + "\n"
        )
        if heads:
            heads_path = out / "classifiers.pt"
            torch.save(
                {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in heads.items()}, heads_path
            )
            models["classifiers"] = {"path": str(heads_path), "sha256": file_sha256(heads_path)}
        self.results["models"] = models

    def summary(self) -> dict[str, Any]:
        """The coordinator's JSON summary (see docs/deployment.md for the schema)."""
        s = self.settings
        return {
            "schema": "spherecal.coordinator-summary/1",
            "federation_id": self.federation_id,
            "status": self.done[0] if self.done else "running",
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "settings": {
                "name": s.name,
                "participants": list(s.participants),
                "seed": s.seed,
                "rounds": s.training.rounds,
                "algorithm": s.training.algorithm,
                "sample_fraction": s.training.sample_fraction,
                "local_epochs": s.training.local_epochs,
                "batch_size": s.training.batch_size,
                "lr": s.training.lr,
                "loss": s.training.loss,
                "model": {
                    "extractor": s.model.extractor,
                    "head": s.model.head,
                    "norm": s.model.norm,
                    "classifier": s.model.classifier,
                },
                "calibration": list(s.calibration.methods),
                "secure_updates": s.secagg.updates,
                "secure_statistics": s.secagg.statistics,
                "update_bound": s.secagg.update_bound,
                "statistics_bound": s.secagg.statistics_bound,
            },
            "accuracy": self.results.get("accuracy", {"none": None, "ffc": None, "ccvr": None}),
            "central_accuracy": self.results.get("central_accuracy"),
            "central_test_samples": self.results.get("central_test_samples"),
            "federated_evaluation": self.results.get("federated_evaluation"),
            "statistics": self.results.get("statistics", {}),
            "ccvr": self.results.get("ccvr"),
            "per_round": list(self.round_metrics),
            "resumed_after_round": self.resumed_from,
            "jobs": list(self.job_summaries),
            "timings": dict(self.timings),
            "models": self.results.get("models", {}),
            "saved_statistics": self.results.get("saved_statistics", {}),
            "model": {
                "feature_dim": self.model.feature_dim,
                "num_classes": self.model.num_classes,
                "parameters": self.model.length,
            },
            "audit_log": str(self.store.path),
            "privacy": self.privacy.summary() if self.privacy is not None else {"enabled": False},
        }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")
