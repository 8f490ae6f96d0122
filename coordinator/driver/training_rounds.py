"""The round driver: publish the global model (and what the strategy broadcasts),
let the selected participants train, sum their payloads (one path for secure and
plaintext, :meth:`StageContext.gather`), take the strategy's server step, checkpoint.

Round ``r`` (0-based) reproduces ``spherecal.spherefed.reference.run_federation`` with the same
strategy object type (``spherecal.spherefed.algorithms.STRATEGIES``):

* participants ``select_participants(config, r)`` of the roster (index = roster
  position), each running the strategy's local step with seed
  ``derive_seed(seed, "train", r, k)``;
* the strategy's named sums (FedAvg: ``Σ n_k Δ_k``, ``Σ n_k``; FedNova adds
  ``Σ n_k‖a_k‖₁``; SCAFFOLD ``Σ (c_k⁺ − c_k)``) and ``Σ mean_loss_k``, flattened in
  one vector (``Strategy.layout``): one secure-aggregation job, or plaintext uploads
  of that vector summed in roster order;
* the strategy's server step on the named sums (FedAdam/FedYogi: a server optimiser;
  SCAFFOLD also updates its control variate);
* a checkpoint of the new global vector (and the strategy's server state), committed
  before the next round starts, so a killed coordinator resumes from the last
  completed round.

With ``[privacy] updates = "distributed"`` each round is instead one step of
distributed DP-SGD (:mod:`spherecal.coordinator.driver.dpsgd_rounds`): the job sums the
sites' clipped gradient sums and their noise shares (model layout only), and the
step ``θ − η·(noisy sum)/B`` replaces the strategy's.

Extension points: :meth:`RoundDriver.candidates` (who trains this round) and
:meth:`RoundDriver.finish_round` (what is recorded) are the places a participant
exclusion policy, a rejoin grace or round metrics hook in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal import crypto
from spherecal.coordinator.driver.dpsgd_rounds import DistributedDpsgd
from spherecal.coordinator.driver.evaluation_stage import CentralEvaluator, federated_evaluation
from spherecal.coordinator.driver.futile_retry import FutileRetry, RefusalWatch, fewest_for_a_job
from spherecal.coordinator.driver.integrity import IntegrityCheckFailed, check_bound, note
from spherecal.coordinator.driver.model import Checkpoints, GlobalModel
from spherecal.coordinator.driver.progress_log import round_line
from spherecal.coordinator.driver.rejoin import wait_before_retry
from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.coordinator.driver.stages import (
    Gathered,
    StageContext,
    default_slot,
    with_first_cause,
)
from spherecal.coordinator.driver.strategy import Strategy, update_bound
from spherecal.coordinator.driver.tasks import Task
from spherecal.coordinator.driver.validation_gate import RoundGate
from spherecal.coordinator.errors import FederationFailed
from spherecal.coordinator.summary_schema import RoundMetrics
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.task_context import task_context
from spherecal.spherefed.fl import derive_seed
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.reference import ReferenceConfig, select_participants

__all__ = ["RoundDriver"]


@dataclass
class _KeptSum:
    """A round's sum short of ``[training] min_participants``, kept across its attempts,
    and the sums of later attempts added to it (:meth:`RoundDriver.attempt`)."""

    values: npt.NDArray[np.float64] | None = None
    contributors: list[str] = field(default_factory=list)
    parts: list[list[str]] = field(default_factory=list)
    """Each added job's contributors, in the order summed."""
    job: SecureJob | None = None
    """The first part's job: the round's ``secure_job``."""

    def plus(self, gathered: Gathered, order: Callable[[str], int]) -> _KeptSum:
        """This sum and one over other sites (sums over disjoint sites from the same
        model and seeds add to the sum over their union); ``self`` is unchanged."""
        assert gathered.values is not None
        both = set(self.contributors) & set(gathered.contributors)
        if both:  # a retry asks only the others: never
            raise ValueError(f"the sums to add share contributors {sorted(both)}")
        return _KeptSum(
            values=np.asarray(gathered.values, dtype=np.float64)
            if self.values is None
            else self.values + gathered.values,
            contributors=sorted([*self.contributors, *gathered.contributors], key=order),
            parts=[*self.parts, sorted(gathered.contributors, key=order)],
            job=self.job if self.job is not None else gathered.job,
        )

    def take(self, other: _KeptSum) -> None:
        """Keep ``other`` (a short sum) as this one."""
        self.values, self.contributors = other.values, other.contributors
        self.parts, self.job = other.parts, other.job

    def gathered(self, dropped: dict[str, str]) -> Gathered:
        """The sum of every part, as one gathered sum."""
        return Gathered(self.values, list(self.contributors), dropped, None, self.job)


class RoundDriver:
    """Runs the training rounds on a :class:`StageContext`."""

    def __init__(
        self,
        ctx: StageContext,
        *,
        model: GlobalModel,
        strategy: Strategy,
        checkpoints: Checkpoints,
        evaluator: CentralEvaluator | None,
        dpsgd: DistributedDpsgd | None = None,
    ) -> None:
        self.ctx = ctx
        #: distributed DP-SGD (``[privacy] updates = "distributed"``), else None
        self.dpsgd = dpsgd
        self.model = model
        self.strategy = strategy
        self.checkpoints = checkpoints
        self.evaluator = evaluator
        s = ctx.settings
        self.round_gate = RoundGate(ctx)
        #: every update job's entry bound: from the declared limits and the algorithm
        self.update_bound = update_bound(s)
        if s.secagg.updates:
            ctx.say(f"secure updates: {self.update_bound.describe()}")
        self.reference = ReferenceConfig(
            participants=len(s.participants),
            sample_fraction=s.training.sample_fraction,
            seed=s.seed,
        )

    def run(self, r: int) -> None:
        """Round ``r``, retried up to ``max_round_attempts`` times — unless the sites'
        refusals are ones a retry meets again and leave too few others for the round
        (``futile_retry``): then it is lost (a release already spent) or fails at once."""
        ctx = self.ctx
        s = ctx.settings
        last_error = first_error = ""
        refusals_before = len(ctx.conduct.refusals)
        watch = RefusalWatch(ctx, "update")
        futile: FutileRetry | None = None
        attempts = 0
        kept = _KeptSum()
        for attempt in range(1, s.training.max_round_attempts + 1):
            attempts = attempt
            ctx.board.check_stop()
            if attempt > 1:
                # back off, then wait for the selected participants to reconnect
                selected, _, _ = self.candidates(r)
                wait_before_retry(
                    ctx,
                    stage=f"round {r + 1}",
                    next_attempt=attempt,
                    reason=last_error,
                    wanted=[p for p in selected if p not in kept.contributors],
                )
            outcome = self.attempt(r, attempt, kept)
            if outcome is None:
                return
            last_error = outcome
            first_error = first_error or outcome
            ctx.say(f"round {r + 1} attempt {attempt} failed: {outcome}")
            ctx.store.event("warning", f"round {r + 1} attempt {attempt} failed: {outcome}")
            ctx.store.round_finished(r, "failed", {"error": outcome, "attempt": attempt})
            if attempt < s.training.max_round_attempts:
                futile = self.futile(r, watch, kept)
                if futile is not None:
                    break
        refused = ctx.conduct.refusals_since(refusals_before)
        released = sorted(
            {f.participant for f in refused if f.rule == "RULE_RELEASE_REPEATED"}
            | set(kept.contributors)  # their updates are in the sum kept, never asked again
        )
        spent = sorted({f.participant for f in refused if f.rule == "RULE_ATTEMPTS_EXHAUSTED"})
        if released or spent:
            message = self.lose(r, released, first_error, attempts, futile, spent=spent)
            in_a_row = self.lost_in_a_row()
            limit = s.training.max_lost_rounds_in_a_row
            if limit and in_a_row >= limit:
                raise FederationFailed(
                    f"{in_a_row} rounds lost in a row ([training] max_lost_rounds_in_a_row"
                    f" = {limit}; the model has not moved since round {r + 2 - in_a_row}); "
                    f"the last: {message}"
                )
            return
        if futile is not None:
            raise FederationFailed(f"round {r + 1} failed, {futile.reason()}; first: {first_error}")
        raise FederationFailed(
            f"round {r + 1} failed {s.training.max_round_attempts} times; last: {last_error}"
        )

    def futile(self, r: int, watch: RefusalWatch, kept: _KeptSum) -> FutileRetry | None:
        """Whether no retry of round ``r`` can reach ``[training] min_participants``
        (and, secure, a job's threshold and minimum) among its eligible selected
        sites, once those that refused it for good are left out — and those whose
        updates are in a short sum ``kept``, which a retry does not ask: it needs
        only the rest of the minimum."""
        s = self.ctx.settings
        selected, _, _ = self.candidates(r)
        pool = self.ctx.eligible(selected)
        least = max(s.training.min_participants - len(kept.contributors), 1)
        needs = "a round needs ([training] min_participants)"
        if s.secagg.updates:
            others = len([p for p in pool if p not in kept.contributors])
            job = fewest_for_a_job(s.secagg, others, s.privacy.colluders)
            if job > least:
                least, needs = job, "a secure job needs"
        return watch.futile(pool, least=least, needs=needs, released=kept.contributors)

    def lost_in_a_row(self) -> int:
        """How many of the last recorded rounds were lost, counting back from the
        newest (a coordinator restarted mid-run reads them back with the rounds)."""
        count = 0
        for metrics in reversed(self.ctx.progress.round_metrics):
            if metrics.get("status") != "lost":
                break
            count += 1
        return count

    def lose(
        self,
        r: int,
        released: list[str],
        first_error: str,
        attempts: int,
        futile: FutileRetry | None = None,
        *,
        spent: list[str] | None = None,
    ) -> str:
        """Give up round ``r`` without failing the federation: sites whose release for
        it was spent in a failed job — their update left, or they refused at its masked
        step for a reason that depends on their data (an update outside the job's
        bound: a refusal counted as the release, ``participant.secure_jobs``) — refuse
        a second one (one update per ``(federation, round)``, issue #19), so no retry
        can reach the minimum. Sites in ``spent`` refused a further job for the round
        because they had started their most jobs for it whose input never left
        (``[policy] max_unreleased_attempts``, ``RULE_ATTEMPTS_EXHAUSTED``: attempts
        made before a coordinator restart count too); the next round is a purpose of
        its own, so the federation goes on as it does for a spent release. The model
        keeps its state; the round is recorded as ``lost`` and the status is
        ``degraded`` with the reason (``verdict``), naming the refusal and the *first*
        attempt's failure: the later attempts' failure is the repeated refusal itself,
        while the first names what went wrong (e.g. every site's update outside the
        declared bound). ``attempts``: how many were made;
        ``futile``: no more were, once no retry could reach the minimum
        (``futile_retry``), which the message says."""
        ctx, progress = self.ctx, self.ctx.progress
        causes = []
        if released:
            causes.append(
                f"{', '.join(released)} released their update for this round in a failed "
                "or short job (its upload, or a refusal counted as the release) and each "
                "site releases one update per round (RULE_RELEASE_REPEATED)"
            )
        if spent:
            causes.append(
                f"{', '.join(spent)} already started their most jobs for this round whose "
                "input never left ([policy] max_unreleased_attempts, "
                "RULE_ATTEMPTS_EXHAUSTED)"
            )
        message = (
            f"round {r + 1} lost: {'; '.join(causes)}"
            + ("; not retried: too few others could take part" if futile is not None else "")
            + f"; first attempt: {first_error}"
        )
        metrics: RoundMetrics = {
            "round": r + 1,
            "status": "lost",
            "attempt": attempts,
            "selected": self.candidates(r)[0],
            "contributors": [],
            "dropped": {},
            "train_loss": None,
            "test_accuracy": None,
            "federated_accuracy": None,
            "secure_job": None,
            "seconds": 0.0,
        }
        checkpoint = self.checkpoints.save(r, progress.global_vector, self.strategy.state_dict())
        ctx.store.round_finished(r, "lost", metrics, checkpoint)
        progress.round_metrics.append(metrics)
        progress.completed_rounds = r + 1
        progress.errors.append(message)
        ctx.say(message)
        ctx.store.event("error", message)
        return message

    def candidates(self, r: int) -> tuple[list[str], list[str], dict[str, str]]:
        """(selected, connected candidates, dropped-with-reason) for round ``r``."""
        roster = self.ctx.settings.participants
        selected = [roster[k] for k in select_participants(self.reference, r)]
        alive = self.ctx.registry.alive()
        eligible = set(self.ctx.eligible(selected))
        candidates = [p for p in selected if p in alive and p in eligible]
        dropped = {
            p: "excluded (shares failed authentication)"
            if p not in eligible
            else "not connected at round start"
            for p in selected
            if p not in candidates
        }
        return selected, candidates, dropped

    def _train_task(
        self,
        r: int,
        ref: pb.TensorRef,
        broadcast: list[pb.NamedTensorRef],
        step: DistributedDpsgdPlan | None,
        *,
        seed: int = 0,
        secure: pb.SecAggJob | None = None,
    ) -> pb.TrainTask:
        """One member's training task (without ``seed`` and ``secure``, which differ
        per member: the task the job's context is the digest of)."""
        return pb.TrainTask(
            round=r,
            model=ref,
            seed=seed,
            secure=secure,
            broadcast=broadcast,
            dpsgd=self.dpsgd.message(step) if self.dpsgd is not None and step is not None else None,
        )

    def attempt(self, r: int, attempt: int, kept: _KeptSum) -> str | None:
        """One attempt at round ``r``; returns None on success, else the reason.

        A secure job's sum of fewer updates than ``[training] min_participants`` is
        *kept* in ``kept``: its contributors released their update for the round and
        would refuse a second (one update per ``(federation, round)``; a plaintext
        retry asks the same task again and gets the same bytes, and distributed
        DP-SGD's step is planned for one job — neither keeps), so the next attempt asks
        only the others and its sum is added — sums over disjoint sites from the same
        model and seeds add to the sum over their union. Each such job has its journal
        slot (``update:r3``, ``update:r3+2``, …), so a restarted coordinator continues
        every part (issue #20)."""
        ctx = self.ctx
        s = ctx.settings
        t0 = time.monotonic()
        ctx.store.round_started(r, attempt)
        selected, candidates, dropped = self.candidates(r)
        candidates = [p for p in candidates if p not in kept.contributors]
        dropped = {p: why for p, why in dropped.items() if p not in kept.contributors}
        minimum = s.training.min_participants
        if len(candidates) + len(kept.contributors) < minimum:
            return (
                f"only {len(candidates) + len(kept.contributors)} of the {len(selected)} "
                f"selected participants are connected (minimum {minimum})"
            )
        part = len(kept.parts) + 1
        slot = default_slot("update", r) + ("" if part == 1 else f"+{part}")
        ref = ctx.board.publish(f"global-r{r}", ctx.progress.global_vector)
        broadcast = [
            pb.NamedTensorRef(name=name, tensor=ctx.board.publish(f"{name}-r{r}", value))
            for name, value in self.strategy.broadcast(ctx.progress.global_vector).items()
        ]
        layout = self.strategy.layout(self.model.length)
        job: SecureJob | None = None
        step = None
        if s.secagg.updates:
            # after a restart: the journaled job's participants, continued
            candidates = ctx.resume_participants(slot, candidates)
            try:
                spec_arguments: dict[str, Any] | None = (
                    # the 32-bit ring when the bound, n and this step allow it
                    {"resolution": s.secagg.update_resolution}
                    if s.secagg.update_resolution > 0
                    else None
                )
                if self.dpsgd is not None:
                    step = self.dpsgd.plan(len(candidates))
                    spec_arguments = self.dpsgd.spec_arguments(step, len(candidates))
                job = ctx.new_job(
                    "update",
                    r,
                    candidates,
                    self.model.length if step is not None else layout.length,
                    self.update_bound.value,
                    s.timeouts.round_s,
                    spec_arguments=spec_arguments,
                    context=task_context(
                        self._train_task(r, ref, broadcast, step), ctx.shared_plan()
                    ),
                    slot=slot,
                )
            except (crypto.SecAggError, ValueError) as exc:
                return f"cannot create the secure job: {exc}"
        task = Task(
            task_id=ctx.task_id(slot),
            kind="train",
            expected=frozenset(candidates),
            instructions={
                p: pb.Instruction(
                    train=self._train_task(
                        r,
                        ref,
                        broadcast,
                        step,
                        seed=derive_seed(s.seed, "train", r, ctx.registry.index_of(p)),
                        secure=job.job_message(p) if job is not None else None,
                    )
                )
                for p in candidates
            },
            round=r,
            purpose="update",
            job=job,
            expected_shape=(job.spec.length if job is not None else layout.length,),
        )
        ctx.board.set_task(task, f"round {r + 1}/{s.training.rounds}: training")
        ctx.say(
            f"round {r + 1}/{s.training.rounds}: training on {len(candidates)} participants"
            + (f" (not connected: {sorted(dropped)})" if dropped else "")
            + (f", to add to the {len(kept.contributors)} kept" if kept.parts else "")
        )
        # secure jobs only: a plaintext retry asks the same task again, and a site whose
        # upload left sends the same bytes (``participant.sent_plaintext``), so nothing
        # is lost there; a distributed DP-SGD step is planned for one job
        keeps = job is not None and self.dpsgd is None
        gathered = ctx.gather(
            task,
            timeout_s=s.timeouts.round_s,
            phase_after=f"round {r + 1}: aggregating",
            minimum=minimum,
        )
        dropped.update(gathered.dropped)
        if gathered.error is not None:
            ctx.board.set_task(None, f"round {r + 1}: failed")
            return with_first_cause(gathered.error, dropped)
        total = kept
        if keeps and gathered.values is not None and gathered.contributors:
            total = kept.plus(gathered, ctx.registry.index_of)
            if kept.parts or len(total.contributors) < minimum:
                # a part kept or added is checked on its own too: a part over its own
                # bound must not pass inside a larger union's (issue #22)
                claimed = float(layout.unflatten(gathered.values)["weight"])
                refused = self._weight_refused(r, claimed, len(gathered.contributors))
                if refused is not None:
                    return refused
            if len(total.contributors) < minimum:
                kept.take(total)  # short: its sites released their update; kept
                return (
                    f"only {len(total.contributors)} updates (minimum {minimum}); kept, "
                    "and a retry asks the others"
                )
            if kept.parts:
                line = (
                    f"round {r + 1}: attempt {attempt} summed {len(gathered.contributors)} "
                    f"more updates, added to the {len(kept.contributors)} kept"
                )
                ctx.say(line)
                ctx.store.event("info", line)
                if ctx.halt is not None and gathered.job is not None:
                    ctx.halt("added", "update", gathered.job)  # test-only: before the step
            gathered = total.gathered(dropped)
        if gathered.values is None or len(gathered.contributors) < minimum:
            return f"only {len(gathered.contributors)} updates (minimum {minimum})"
        if self.dpsgd is not None and step is not None and gathered.job is not None:
            return self.dpsgd_step(r, attempt, t0, selected, gathered, dropped, step)
        sums = layout.unflatten(gathered.values)
        # Σ loss_k / K is bit-identical to the reference's np.mean(losses): NumPy's
        # mean is the same ordered reduction divided by the count.
        train_loss = float(sums.pop("loss")) / max(len(gathered.contributors), 1)
        weight = float(sums["weight"])
        refused = self._weight_refused(r, weight, len(gathered.contributors))
        if refused is not None:
            return refused
        before = ctx.progress.global_vector
        state_before = self.strategy.state_dict()
        try:
            new_vector = self.strategy.step(before, sums, num_selected=len(selected))
        except ValueError as exc:
            return f"the server step refused the round's sums: {exc}"
        ctx.progress.global_vector = new_vector
        ctx.board.unpublish(f"global-r{r}")
        for ref_ in broadcast:
            ctx.board.unpublish(ref_.tensor.name)
        if self.round_gate.check(r, before, new_vector):
            ctx.progress.global_vector = before  # ``[federation] round_gate = "rollback"``
            self.strategy.load_state_dict(state_before)
        self.finish_round(
            r, attempt, t0, selected, gathered, dropped, train_loss, weight, kept=total
        )
        return None

    def _weight_refused(self, r: int, weight: float, contributors: int) -> str | None:
        """Why a sum of round ``r`` over ``contributors`` sites is refused for its
        weight ``Σ ñ_k`` (none, or above ``contributors × max_examples_per_site`` and
        the noise: issue #22), or None."""
        s = self.ctx.settings
        if weight <= 0:
            return "the round's updates carry no samples (weight sum 0)"
        try:
            check_bound(
                "the round's weight Σ ñ_k",
                weight,
                contributors,
                s.max_examples_per_site,
                noise_sigma=float(s.example_count_noise_sd),
                entries=contributors,
            )
        except IntegrityCheckFailed as exc:
            note(self.ctx, f"round {r + 1} weight bound", False, str(exc))
            return f"the round's aggregate refused: {exc}"
        return None

    def dpsgd_step(
        self,
        r: int,
        attempt: int,
        t0: float,
        selected: list[str],
        gathered: Gathered,
        dropped: dict[str, str],
        step: DistributedDpsgdPlan,
    ) -> str | None:
        """Apply a distributed DP-SGD round's noisy sum and record its privacy cost.

        The step is applied to the last checkpoint's model, so a coordinator that
        restarts after recording it and before its checkpoint replays the journaled
        sum onto the same model (applied once) and the record returns the stored
        summary (charged once, :meth:`CoordinatorPrivacy.record_dpsgd_step`). The
        round gate checks the step as any round; a rolled-back step stays charged
        (its noisy sum was released)."""
        assert self.dpsgd is not None and gathered.values is not None and gathered.job
        ctx = self.ctx
        before = ctx.progress.global_vector
        try:
            new_vector = self.dpsgd.step(before, gathered.values)
        except ValueError as exc:
            return f"the DP-SGD step refused the round's sum: {exc}"
        summary = self.dpsgd.record(gathered.job.job_hex, r, step, gathered.contributors)
        if ctx.halt is not None:  # test-only: the step recorded, not yet checkpointed
            ctx.halt("recorded", "update", gathered.job)
        ctx.progress.global_vector = new_vector
        ctx.board.unpublish(f"global-r{r}")
        ctx.say(
            f"round {r + 1}: distributed DP-SGD step over {summary['contributors']} sites "
            f"(σ realised {summary['realised_noise_multiplier']:.3g}); federation ε so far "
            f"{summary['federation_epsilon_total']:.4g} at δ = {summary['delta']:g}"
            + (" (recorded before a restart: not charged again)" if summary.get("replayed") else "")
        )
        if self.round_gate.check(r, before, new_vector):
            ctx.progress.global_vector = before  # ``[federation] round_gate = "rollback"``
        self.finish_round(r, attempt, t0, selected, gathered, dropped, None)
        return None

    def finish_round(
        self,
        r: int,
        attempt: int,
        t0: float,
        selected: list[str],
        gathered: Gathered,
        dropped: dict[str, str],
        train_loss: float | None,
        weight: float | None = None,
        kept: _KeptSum | None = None,
    ) -> None:
        """Metrics, optional evaluation, checkpoint, and the round's log line; with
        ``kept``, the round's sum was added from its parts (``parts``)."""
        ctx = self.ctx
        s = ctx.settings
        progress = ctx.progress
        contributors = gathered.contributors
        metrics: RoundMetrics = {
            "round": r + 1,
            "attempt": attempt,
            "selected": selected,
            "contributors": sorted(contributors, key=ctx.registry.index_of),
            "dropped": dropped,
            "train_loss": train_loss,
            "weight": weight,
            "test_accuracy": None,
            "federated_accuracy": None,
            "secure_job": gathered.job.job_hex if gathered.job is not None else None,
            "seconds": 0.0,  # set once the round's evaluation ran (below)
        }
        if kept is not None and len(kept.parts) > 1:
            metrics["parts"] = [list(part) for part in kept.parts]
        if self.evaluator is not None:
            metrics["test_accuracy"] = self.evaluator.accuracy(progress.global_vector)
        if s.evaluates_after_round(r):  # within the sites' evaluation limit
            fed = federated_evaluation(ctx, progress.global_vector, {}, round_index=r)
            metrics["federated_accuracy"] = fed["accuracy"].get("none")
            metrics["federated_accuracy_sd"] = fed["accuracy_sd"].get("none")
        metrics["seconds"] = time.monotonic() - t0
        checkpoint = self.checkpoints.save(r, progress.global_vector, self.strategy.state_dict())
        ctx.store.round_finished(r, "completed", metrics, checkpoint)
        # the checkpoint now holds what the round's journaled sum was kept for
        ctx.journal.discard_results(default_slot("update", r))
        progress.round_metrics.append(metrics)
        progress.completed_rounds = r + 1
        ctx.say(round_line(metrics, progress.round_metrics, s.training.rounds))
