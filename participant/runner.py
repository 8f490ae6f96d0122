"""The participant's main loop: join, pull instructions, do them, push results.

Pull model (docs/design.md §4): the participant only ever calls out. It joins (proving
possession of its identity key), then long-polls ``NextInstruction`` and does what
it is told — train a round, compute statistics, take a secure-aggregation step,
evaluate — until it is told ``Done``. A heartbeat thread keeps it visibly alive while
it computes.

Resilience: an unreachable coordinator is retried with back-off
(``spherecal.participant.backoff``); an unknown session (a restarted coordinator) means joining
again. Work in flight when the coordinator went away is dropped: the resumed
coordinator re-issues what it still needs.

Privacy stance: with ``allow_plaintext = false`` (the default for deployments) the
participant refuses to upload any model update or statistics in the clear; it only
ever sends masked vectors and key material for the protocol (evaluation counts too
go through secure aggregation unless the coordinator asks for them in plaintext,
which it then also refuses). Its ``[policy]`` (``spherecal.participant.policy``) decides what
it takes part in at all.
Nothing it logs contains data, statistics or keys.

(The training task stays next to its loop; the statistics and evaluation tasks,
secure jobs, policy checks, DP-SGD rounds and back-off live in their own modules.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import grpc
import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal import crypto
from spherecal.participant.adversary import Adversary, parse_adversary
from spherecal.participant.backoff import (
    Backoff,
    ParticipantExit,
    stop_if_ended,
    wait_if_stopping,
)
from spherecal.participant.data import LocalData, fingerprint
from spherecal.participant.downloads import download
from spherecal.participant.dp_gate import (
    ParticipantPrivacy,
    PlaintextRefused,
    PrivacyRefused,
)
from spherecal.participant.evaluation_task import evaluate_task
from spherecal.participant.failures import (
    InputWithheld,
    failure_kind,
    policy_rule,
    unforeseen,
    wire_reason,
)
from spherecal.participant.faults import Halter, OnHalt
from spherecal.participant.grpc_transport import client_certificate_hint, tls_failure_hint
from spherecal.participant.held_jobs import HeldJobStore
from spherecal.participant.plan_refusal import PLAN_TASK, PlanRefused, check_plan
from spherecal.participant.policy import RoundOutsidePlan, require_task_bound
from spherecal.participant.release_ledger import (
    REFUSAL,
    LedgerRules,
    Release,
    ReleaseLedger,
    plaintext_digest,
)
from spherecal.participant.results import FinalModels, save_after_completion
from spherecal.participant.secure_jobs import SecureSteps
from spherecal.participant.secure_session import SecureSession
from spherecal.participant.sent_plaintext import SentPlaintext, SentPlaintextStore, task_digest
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.statistics_task import statistics_task
from spherecal.participant.trainer import LocalTrainer
from spherecal.participant.training_task import train_task
from spherecal.participant.transport import PresenceStream, Transport, TransportError
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import DEFAULT_CHUNK_BYTES, header_for
from spherecal.proto.codec import iter_chunks as tensor_chunks
from spherecal.proto.federation_end import SUCCESSFUL_STATUSES
from spherecal.proto.identity import join_payload, public_key_bytes
from spherecal.proto.task_context import secure_task

__all__ = ["ParticipantRunner", "ParticipantExit"]

SOFTWARE_VERSION = "spherecal/0.1"
TEST_FAULTS_ENV = "SPHERECAL_TEST_FAULTS"
"""Must be ``1`` for a test-only fault (``corrupt_shares``, ``adversary``) to be honoured."""

logger = logging.getLogger("spherecal.participant")


class ParticipantRunner:
    def __init__(
        self,
        settings: ParticipantSettings,
        transport: Transport,
        data: LocalData,
        identity: Ed25519PrivateKey,
        ledger: crypto.JobLedger,
        trust: DirectoryTrust,
        *,
        log: Callable[[str], None],
        on_halt: OnHalt | None = None,
        compute_slot: Callable[[], AbstractContextManager[object]] | None = None,
        hold_jobs: bool = True,
    ) -> None:
        self.settings = settings
        self.pid = settings.participant_id
        self.transport = transport
        self.data = data
        self.identity = identity
        self.ledger = ledger
        self.trust = trust
        self.log = log
        self.halter = Halter(settings.halt_before, on_halt)
        self.adversary: Adversary | None = (
            parse_adversary(settings.adversary) if settings.adversary else None
        )
        self._compute_slot = compute_slot or contextlib.nullcontext
        """Held while this participant computes (builds its trainer, carries out an
        instruction). A host of many participants passes a bounded semaphore so at
        most a few of them want the CPU at once; the others wait for the
        coordinator without competing for the interpreter (``spherecal.engines``)."""
        self.session: str | None = None
        self.plan: pb.Plan | None = None
        self.trainer: LocalTrainer | None = None
        self._cache: dict[str, tuple[bytes, npt.NDArray[np.float64]]] = {}
        self._backoff = Backoff(settings.reconnect_max_s, settings.give_up_s)
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._presence: PresenceStream | None = None
        self._lock = threading.Lock()
        self.completed_tasks = 0
        self.privacy = ParticipantPrivacy(settings.privacy, self.pid, settings.state_dir)
        self.policy = settings.policy
        self.releases = ReleaseLedger(
            settings.state_dir / "privacy.db",
            participant=self.pid,
            rules=LedgerRules(
                one_update_per_round=settings.policy.one_update_per_round,
                one_release_per_model=settings.policy.one_release_per_model,
                exact_data_once=not settings.policy.reuse_data_across_federations,
                exact_in_one_federation=not settings.policy.exact_moments_of_changed_data,
                max_evaluations_per_federation=settings.policy.max_evaluations_per_federation,
                max_evaluations_per_split=settings.policy.max_evaluations_per_split,
                max_unreleased_attempts=settings.policy.max_unreleased_attempts,
            ),
        )
        self._fingerprints: dict[str, bytes] = {}
        self.secure = SecureSteps(
            participant_id=self.pid,
            identity=identity,
            ledger=ledger,
            trust=trust,
            transport=transport,
            halter=self.halter,
            releases=self.releases,
            policy=settings.policy,
            caller=self._caller,
            refuse=self._refuse,
            log=log,
            poll_ms=settings.long_poll_ms,
            corrupt_shares=settings.corrupt_shares,
            # the held-jobs folder lets this process's restart finish a job whose
            # masked input left (issue #20); a host of virtual participants, which
            # dies with all of them and restarts none, passes hold_jobs=False
            store=HeldJobStore(settings.state_dir, self.pid, identity) if hold_jobs else None,
            federation=self._federation,
            colluders=settings.privacy.colluders,
        )
        self.sent_plain = SentPlaintextStore(
            settings.state_dir if hold_jobs else None, self.pid, identity, log
        )
        """The plaintext releases that left, kept for the same task asked again
        (``sent_plaintext``; in memory only where no job is held on disk)."""
        self._final: FinalModels | None = None
        self.ending = ""
        """How the process ended, once :meth:`run` returned: the closing line's words
        where the exit status's usual ones would mislead (``ParticipantExit.ending``)."""

    # ---------------------------------------------------------------- plumbing
    def _caller(self) -> pb.Caller:
        return pb.Caller(participant_id=self.pid, session=self.session or "")

    def _join(self) -> None:
        key = public_key_bytes(self.identity)
        nonce = os.urandom(16)
        ts = int(time.time() * 1000)
        c, h, w = self.data.image_shape
        request = pb.JoinRequest(
            participant_id=self.pid,
            identity_public_key=key,
            timestamp_ms=ts,
            nonce=nonce,
            signature=self.identity.sign(join_payload(self.pid, key, ts, nonce)),
            software_version=SOFTWARE_VERSION,
            # the images' format; not the site's label range (checked here, below)
            data=pb.DataShape(num_classes=0, in_channels=c, image_height=h, image_width=w),
        )
        reply = self.transport.join(request)
        self.session = reply.session
        same_federation = (
            self.plan is not None and self.plan.federation_id == reply.plan.federation_id
        )
        if self.plan is not None and not same_federation:
            self._another_federation(reply.plan.federation_id)
        new_plan = (
            self.plan is None or self.plan.SerializeToString() != reply.plan.SerializeToString()
        )
        if new_plan:
            with self._compute_slot():  # PlanRefused: told to the coordinator in run()
                trainer = check_plan(reply.plan, self.data, self.settings, self.releases)
            self.plan = reply.plan
            self.trainer = trainer
            self._cache.clear()
        if same_federation and self.secure.jobs:
            # The coordinator restarted (or we reconnected): it continues its journaled
            # jobs, so keep what each job already sent — it is answered again as it
            # was, never recomputed (issue #20).
            self.log(f"keeping {len(self.secure.jobs)} secure job(s) across the new session")
        else:
            self.secure.clear()  # another federation never continues an old job
            # This process restarted: take up the jobs whose masked input left before
            # (held_jobs); files of any other federation are deleted.
            self.secure.restore_held(reply.plan.federation_id)
            try:  # likewise the plaintext releases kept for another federation
                self.sent_plain.keep_only(reply.plan.federation_id)
            except OSError as exc:
                self.log(f"could not delete the plaintext releases kept for another: {exc}")
        self.log(
            f"joined federation {reply.plan.federation_id} as #{reply.plan.participant_index} "
            f"({self.data.name}: {self.data.train_size} train / {self.data.test_size} test)"
        )
        if new_plan and not same_federation:
            self._note_split_evaluations(reply.plan.federation_id)

    def _note_split_evaluations(self, federation: str) -> None:
        """Say at join what earlier federations used of each evaluation split's
        lifetime allowance (``[policy] max_evaluations_per_split``): a split that has
        none left refuses every evaluation of this federation, and its operator should
        know before the coordinator's final evaluation meets the refusal. The splits'
        fingerprints were taken before the first join (:meth:`run`): a hash here
        would delay the next poll by a time that follows the splits' sizes."""
        most = self.releases.rules.evaluations_per_split
        if most <= 0:
            return
        for split in ("test", "validation"):
            made, federations = self.releases.split_evaluations(self._fingerprint(split))
            if made == 0:
                continue
            left = max(0, most - made)
            line = (
                f"{split} split: {made} of its {most} evaluations for its lifetime "
                f"([policy] max_evaluations_per_split) answered so far, in {federations} "
                f"federation(s); {left} left (federation {federation})"
            )
            if left == 0:
                line = (
                    f"WARNING: {line}: this site refuses its evaluations until the split's "
                    "records change or the limit is raised"
                )
            self.log(line)

    def _another_federation(self, federation_id: str) -> None:
        """A rejoin found the coordinator running another federation than the one this
        process joined: end here, unless ``[policy] follow_new_federation``. Every
        per-federation bound of the release ledger starts over in a new federation, so
        whether this site's data takes part in one is its operator's decision, never
        the coordinator's alone."""
        joined = self.plan.federation_id if self.plan is not None else "?"
        if self.policy.follow_new_federation:
            self.log(
                f"WARNING: the coordinator now runs federation {federation_id}, not "
                f"{joined}; following it ([policy] follow_new_federation = true)"
            )
            return
        raise ParticipantExit(
            1,
            f"the coordinator now runs federation {federation_id}, not {joined} that this "
            "process joined; a new federation starts every per-federation release bound "
            "over, so this participant stops here: start it again to join the new one "
            "(or set [policy] follow_new_federation = true)",
        )

    def _save_final_models(self) -> int:
        if self.trainer is None or self.plan is None or self.settings.out_dir is None:
            return 0
        return save_after_completion(
            self.settings.out_dir, self.trainer, self._final, self.plan.federation_id, self.log
        )

    def _presence_loop(self) -> None:
        """Keep a presence stream open (reopening it after outages and rejoins) so the
        coordinator sees this participant alive while it computes — and dead the
        moment its connection drops."""
        while not self._stop.is_set():
            if self.session is None:
                self._stop.wait(0.2)
                continue
            # Open under the lock, re-checking the stop flag: a stream opened after
            # _stop_presence() ran would never be cancelled, and a gRPC call still
            # live in a daemon thread when the interpreter shuts down can abort the
            # process (SIGABRT) after the federation has already completed.
            with self._lock:
                if self._stop.is_set():
                    break
                stream = self.transport.presence(pb.HeartbeatRequest(caller=self._caller()))
                self._presence = stream
            # Failures are ignored: the main loop notices outages on its own calls.
            with contextlib.suppress(TransportError):
                for _reply in stream:
                    if self._stop.is_set():
                        break
            with self._lock:
                self._presence = None
            self._stop.wait(0.5)

    def _stop_presence(self) -> None:
        """Stop the presence thread and wait for it, so no call is in flight when
        the caller closes the channel and the process exits."""
        self._stop.set()
        with self._lock:
            if self._presence is not None:
                self._presence.cancel()
        thread = self._heartbeat
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)
            if thread.is_alive():
                self.log("presence stream did not stop within 10s; closing the channel")

    # ---------------------------------------------------------------- main loop
    def run(self) -> int:
        weakened = list(self.policy.relaxations())
        if self.settings.allow_plaintext:  # a weakening like the policy's, said alike
            weakened.append(
                "allow_plaintext = true: a task without secure aggregation gets this "
                "site's update, statistics or evaluation counts in plaintext — exact, "
                "unmasked and without noise — where the default refuses it"
            )
        for relaxed in weakened:
            logger.warning("policy weakened: %s", relaxed)
            self.log(f"WARNING: policy weakened: {relaxed}")
        faults = [
            name
            for name, on in (
                ("corrupt_shares", self.settings.corrupt_shares),
                ("adversary", self.adversary is not None),
            )
            if on
        ]
        if faults and os.environ.get(TEST_FAULTS_ENV) != "1":
            self.log(
                f"refusing to start: {', '.join(faults)} is a test-only fault and needs "
                f"{TEST_FAULTS_ENV}=1"
            )
            self.privacy.close()
            self.releases.close()
            self.ending = f"refused to start: a test-only fault without {TEST_FAULTS_ENV}=1"
            return 2
        if self.settings.corrupt_shares:
            self.log("TEST FAULT: dealing corrupted shares in every job")
        if self.adversary is not None:
            self.log(f"TEST FAULT: local computation replaced by the attack {self.adversary}")
        for split in ("train", "test", "validation"):
            # before the first join: each hash takes time that follows the split's
            # size, and done inside the first task or at join it would delay a message
            # the coordinator times (the keys' advertisement, the first poll)
            self._fingerprint(split)
        self._heartbeat = threading.Thread(target=self._presence_loop, daemon=True)
        self._heartbeat.start()
        try:
            return self._loop()
        except ParticipantExit as exc:
            self.log(str(exc))
            if isinstance(exc, PlanRefused):
                self._leave(exc)
            self.ending = exc.ending
            return exc.code
        finally:
            self._stop_presence()
            self.privacy.close()
            self.releases.close()

    def _loop(self) -> int:
        while True:
            try:
                if self.session is None:
                    self._join()
                deferred = self.secure.take_deferred()  # ended a share wait (secure_jobs)
                instruction = deferred if deferred is not None else self._poll()
            except TransportError as exc:
                self._on_control_error(exc)
                continue
            if self._backoff.failing:
                self.log(f"reached the coordinator at {self.settings.coordinator} again")
            self._backoff.reset()
            kind = instruction.WhichOneof("kind")
            if kind == "wait" or kind is None:
                continue
            if kind == "done":
                done = instruction.done
                if wait_if_stopping(done, self._backoff, self.log):
                    self.session = None  # its restart resumes the federation: rejoin
                    continue
                self.log(f"coordinator says done ({done.status}): {done.message}")
                self.secure.end_federation()  # no job of it is answered again
                try:  # nor any task of it: what was kept to send again goes
                    self.sent_plain.clear()
                except OSError as exc:
                    self.log(f"could not delete the plaintext releases kept: {exc}")
                if done.status not in SUCCESSFUL_STATUSES:
                    return 1
                return self._save_final_models()
            try:
                with self._compute_slot():
                    self._dispatch(instruction)
                self.completed_tasks += 1
            except TransportError as exc:
                stop_if_ended(exc.code, exc.message)
                if exc.session_expired:
                    self.session = None
                elif exc.retryable:
                    self.log(f"lost the coordinator during {kind}: {exc.message}")
                    self._backoff.wait(f"coordinator unavailable during {kind}", self.log)
                else:
                    self.log(f"coordinator refused {kind}: {exc.code.name}: {exc.message}")

    def _poll(self) -> pb.Instruction:
        return self.transport.next_instruction(
            pb.InstructionRequest(caller=self._caller(), wait_ms=self.settings.long_poll_ms)
        )

    def _on_control_error(self, exc: TransportError) -> None:
        stop_if_ended(exc.code, exc.message)
        if exc.session_expired:
            self.log("session expired; joining again")
            self.session = None
            return
        if exc.retryable:
            reason = f"{exc.code.name}: {' '.join(exc.message.split())[:200]}"
            tls = self.settings.tls
            hint = tls_failure_hint(
                exc.message, server_name="[tls] server_name", ca=f"[tls] ca = {tls.ca}"
            ) or client_certificate_hint(
                exc.message,
                cert=None if self.settings.insecure else tls.cert,
                ca=tls.ca,
                cert_name=f"[tls] cert = {tls.cert}",
                ca_name=f"[tls] ca = {tls.ca}",
            )
            self._backoff.wait(reason, self.log, address=self.settings.coordinator, hint=hint)
            return
        raise ParticipantExit(
            2, f"coordinator refused this participant: {exc}", ending="refused by the coordinator"
        )

    # ---------------------------------------------------------------- dispatch
    def _dispatch(self, instruction: pb.Instruction) -> None:
        kind = instruction.WhichOneof("kind")
        task = secure_task(instruction)
        if task is not None:
            try:
                held = self.secure.held(task.secure)
            except crypto.JobReplayed as exc:  # the same job id with other terms
                self._refuse(instruction.task_id, exc)
                return
            if held is not None and self.secure.settled(held):
                # a continued job whose input is fixed or withheld: resend what it
                # sent; its remaining steps come as usual — nothing is recomputed or
                # charged (SecureSteps.settled says why)
                self.secure.continue_held(held)
                return
        if kind == "train":
            self._train(instruction.task_id, instruction.train)
        elif kind == "statistics":
            self._statistics(instruction.task_id, instruction.statistics)
        elif kind == "secagg":
            self.secure.step(instruction.secagg)
        elif kind == "evaluate":
            self._evaluate(instruction.task_id, instruction.evaluate)

    def _trainer(self) -> LocalTrainer:
        if self.trainer is None:
            raise ParticipantExit(
                2,
                "instruction before the federation plan",
                ending="the coordinator sent an instruction before the federation plan",
            )
        return self.trainer

    def _download(self, ref: pb.TensorRef, shape: tuple[int, ...]) -> npt.NDArray[np.float64]:
        return download(self.transport, self._caller(), self._cache, ref, shape)

    def _leave(self, refusal: PlanRefused) -> None:
        """This site refused the federation's plan as it joined: record it in the
        release ledger (the site's own audit lists it with the whole reason) and tell
        the coordinator, which ends this site's session and records why it left — the
        public text only (:mod:`spherecal.participant.plan_refusal`). The process exits
        either way."""
        shown = pb.FailureKind.Name(refusal.kind) + (
            f"/{pb.PolicyRule.Name(refusal.rule)}" if refusal.rule != pb.RULE_UNSPECIFIED else ""
        )
        try:
            self.releases.record_refusal(
                task=PLAN_TASK,
                kind=pb.FailureKind.Name(refusal.kind),
                rule=pb.PolicyRule.Name(refusal.rule),
                reason=refusal.reason,
                federation=refusal.federation,
            )
        except Exception as exc:  # telling the coordinator must still happen
            self.log(f"could not record the refusal in the release ledger: {exc}")
        try:
            self.transport.report_failure(refusal.report(self._caller()))
        except TransportError as exc:
            self.log(f"could not tell the coordinator that this site refused its plan: {exc}")
            return
        self.log(f"told the coordinator this site refused its plan ({shown}): {refusal.public}")

    def _refuse(self, task_id: str, error: BaseException) -> None:
        """Withdraw from a task or job, telling the coordinator why: the typed
        :func:`failure_kind` is the meaning, the text only a message for people — the
        exception's own text where it is made of what the coordinator sent, a fixed
        sentence where it depends on this site's data or history
        (:func:`~spherecal.participant.failures.wire_reason`); the site's log and its
        ledger keep the whole reason. Logged at WARNING (until 2026-11-27 at INFO): the
        site refused what it was asked, which its operator looks for (the coordinator
        records the withdrawal as a warning event)."""
        reason = str(error)
        kind = failure_kind(error)
        rule = policy_rule(error) if kind == pb.POLICY_REFUSAL else pb.RULE_UNSPECIFIED
        shown = pb.FailureKind.Name(kind) + (
            f"/{pb.PolicyRule.Name(rule)}" if rule != pb.RULE_UNSPECIFIED else ""
        )
        self.log(f"WARNING: withdrawing from {task_id[:16]}: {shown}: {reason}")
        try:  # the site's own audit lists every refusal (spherecal.site_audit)
            self.releases.record_refusal(
                task=task_id,
                kind=pb.FailureKind.Name(kind),
                rule=pb.PolicyRule.Name(rule),
                reason=reason,
                federation=self._federation(),
            )
        except Exception as exc:  # the withdrawal itself must still go out
            self.log(f"WARNING: could not record the refusal in the release ledger: {exc}")
        try:
            self.transport.report_failure(
                pb.FailureReport(
                    caller=self._caller(),
                    task_id=task_id,
                    reason=wire_reason(error)[:300],
                    kind=kind,
                    rule=rule,
                )
            )
        except TransportError as exc:
            self.log(f"WARNING: could not report the withdrawal: {exc}")

    # ---------------------------------------------------------------- tasks
    def _federation(self) -> str:
        return self.plan.federation_id if self.plan is not None else ""

    def _train(self, task_id: str, task: pb.TrainTask) -> None:
        train_task(self, task_id, task)  # spherecal.participant.training_task

    def _require_planned_round(self, round_index: int) -> None:
        """Refuse a training task for a round the joined plan does not have
        (:class:`~spherecal.participant.policy.RoundOutsidePlan`): one update per round
        is a bound only while the rounds are."""
        rounds = int(self.plan.rounds) if self.plan is not None else 0
        if not 0 <= round_index < rounds:
            raise RoundOutsidePlan(
                f"a training task for round {round_index + 1} of a plan of {rounds} "
                "round(s): each round is one update release, so this site trains only "
                "the rounds of the plan it joined"
            )

    def _local_work_failed(
        self,
        task_id: str,
        session: SecureSession | None,
        release: str | None,
        error: BaseException,
    ) -> None:
        """The local work of an admitted task failed: whether it fails can depend on
        the data and on the model the coordinator chose, so the refusal is counted as
        the task's release, like the upload it replaces — at the job's masked step for
        a secure job (``SecureSteps.withhold``), at once for a plaintext one (its
        upload would have left at once too). A coordinator that asks again for the
        same purpose meets the release ledger either way."""
        if session is not None:
            self.secure.withhold(task_id, session, error)
            return
        trace = unforeseen(error)
        if trace is not None:  # a programming error shows in the site's log (failures)
            self.log(
                f"task {task_id[:16]}: the local work raised {type(error).__name__}, which "
                f"no foreseen failure is; refused as any failed local work:\n{trace}"
            )
        withheld: BaseException = InputWithheld(error)
        if release is not None:
            try:
                self.releases.consume(release, answer=REFUSAL)
            except PrivacyRefused as exc:
                withheld = exc
        self._refuse(task_id, withheld)

    def _fingerprint(self, split: str) -> bytes:
        """This site's data split, fingerprinted once per process — by :meth:`run`,
        before the first join, so that no message waits for a hash."""
        if split not in self._fingerprints:
            self._fingerprints[split] = fingerprint(self.data, split)
        return self._fingerprints[split]

    def _reserve(
        self,
        task_id: str,
        release: Release,
        job: pb.SecAggJob | None,
        task: pb.TrainTask | pb.StatisticsTask | pb.EvaluateTask,
    ) -> str:
        """Reserve this release in the ledger (raises ``ReleaseRepeated``); returns its
        key: the secure job's id, or the task id for a plaintext release. A secure job
        must be bound to ``task`` first (raises ``TaskNotBound``): every member of the
        job then computes on the same model and inputs."""
        if job is None:
            key = f"task-{task_id}"
        else:
            spec = crypto.JobSpec.from_bytes(job.spec)
            require_task_bound(spec.context, task, self.plan or pb.Plan())
            key = spec.job_id.hex()
        self.releases.reserve(release, job=key)
        return key

    def _statistics(self, task_id: str, task: pb.StatisticsTask) -> None:
        statistics_task(self, task_id, task)  # spherecal.participant.statistics_task

    @staticmethod
    def _no_plaintext(what: str) -> PlaintextRefused:
        return PlaintextRefused(
            f"the coordinator asked for plaintext {what}; this participant only sends "
            "securely aggregated results (allow_plaintext = false)"
        )

    def _send_again(
        self, task_id: str, kind: str, release: str, task: pb.TrainTask | pb.StatisticsTask
    ) -> bool:
        """The same plaintext task asked again (a coordinator that restarted): send the
        bytes that left for it before, kept (``sent_plaintext``) — nothing is
        computed, noised or charged again. False when none are kept for this task."""
        kept = self.sent_plain.find(kind, release, task_digest(task, self.plan or pb.Plan()))
        if kept is None:
            return False
        self.log(
            f"{kind} for task {task_id[:16]}: asked again; sending the bytes that left for "
            "it before (nothing is computed, noised or charged again)"
        )
        self._upload_plain(task_id, kept.vector, kept.meta, release=release)
        return True

    def _keep_plain(
        self,
        kept: tuple[str, pb.TrainTask | pb.StatisticsTask],
        release: str,
        array: npt.NDArray[np.float64],
        meta: pb.UpdateMeta | None,
    ) -> bool:
        """Keep a plaintext release before it leaves (``sent_plaintext``); a failed
        write costs the copy only (the task, asked again, is computed again)."""
        kind, task = kept
        try:
            self.sent_plain.keep(
                kind,
                SentPlaintext(
                    federation=self._federation(),
                    release=release,
                    task=task_digest(task, self.plan or pb.Plan()),
                    vector=array,
                    meta=meta,
                ),
            )
        except OSError as exc:
            self.log(
                f"could not keep the plaintext {kind} about to leave ({exc}); if its task "
                "is asked again it is computed again"
            )
            return False
        return True

    def _upload_plain(
        self,
        task_id: str,
        vector: npt.NDArray[np.float64],
        meta: pb.UpdateMeta | None,
        *,
        release: str | None = None,
        kept: tuple[str, pb.TrainTask | pb.StatisticsTask] | None = None,
    ) -> None:
        """Upload a plaintext release: kept (with ``kept``: its kind and task,
        ``sent_plaintext``), then charged, then sent — the masked upload's order, so
        a crash leaves either nothing charged or the bytes that the same task sends
        again."""
        array = np.ascontiguousarray(vector, dtype=np.float64)
        stored = False
        try:
            if not self.settings.allow_plaintext:
                raise self._no_plaintext("uploads")
            if release is not None and kept is not None:
                stored = self._keep_plain(kept, release, array, meta)
            if release is not None:
                self.releases.consume(release, value=plaintext_digest(array, meta))
        except PrivacyRefused as exc:
            if stored and kept is not None:  # it never left: not to be sent later
                self._forget_plain(kept[0])
            self._refuse(task_id, exc)
            return
        plan = self.plan
        chunk = min(DEFAULT_CHUNK_BYTES, plan.max_chunk_bytes if plan else DEFAULT_CHUNK_BYTES)

        def messages() -> Iterator[pb.TensorUpload]:
            yield pb.TensorUpload(
                header=pb.UploadHeader(
                    caller=self._caller(), task_id=task_id, tensor=header_for(array), update=meta
                )
            )
            for data in tensor_chunks(array, chunk):
                yield pb.TensorUpload(data=data)

        try:
            self.transport.upload_tensor(messages())
        except TransportError as exc:
            if exc.code is not grpc.StatusCode.ALREADY_EXISTS:
                raise

    def _forget_plain(self, kind: str) -> None:
        try:
            self.sent_plain.delete(kind)
        except OSError as exc:
            self.log(f"could not delete the plaintext {kind} kept: {exc}")

    def _evaluate(self, task_id: str, task: pb.EvaluateTask) -> None:
        evaluate_task(self, task_id, task)  # spherecal.participant.evaluation_task
