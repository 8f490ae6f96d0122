"""The federation: a linear driver (rounds → statistics → calibration → evaluation →
outputs) composed from one module per idea.

Why a linear driver: the reference runner is a loop, and the service must reproduce
it. Writing the coordinator as the same loop — publish a task, wait (with deadlines
and liveness) until the participants are done, aggregate, step — keeps the
correspondence obvious; concurrency lives only at the edges (RPC handlers feed
results in under the board's lock, the driver waits on its condition variable).

Where things are:

``board``        what the RPC handlers read (task, published tensors, jobs, phase, Done)
``resume``       open the state directory or resume after the last completed round
``stages``       waiting, secure jobs, and the ONE aggregation helper (both modes)
``rounds``       the training rounds (selection, server step, checkpoint)
``calibrating``  statistics jobs and the FFC / CCVR solve
``evaluation``   federated and central evaluation
``outputs``      saved models and the JSON summary
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from spherecal.coordinator.driver.board import Board
from spherecal.coordinator.driver.calibration_stage import calibrate, collect_statistics
from spherecal.coordinator.driver.dp_releases import CoordinatorPrivacy
from spherecal.coordinator.driver.dpsgd_rounds import DistributedDpsgd
from spherecal.coordinator.driver.evaluation_stage import CentralEvaluator, final_evaluation
from spherecal.coordinator.driver.futile_retry import RefusalWatch, fewest_for_a_job
from spherecal.coordinator.driver.integrity import (
    cross_check_evaluations,
    integrity_reasons,
    integrity_record,
)
from spherecal.coordinator.driver.model import Checkpoints, GlobalModel
from spherecal.coordinator.driver.outputs import save_outputs, summary, write_json
from spherecal.coordinator.driver.rejoin import wait_before_retry
from spherecal.coordinator.driver.resume import open_state
from spherecal.coordinator.driver.stages import Progress, Say, StageContext
from spherecal.coordinator.driver.strategy import Strategy, weight_ceiling
from spherecal.coordinator.driver.strategy import update_bound as declared_update_bound
from spherecal.coordinator.driver.training_rounds import RoundDriver
from spherecal.coordinator.driver.validation_gate import gate_heads
from spherecal.coordinator.driver.verdict import assess
from spherecal.coordinator.errors import FederationFailed, StorageFailed
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Member, Registry
from spherecal.coordinator.state.spool import Spool
from spherecal.coordinator.state.storage_faults import storage_failure
from spherecal.coordinator.state.store import Store
from spherecal.coordinator.summary_schema import (
    CoordinatorSummary,
    FederatedEvaluation,
    RoundMetrics,
)
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import model_spec_to_proto
from spherecal.proto.plan_terms import changed_fields, plan_terms

__all__ = ["SUSPEND_LINGER_S", "WATCH_SEEN_S", "Federation", "FederationFailed", "write_json"]

WATCH_SEEN_S = 15.0
"""An operator's status view served this recently counts as a watch in progress: the
ending coordinator lingers (within ``linger_s``) until it has served the final view."""

SUSPEND_LINGER_S = 2.0
"""How long a stopping coordinator keeps answering so that the participants polling
it hear ``stopping`` (a poll is answered within milliseconds of the stop)."""


class Federation:
    """One federation: its board, its progress, and the driver thread's program."""

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
        self.strategy = (
            strategy
            if strategy is not None
            else Strategy(
                settings.training,
                num_participants=len(settings.participants),
                max_examples=weight_ceiling(settings),
                update_bound=declared_update_bound(settings).value,
            )
        )
        self.spool = Spool(settings.state_dir / "spool", report=store.report_failure)
        self.checkpoints = Checkpoints(settings.state_dir / "checkpoints")
        self.board = Board()
        self.progress = Progress(global_vector=self.model.initial_vector.copy())
        self.privacy: CoordinatorPrivacy | None = (
            CoordinatorPrivacy(settings.privacy, store.path)
            if settings.privacy.enabled or settings.privacy.distributed_updates
            else None
        )
        self.stages = StageContext(
            settings=settings,
            store=store,
            registry=registry,
            board=self.board,
            spool=self.spool,
            progress=self.progress,
            say=say,
            shared_plan=self.shared_plan,
        )
        self.rounds = RoundDriver(
            self.stages,
            model=self.model,
            strategy=self.strategy,
            checkpoints=self.checkpoints,
            evaluator=evaluator,
            dpsgd=(
                DistributedDpsgd(settings, self.model, self.privacy)
                if self.privacy is not None and settings.privacy.distributed_updates
                else None
            ),
        )
        integrity_record(self.progress, settings)
        self._started = time.monotonic()
        self._prepared = False

    # ---------------------------------------------------------------- read-only views
    @property
    def federation_id(self) -> str:
        return self.board.federation_id

    @property
    def phase(self) -> str:
        return self.board.phase

    @property
    def global_vector(self) -> Any:
        return self.progress.global_vector

    @property
    def completed_rounds(self) -> int:
        return self.progress.completed_rounds

    @property
    def resumed_from(self) -> int | None:
        return self.progress.resumed_from

    @property
    def round_metrics(self) -> list[RoundMetrics]:
        return self.progress.round_metrics

    @property
    def errors(self) -> list[str]:
        return self.progress.errors

    @property
    def warnings(self) -> list[str]:
        return self.progress.warnings

    @property
    def started_monotonic(self) -> float:
        return self._started

    @property
    def peak_secagg_bytes(self) -> int:
        return self.progress.peak_secagg_bytes

    # ---------------------------------------------------------------- handler side
    def notify(self) -> None:
        """A handler fed a result in: wake the driver (not every long poll)."""
        self.board.notify_driver()

    def stop(self, reason: str) -> None:
        """Ask the driver to end the federation now (SIGTERM, tests); it fails the
        current stage, records ``reason`` and tells participants it is over."""
        self.board.stop(reason)

    def plan_for(self, member: Member) -> pb.Plan:
        """The plan ``member`` joins under: :meth:`shared_plan` with its roster index."""
        plan = self.shared_plan()
        plan.participant_index = member.index
        return plan

    def shared_plan(self) -> pb.Plan:
        """The plan every member joins under, but for its roster index (left at 0):
        what each secure job's task context binds (``spherecal.proto.task_context``),
        so no member can be given other training settings than the rest of its job."""
        s = self.settings
        spec = self.model.spec
        plan = self.strategy.local_plan(0)
        return pb.Plan(
            federation_id=self.federation_id,
            model=model_spec_to_proto(spec),
            training=pb.LocalTraining(
                algorithm=plan.algorithm,
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
            participant_index=0,
            num_participants=len(s.participants),
            max_chunk_bytes=s.server.max_chunk_bytes,
            sum_scales=self.strategy.scales,
            example_count_noise_sd=s.example_count_noise_sd,
        )

    def _fix_plan(self) -> None:
        """A federation keeps the plan it started with (its terms in ``meta``): every
        site fixes the first plan it accepts for a federation and stops at another
        (``spherecal.participant.fixed_plan``), so a resume whose settings change the
        plan — the calibration methods, the secure flags, ``max_examples_per_site``
        (the sum scales), the example-count noise — is refused here, in one line,
        rather than by every site."""
        terms = plan_terms(self.shared_plan())
        stored = self.store.get_meta("plan_terms")
        if stored is None:
            self.store.set_meta("plan_terms", terms.hex())
            return
        before = bytes.fromhex(stored)
        if before != terms:
            fields = ", ".join(changed_fields(before, terms)) or "its encoding"
            raise FederationFailed(
                f"federation {self.federation_id} started with another plan ({fields} "
                "differ from these settings); its sites keep the plan they accepted and "
                "would stop at this one: restore those settings to resume it, or start a "
                "new federation (--new-federation)"
            )

    # ---------------------------------------------------------------- driver
    def run(self) -> None:
        """The whole federation; never raises for federation-level failures (they
        are recorded and announced with ``Done(status="failed")``)."""
        progress = self.progress
        try:
            self.prepare()
            self._await_participants()
            t0 = time.monotonic()
            for r in range(progress.completed_rounds, self.settings.training.rounds):
                self.rounds.run(r)
            progress.timings["train_s"] = time.monotonic() - t0
            aggregates = collect_statistics(self.stages, self.model, self.privacy)
            heads = calibrate(self.stages, self.model, aggregates)
            heads = gate_heads(self.stages, progress.global_vector, heads)
            self._final_evaluation(heads)
            cross_check_evaluations(self.stages)
            save_outputs(self.settings, self.model, progress, heads)
            verdict = assess(self.settings, progress, set(heads))
            reasons = [*verdict.reasons, *integrity_reasons(progress)]
            progress.status_reasons = list(reasons)
            for reason in reasons:
                self.say(f"DEGRADED: {reason}")
                self.store.event("warning", f"degraded: {reason}")
            self._finish(
                "degraded" if reasons else verdict.status,
                "federation completed"
                if not reasons
                else "federation degraded: " + "; ".join(reasons),
            )
        except FederationFailed as exc:
            self._failed(str(exc))
        except (StorageFailed, OSError) as exc:
            fault = storage_failure(self.settings.state_dir, exc)
            if fault is None:
                raise
            # Reported (idempotently) so the process stops, and sites are told so.
            fault = self.store.report_failure(fault)
            self.board.suspend(f"state storage failed: {fault}")
            self._failed(f"stopped: state storage failed: {fault}")
        finally:
            progress.timings["total_s"] = time.monotonic() - self._started

    def _final_evaluation(self, heads: dict[str, Any]) -> None:
        """The final evaluation, repeated (after waiting for participants to rejoin,
        ``rejoin``) while it covers fewer than the calibration minimum — the headline
        accuracy of a short outage must not come from one participant's test split.
        Not repeated when the sites' refusals are ones a retry meets again
        (evaluations exhausted, the same evaluation already answered …) and leave too
        few others to cover more (``futile_retry``): each repeat is one more evaluation
        every other site answers, and the reason is recorded once instead.

        A short attempt's result is kept: its contributors answered that evaluation
        (the same model, split and heads) and refuse to answer it again
        (``RULE_RELEASE_REPEATED``), so a retry asks only the others — when they could
        make a job — and its counts are added to the kept ones (``add_evaluations``).
        Before, a retry they all refused replaced an evaluation of three sites with
        none."""
        s = self.settings
        minimum = s.calibration_minimum
        covered = 0
        kept: FederatedEvaluation | None = None
        results = self.progress.results
        watch = RefusalWatch(self.stages, "evaluate")
        for attempt in range(1, s.training.max_round_attempts + 1):
            if attempt > 1:
                wait_before_retry(
                    self.stages,
                    stage="final evaluation",
                    next_attempt=attempt,
                    reason=f"covered {covered} participants (minimum {minimum})",
                    wanted=self.registry.joined(),
                )
            final_evaluation(self.stages, heads, self.evaluator, kept=kept)
            fed = results.get("federated_evaluation")
            covered = 0 if fed is None else len(fed["participants"])
            if covered >= minimum or attempt == s.training.max_round_attempts:
                return
            if fed is not None and fed["error"] is None and fed["participants"]:
                kept = fed  # its sites answered it: a retry asks the others, and adds
            pool = self.stages.eligible(list(s.participants))
            futile = watch.futile(
                pool,
                least=fewest_for_a_job(s.secagg, len(pool), s.privacy.colluders)
                if s.secagg.evaluation
                else 1,
                needs="a secure job needs" if s.secagg.evaluation else "an evaluation needs",
                released=kept["participants"] if kept is not None else (),
            )
            if futile is not None:
                message = f"final evaluation {futile.reason()}"
                self.progress.errors.append(message)
                self.say(message)
                self.store.event("warning", message)
                return

    def _failed(self, reason: str) -> None:
        """The federation ends ``failed`` — or, when this coordinator *process* is
        stopping (SIGTERM, Ctrl-C, a storage fault: the board is suspended), it is
        ``stopped``: not over, the same command resumes it, as the database says.
        A summary that said ``failed`` there was read as the federation's end."""
        progress = self.progress
        progress.status_reasons = [reason]
        progress.errors.append(reason)
        if self.board.suspended is not None:
            self.say(f"STOPPED: {reason}")
            self._finish("stopped", reason)
            return
        self.say(f"FAILED: {reason}")
        self._finish("failed", reason)

    def _finish(self, status: str, message: str) -> None:
        # The end is recorded (synced: ``Store`` durability) before any site is told
        # ``Done``: a coordinator that crashed or lost power between the two came
        # back resuming a federation whose sites had already left.
        # A process stopped mid-federation (SIGTERM, storage fault) is "stopped" in
        # the database: its restart resumes it. A store that failed refuses these
        # writes; the fault was already reported (the process is stopping).
        try:
            stored = "stopped" if self.board.suspended is not None else status
            record = integrity_record(self.progress, self.settings)
            with contextlib.suppress(StorageFailed):
                self.store.set_meta(
                    "integrity",
                    json.dumps(
                        {k: v for k, v in record.items() if k != "evaluations"}, default=str
                    ),
                )
                self.store.set_meta("status", stored)
                level = {"failed": "error", "stopped": "warning"}.get(status, "info")
                self.store.event(level, f"federation {stored}: {message}")
        finally:
            self.board.finish(status, message)

    def linger(self) -> None:
        """After the end: keep answering until every live participant was told Done,
        and an operator watching the status view (``spherecal status --watch``, seen
        within :data:`WATCH_SEEN_S`) was shown the end — a watch used to lose the
        coordinator between two refreshes and never see ``completed`` (issue #23);
        both bounded by ``[timeouts] linger_s``."""
        board = self.board
        linger_s = self.settings.timeouts.linger_s
        if board.suspended is not None:  # stopping: tell the polls we hold, briefly
            linger_s = min(linger_s, SUSPEND_LINGER_S)
        deadline = time.monotonic() + linger_s
        while time.monotonic() < deadline and (
            board.stopping is None or board.suspended is not None
        ):
            alive = self.registry.alive()
            with board.cond:
                watched = (
                    board.status_polled_at is not None
                    and time.monotonic() - board.status_polled_at <= WATCH_SEEN_S
                    and not board.final_status_served
                )
                if alive <= board.done_delivered and not watched:
                    return
                board.cond.wait(0.2)

    def prepare(self) -> None:
        """Open or resume the federation's state (idempotent). Call before serving, so
        that joining participants already get the federation id and plan."""
        if self._prepared:
            return
        s = self.settings
        opened = open_state(s, self.store, self.strategy, self.model.length)
        self.board.federation_id = opened.federation_id
        self._fix_plan()
        if opened.global_vector is not None:
            self.progress.global_vector = opened.global_vector
            self.progress.completed_rounds = opened.completed_rounds
            self.progress.resumed_from = opened.resumed_from
            self.progress.round_metrics = list(opened.round_metrics)
            self.say(
                f"resuming federation {opened.federation_id} after round "
                f"{opened.completed_rounds} (checkpoint {opened.checkpoint_path})"
            )
            self.store.event("info", f"resumed after round {opened.completed_rounds}")
        else:
            self.say(
                f"federation {opened.federation_id}: {len(s.participants)} "
                f"participants, {s.training.rounds} rounds, "
                f"secure updates {'on' if s.secagg.updates else 'off'}, "
                f"secure statistics {'on' if s.secagg.statistics else 'off'}"
            )
        self._prepared = True

    def _await_participants(self) -> None:
        """The join window: wait up to ``[timeouts] join_s`` for every roster member
        that has not left, then go on with whoever joined if that is at least
        ``needed`` (``training.min_participants``, and two for secure aggregation).

        A member that *left* — it refused the federation's plan, told the coordinator
        (a ``FailureReport`` without a task) and exited (``Registry.leave``), or its
        certificate is on the CA's revocation list (``Registry.revoked``) — is not
        waited for. Until 2026-11-27 the window waited for it like any site still to
        come: the full ``join_s`` (300 s by default) even when every other site had
        joined, and, where the sites still to come could never make ``needed``, all
        that time before failing with "only N of M participants joined". Now:

        * if the members that have not left are fewer than ``needed``, the federation
          fails at once, naming each site that refused and why — no wait can start it;
        * once every member that has not left has joined, the window closes at once
          (a warning names the sites that refused);
        * otherwise it waits for the others only, as before, until ``join_s``.

        A site that left and joins again (its operator fixed its data or settings) is
        let back in: its join clears ``left`` (``Registry.join``), so while the window
        is open it counts as any site that joined — and refusing again, it leaves
        again. After the window it takes part from the next round, as any site that
        rejoins. A federation that failed at once stays failed: the plan is fixed for
        the federation (``meta.plan_terms``), so after fixing the site its operator
        starts a new one (``--new-federation``). ``left`` is kept in the store with the
        member's row (``Store.record_left``): a coordinator restarted during its join
        window does not wait for a site that refused before its restart either."""
        board = self.board
        s = self.settings
        board.set_task(None, "waiting for participants")
        roster = frozenset(s.participants)
        deadline = time.monotonic() + s.timeouts.join_s
        needed = max(s.training.min_participants, 2 if s.secure else 1)
        while True:
            board.check_stop()
            joined, left = self.registry.joined_and_left()
            awaited = roster - left.keys()
            refused = "; ".join(f"{pid} {why}" for pid, why in sorted(left.items()))
            if left and len(awaited) < needed:
                raise FederationFailed(
                    f"at most {len(awaited)} of {len(roster)} participants can join "
                    f"(need {needed}): {refused}"
                )
            expired = time.monotonic() >= deadline
            if joined >= awaited or expired:
                if len(joined) < needed:  # only at expiry: joined ⊇ awaited is >= needed
                    raise FederationFailed(
                        f"only {len(joined)} of {len(roster)} participants joined within "
                        f"{s.timeouts.join_s:.0f}s (need {needed})"
                        + (f"; {refused}" if left else "")
                    )
                if joined != roster:
                    self._went_on_without(roster, joined, left, expired=expired)
                break
            board.wait(0.2)
        self.say(f"{len(self.registry.joined())}/{len(roster)} participants joined")

    def _went_on_without(
        self, roster: frozenset[str], joined: frozenset[str], left: dict[str, str], *, expired: bool
    ) -> None:
        """The warning of a join window that closed short of the roster; each member
        that left is named with why (it refused the plan, or its certificate was
        revoked)."""
        missing = sorted(roster - joined)
        going_on = f"continuing with {len(joined)} of {len(roster)} participants, without {missing}"
        why = "; ".join(f"{pid} {reason}" for pid, reason in sorted(left.items()))
        if expired:
            warning = f"join window of {self.settings.timeouts.join_s:.0f}s expired: {going_on}"
            if left:
                warning += f" ({why})"
        else:
            warning = f"every participant that has not left joined: {going_on} ({why})"
        self.progress.warnings.append(warning)
        self.say(f"WARNING: {warning}")
        self.store.event("warning", warning)

    def summary(self) -> CoordinatorSummary:
        """The coordinator's JSON summary (see docs/deployment.md for the schema)."""
        return summary(
            settings=self.settings,
            federation_id=self.federation_id,
            status=self.board.done[0] if self.board.done else "running",
            progress=self.progress,
            model=self.model,
            audit_log=self.store.path,
            privacy=self.privacy,
            conduct=self.stages.conduct,
        )
