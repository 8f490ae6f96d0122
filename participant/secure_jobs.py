"""The participant's secure-aggregation jobs over the network: start one (advertise
first), answer its share stage, fix its input, answer each later stage, stream the
masked input.

Why advertise and share first: the moments a participant advertises its keys and
sends its shares are recorded by the coordinator (audit table). If either followed
training or computing statistics, that moment would reveal how long the local work
took — and with it the number of local examples (issue #9 measured a correlation of
0.9 for the advertisement; once only the advertisement moved, 0.78 for the share
answer, pooled over six runs of ``bench/timing_channel.py``). Neither depends on
the input, so a job is started and advertised as soon as the task arrives, its share
step is awaited and answered (:meth:`SecureSteps.answer_share`, bounded by
``[policy] share_wait_s``), and only then does the local work run;
:meth:`SecureSteps.set_input` fixes the vector (``crypto`` allows it at any stage
before unmasking). What remains is the masked
upload, which needs the input by nature; ``[policy] min_local_work_s`` hides it.

Why here, not in the runner: one idea per module — the runner decides *what* to
compute; this module owns the job sessions, the release consumption at the moment
the input leaves (:mod:`spherecal.participant.release_ledger`), and complaints: a share that fails
authentication is answered with the signed complaint naming its dealer (stage
``COMPLAINT``) before the typed withdrawal, so the coordinator can exclude the dealer
when it retries.

Held jobs (issue #20): a job is held in the site's held-jobs folder
(:mod:`spherecal.participant.held_jobs`) from the moment its keys are made — the
session, with its job keys, is written before the advertisement leaves, and again
before each later message (the shares, the signature, the unmask answer). After
this process restarts, :meth:`SecureSteps.restore_held` takes those jobs up again so
the coordinator's remaining steps are answered for the same job id with the same
keys: a site killed before its upload redoes its local work (the coordinator hands
it the task again) and masks that input; one killed during it sends the identical
stored bytes.

The masked upload, in this order (:meth:`SecureSteps._upload_masked`): (1) the
masked chunks are written and the session record replaced by one that names them
and holds no keys; (2) the release is charged; (3) the first byte leaves. A crash
before (1) leaves keys and no charge: the restart recomputes the input, and nothing
of the first one ever left. Between (1) and (2) it leaves a stored input and no
charge: the restart charges it when it sends it (or deletes it, charge-free, if the
job ended meanwhile). After (2) it leaves both: the identical bytes go. So no crash
point charges without what is needed to send the same input, and none sends
another input for the job. A job's file goes when the job ends for the site
(answered, refused, or the coordinator moved on) and when the federation ends.

**A refusal that depends on the data is the job's release** (:meth:`SecureSteps.withhold`).
Once a job has started, whether its local work yields an input the site sends depends
on the data: an input outside the job's declared bound (``EncodingOverflow``), a
training step, statistics pass or evaluation that fails. The coordinator chooses the
bound and the model and may ask again, for free, with another: had the site
withdrawn at once and charged nothing, each such job would answer one question about
the data ("is any entry above B?") and a coordinator could bisect a statistic's
value without ever receiving a release. So the site answers the same way either
way: nothing happens before the masked step, which every started job reaches; there
the release is charged (as an upload would be) and only then does the withdrawal
go, its text a fixed sentence (:func:`spherecal.participant.failures.wire_reason`).
A coordinator that asks again for the same purpose meets the release ledger, as
after an upload; one that aborts the job before its masked step learns nothing,
since both outcomes look alike until then.

**A withheld input survives a restart of this process** (2026-11-27). The mark is
written to the job's held record before :meth:`SecureSteps.withhold` returns
(``held_jobs``, version 3: the cause's class name, not its text), and
:meth:`SecureSteps.restore_held` takes it up: the job stays withheld whatever the
local work yields afterwards — before, a site restarted between its local work and
the masked step ran the work again and sent what it now gave (a failed allocation
that did not fail twice, another draw of DP-SGD's noise that fitted the bound), a
second outcome for one job. The work itself does run again when the task comes
again, as it must for a job whose input was *set* before the restart (that input is
not kept: a plaintext statistic at rest beside its masking keys), so that the two
still look alike to a coordinator that watches a restarted site: the same downloads,
the same local work, the same answer to a masked step that comes before the task
(the input is not there yet: refused uncharged, :meth:`SecureSession.respond`). A
withheld job that skipped its work after a restart would be told from a set one by
its missing downloads, before any masked step, for free — what :meth:`settled`
forbids within one process.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal import crypto
from spherecal.participant.failures import InputWithheld, unforeseen
from spherecal.participant.faults import Halter
from spherecal.participant.held_jobs import MASKED_SUFFIX, HeldJobError, HeldJobStore
from spherecal.participant.held_upload import store_masked, task_of
from spherecal.participant.policy import EvaluationsExhausted, PolicySettings, ReleaseRepeated
from spherecal.participant.release_ledger import REFUSAL, ReleaseLedger
from spherecal.participant.secure_session import SecureSession, SqliteJobLedger
from spherecal.participant.transport import Transport, TransportError
from spherecal.participant.trust import DirectoryTrust, UntrustedDirectory
from spherecal.proto import spherecal_pb2 as pb

__all__ = ["EarlyShare", "SecureSteps"]

Refuse = Callable[[str, BaseException], None]

TRANSPORT_RETRY_S = 0.5
"""Pause before polling again when the coordinator was briefly unreachable while the
participant waited for a share step (the wait's own bound still applies)."""


@dataclass(frozen=True)
class EarlyShare:
    """How waiting for a job's share step ended (:meth:`SecureSteps.answer_share`)."""

    proceed: bool
    """Do the local work: the job is still this participant's (shares answered, or
    the step did not come within the wait and is answered after the work)."""
    deferred: pb.Instruction | None = None
    """An instruction that arrived meanwhile, for the main loop to act on next (a
    later step of this job, or — the coordinator moved on — the next task or
    ``Done``)."""


class SecureSteps:
    """The live secure-aggregation sessions of one participant process."""

    def __init__(
        self,
        *,
        participant_id: str,
        identity: Ed25519PrivateKey,
        ledger: crypto.JobLedger,
        trust: DirectoryTrust,
        transport: Transport,
        halter: Halter,
        releases: ReleaseLedger,
        policy: PolicySettings,
        caller: Callable[[], pb.Caller],
        refuse: Refuse,
        log: Callable[[str], None],
        poll_ms: int = 2000,
        corrupt_shares: bool = False,
        store: HeldJobStore | None = None,
        federation: Callable[[], str] = lambda: "",
        colluders: int = 0,
    ) -> None:
        self.pid = participant_id
        self.identity = identity
        self.ledger = ledger
        self.trust = trust
        self.transport = transport
        self.halter = halter
        self.releases = releases
        # the members this site assumes collude with the coordinator ([privacy]
        # colluders) raise the threshold it accepts: 2t > holders + colluders, or the
        # coordinator and they split its honest holders into two signed survivor sets
        # and read its input (tests/security/test_colluding_holders.py)
        self.policy = policy.secagg(colluders=colluders)
        self.min_local_work_s = float(policy.min_local_work_s)
        self.share_wait_s = float(policy.share_wait_s)
        self.poll_ms = poll_ms
        self._deferred: pb.Instruction | None = None
        self._started: dict[bytes, float] = {}
        self._withheld: dict[bytes, tuple[str, InputWithheld]] = {}
        """Started jobs whose input will not be sent, with the task and the reason:
        answered at the masked step, charged (:meth:`withhold`)."""
        self._pinned: dict[bytes, InputWithheld] = {}
        """Jobs whose input was withheld before this process started (their held-job
        record says so, :meth:`restore_held`): not settled until their local work ran
        again in this process — as a set input's job must after a restart (module
        docstring) — and then withheld whatever it yields (:meth:`set_input`)."""
        self.caller = caller
        self.refuse = refuse
        self.log = log
        self.corrupt_shares = corrupt_shares
        self.jobs: dict[bytes, SecureSession] = {}
        self.store = store
        """The held-jobs folder (``held_jobs``): None keeps job sessions in memory only."""
        self.federation = federation

    @property
    def overlaps_local_work(self) -> bool:
        """Whether a statistics job's local work may run while its keys and shares
        are exchanged (``spherecal.participant.statistics_task``): only where the
        masked upload's moment, which follows the local work, is not held back
        (``[policy] min_local_work_s = 0``) — a site that hides its local work's
        duration keeps keys, shares, then the work, strictly in that order."""
        return self.min_local_work_s == 0

    def clear(self) -> None:
        """Forget every session in memory (another federation never continues an old
        job); their files go with :meth:`restore_held` or :meth:`end_federation`."""
        self.jobs.clear()
        self._started.clear()
        self._withheld.clear()
        self._pinned.clear()
        self._deferred = None

    def end_federation(self) -> None:
        """The federation ended: no job of it is answered again; delete the files."""
        self.clear()
        if self.store is not None:
            try:
                self.store.clear()
            except OSError as exc:
                self.log(f"could not delete the held jobs in {self.store.folder}: {exc}")

    # ---------------------------------------------------------------- restarts
    def restore_held(self, federation: str) -> int:
        """After this process started: take up the jobs of ``federation`` whose masked
        input left before the restart (``held_jobs``), so their remaining steps are
        answered; files of other federations, and any that cannot be used (altered,
        untrusted directory, refused by the policy), are deleted with a log line.
        Returns how many jobs were restored."""
        store = self.store
        if store is None:
            return 0
        restored = 0
        for job_id in store.job_ids():
            if job_id in self.jobs:
                continue
            label = f"held job {job_id.hex()[:8]}"
            try:
                record = store.load(job_id)
                if record.federation != federation:
                    self.log(f"{label} belongs to another federation; deleting it")
                    store.delete(job_id)
                    continue
                session = SecureSession.restore(
                    record,
                    participant_id=self.pid,
                    identity=self.identity,
                    trust=self.trust,
                    policy=self.policy,
                )
            except (HeldJobError, crypto.SecAggError, UntrustedDirectory, OSError) as exc:
                self.log(f"{label} cannot be used ({type(exc).__name__}: {exc}); deleting it")
                store.delete(job_id)
                continue
            if session.masked_seals is not None:
                try:
                    store.check_masked(job_id, session.masked_seals)
                except (HeldJobError, OSError) as exc:
                    # the record still answers the later stages; only a cut upload
                    # cannot be repeated
                    self.log(f"{label}: its stored masked input cannot be used ({exc})")
                    session.masked_seals = None
            self.jobs[job_id] = session
            self._keys_out(job_id)  # what it sent goes again: the claim is final
            restored += 1
            if record.withheld is not None:
                self._pinned[job_id] = InputWithheld(record.withheld)
                how = (
                    f"its input was withheld ({record.withheld}): its local work runs again "
                    "when its task comes again, as a set input's would, and the job is "
                    "answered withheld at its masked step whatever the work yields"
                )
            elif session.masked_seals is not None:
                how = (
                    "its masked input is stored: if its upload was cut, the same bytes go "
                    "again; its remaining steps are answered"
                )
            elif session.client.input_left:
                how = "its masked input left before, so only its remaining steps are answered"
            else:
                how = (
                    "with the keys it advertised; its input is computed when its task comes "
                    "again and masked once"
                )
            self.log(
                f"job {job_id.hex()[:8]}: restored after this site's restart "
                f"({session.purpose}, at {session.client.stage.value}); {how}"
            )
        for job_id in store.job_ids(MASKED_SUFFIX):
            if job_id not in self.jobs:  # stored, then killed before its record was
                self.log(f"held masked input {job_id.hex()[:8]} has no job record; deleting it")
                store.delete(job_id)
            elif self.jobs[job_id].masked_seals is None:
                # written, then killed before the record naming it (and dropping the
                # keys) was: nothing was charged or sent; the input is masked again
                self.log(f"held masked input {job_id.hex()[:8]} is not its record's; deleting it")
                store.delete_masked(job_id)
        return restored

    def _keep(self, session: SecureSession) -> bool:
        """Write the session to the held-jobs folder before its next message leaves;
        True: the message may go.

        A failed write costs durability only *if the folder then holds nothing of the
        job*: its record is deleted and the message goes (a restart loses the job, as
        without the folder). Where the record can be neither written nor deleted — a
        filesystem remounted read-only after an I/O error fails both — the folder still
        holds the job's earlier record, and a restarted process would answer this stage
        again from it, differently: a second survivor set signed, a second unmask
        answer in which a survivor of the first is a dropout, so both kinds of that
        peer's shares (``tests/security/test_held_write_failure.py``). Then the message
        must not go: False, and the caller withdraws. (Until 2026-11-27 it went
        either way.)"""
        if self.store is None:
            return True
        label = f"job {session.job_id.hex()[:8]}"
        record = session.record(self.federation())
        withheld = self._withheld_cause(session.job_id)
        if withheld is not None:
            record = dataclasses.replace(record, withheld=withheld)
        try:
            self.store.save(session.job_id, record)
            return True
        except OSError as exc:
            failed = exc
        try:
            self.store.delete_record(session.job_id)
        except OSError as gone:
            self.log(
                f"{label}: could not write its held state ({failed}) nor delete its "
                f"earlier record ({gone}); it withdraws rather than send what a restart "
                "of this site could answer again differently"
            )
            return False
        self.log(
            f"{label}: could not write its held state ({failed}); its record is deleted, "
            "so a restart of this site would lose the job"
        )
        return True

    def _unkept(self, session: SecureSession) -> HeldJobError:
        """Why the site withdraws when :meth:`_keep` says no (a fixed sentence: it is
        about the site's disk, not its data)."""
        return HeldJobError(
            f"job {session.job_id.hex()[:8]}: its held state could be neither written nor "
            "deleted; this site withdraws rather than send a message a restart could "
            "answer differently"
        )

    def _withheld_cause(self, job_id: bytes) -> str | None:
        """The class name of the reason the job's input is withheld, to be kept in its
        held record (None: not withheld)."""
        if job_id in self._withheld:
            return self._withheld[job_id][1].cause_name
        pinned = self._pinned.get(job_id)
        return None if pinned is None else pinned.cause_name

    def _keys_out(self, job_id: bytes) -> None:
        """The job's keys leave now: its claim in the job ledger becomes final
        (``SqliteJobLedger.keys_out``; other ledgers make every claim final)."""
        if isinstance(self.ledger, SqliteJobLedger):
            self.ledger.keys_out(self.pid, job_id)

    def _drop(self, job_id: bytes) -> None:
        """The job ends for this participant: forget it and delete its file. Its
        participant is closed (secrets dropped, the input buffer kept zeroed for the
        next job, ``SecAggParticipant.close``)."""
        session = self.jobs.pop(job_id, None)
        if session is not None:
            session.client.close()
        self._started.pop(job_id, None)
        self._withheld.pop(job_id, None)
        self._pinned.pop(job_id, None)
        if self.store is not None:
            try:
                self.store.delete(job_id)
            except OSError as exc:
                self.log(f"job {job_id.hex()[:8]}: could not delete its held state: {exc}")

    def take_deferred(self) -> pb.Instruction | None:
        """The instruction that ended a share wait, if one is pending: the main loop
        acts on it before polling again."""
        instruction, self._deferred = self._deferred, None
        return instruction

    # ---------------------------------------------------------------- start
    def start(
        self,
        task_id: str,
        job: pb.SecAggJob,
        *,
        round_index: int | None,
        expected_length: int,
        release: str | None = None,
        overlapped: bool = False,
        donates_input: bool = False,
    ) -> SecureSession | None:
        """Validate the job against this participant's policy, claim it, advertise
        keys and answer the share step — before any local work. None when refused
        (already reported) or when the coordinator moved on meanwhile: the caller
        then skips the local work.

        ``donates_input``: the caller will give its input vector up
        (:meth:`set_input` with ``donate``), so no buffer is prepared for the
        encoding (:meth:`_prepare_input`): in a 64-bit ring it goes into the vector's
        own memory.

        A job this participant already holds (the coordinator restarted and
        continues it) is not started again: what it sent is sent again, byte for
        byte, and the local work runs only if the input was not computed yet
        (:meth:`continue_held`)."""
        try:
            held = self.held(job)
        except crypto.JobReplayed as exc:
            self.refuse(task_id, exc)
            return None
        if held is not None:
            return self.continue_held(held, donates_input=donates_input)
        try:
            session = SecureSession(
                job,
                participant_id=self.pid,
                identity=self.identity,
                ledger=self.ledger,
                trust=self.trust,
                round_index=round_index,
                policy=self.policy,
                release=release,
                corrupt_shares=self.corrupt_shares,
            )
            if session.spec.length != expected_length:
                raise crypto.WrongLength(
                    f"job length {session.spec.length} is not the expected {expected_length}"
                )
        except (crypto.SecAggError, UntrustedDirectory) as exc:
            self.refuse(task_id, exc)
            return None
        advert = session.advertise()
        self.jobs[session.job_id] = session
        if not self._keep(session):  # the keys, before the advertisement of them leaves
            self.abandon(task_id, session, self._unkept(session))
            return None
        self.halter.check(
            "advertise", purpose=session.purpose, round_index=round_index, what=task_id
        )
        self._keys_out(session.job_id)
        self._started[session.job_id] = time.monotonic()
        self._submit(session, pb.ADVERTISE, advert)
        self.log(f"job {session.job_id.hex()[:8]}: advertised keys ({session.purpose})")
        early = self.answer_share(
            session, wait_s=self.share_wait_s, poll_ms=self.poll_ms, overlapped=overlapped
        )
        if early.deferred is not None:
            self._deferred = early.deferred
        if early.proceed:
            self._prepare_input(session, donates_input=donates_input)
        return session if early.proceed else None

    def held(self, job: pb.SecAggJob) -> SecureSession | None:
        """The live session of ``job``, if this participant holds one; raises
        ``JobReplayed`` when it holds that job id under other terms.

        Why the terms: a held session is continued as it is — its input is encoded,
        noised and masked under the spec it was started with — while the task that
        arrives again reads its noise plan, limits and context from the spec it
        carries. A coordinator that broke a download after the keys left and sent the
        job again with the same id and another ``scale_bits`` had the site draw its
        noise in the new spec's units and add it to an encoding at the old scale:
        2^24 against 2^0 left the noise ≈ 10^-7 of its standard deviation. The same
        id admits the same spec and purpose only (refused at once: it depends on
        what the coordinator sent alone)."""
        try:
            spec = crypto.JobSpec.from_bytes(job.spec)
        except crypto.SecAggError:
            return None  # malformed: start() refuses it with its reason
        session = self.jobs.get(spec.job_id)
        if session is not None and (session.spec != spec or session.purpose != job.purpose):
            raise crypto.JobReplayed(
                f"job {spec.job_id.hex()[:8]} is already held by this site under another "
                "spec or purpose; a job id admits one set of terms"
            )
        return session

    def continue_held(
        self, session: SecureSession, *, donates_input: bool = False
    ) -> SecureSession | None:
        """Continue a job after the coordinator or this site restarted: resend what
        this participant already sent (the coordinator acknowledges an identical message
        it journaled), then the session if its local work is still to do, else None
        (its input is fixed or withheld, :meth:`settled`; the job's remaining steps
        come through the main loop). Nothing is recomputed and no second masked
        input exists: the masked upload, if asked again, is the same bytes from the
        same keys and input."""
        job = session.job_id
        self.log(f"job {job.hex()[:8]}: continuing it (the coordinator or this site restarted)")
        for stage, data in session.sent():
            self._submit(session, stage, data)
            if job not in self.jobs:
                return None  # refused (the coordinator moved on): logged by _submit
        if self.settled(session):
            return None
        if not session.has_sent(pb.SHARE):
            early = self.answer_share(session, wait_s=self.share_wait_s, poll_ms=self.poll_ms)
            if early.deferred is not None:
                self._deferred = early.deferred
            if not early.proceed:
                return None
        self._prepare_input(session, donates_input=donates_input)
        self._started[job] = time.monotonic()
        return session

    def _prepare_input(self, session: SecureSession, *, donates_input: bool = False) -> None:
        """The job's share step is answered (or not awaited) and its local work comes
        next: borrow the input's buffer now and fault its pages in
        (:meth:`crypto.SecAggParticipant.prepare_input`), so that ``set_input`` — between
        the local work and the masked upload — does not. Issue #24, measured in the FFC
        stage (10 sites on the 2-core box): ``set_input`` of a process's first 7.6 MB
        statistics input took 13.6–19.3 ms of CPU (518–838 page faults); prepared, it
        takes 1.0–2.1 ms, and this call 2.0–2.6 ms. Here and not right after the
        advertisement: the last site to advertise would then pay it between the stage's
        close and its share answer, on the share stage's critical path; after the share
        answer no message of the job waits for it. An optimisation only: a refusal here
        is logged and the job goes on (``set_input`` borrows as before).

        ``donates_input``: the caller will give its input up (``set_input`` with
        ``donate``); where the job's ring lets it be encoded in its own memory
        (``input_can_be_donated``) nothing is borrowed, since a prepared buffer would
        be used instead of it."""
        if session.job_id not in self.jobs or session.client.has_input:
            return
        if donates_input and session.client.input_can_be_donated:
            return
        try:
            session.client.prepare_input()
        except crypto.SecAggError as exc:
            self.log(f"job {session.job_id.hex()[:8]}: its input's buffer was not prepared: {exc}")

    def answer_share(
        self, session: SecureSession, *, wait_s: float, poll_ms: int, overlapped: bool = False
    ) -> EarlyShare:
        """Wait (long polls, at most ``wait_s``) for this job's share step and answer
        it, before any local work: the share answer's time then depends on the
        slowest *advertisement*, not on this participant's data.

        Any other instruction ends the wait: a later step of the same job is kept for
        after the local work; anything else means the coordinator moved on (the job
        failed or was abandoned), so the job is forgotten and its local work skipped
        — the instruction goes back to the main loop. If ``wait_s`` passes without
        the step, the local work runs first and the share step is answered afterwards
        from the main loop (as with ``share_wait_s = 0``), logged."""
        job = session.job_id
        deadline = time.monotonic() + wait_s
        while job in self.jobs:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if wait_s > 0:
                    self.log(
                        f"job {job.hex()[:8]}: no share step within share_wait_s = {wait_s:g} s;"
                        " local work first (its timing is not hidden)"
                    )
                return EarlyShare(proceed=True)
            request = pb.InstructionRequest(
                caller=self.caller(), wait_ms=max(1, min(poll_ms, math.ceil(remaining * 1000)))
            )
            try:
                instruction = self.transport.next_instruction(request)
            except TransportError as exc:
                if exc.session_expired or not exc.retryable:
                    raise
                time.sleep(min(TRANSPORT_RETRY_S, max(0.0, remaining)))
                continue
            kind = instruction.WhichOneof("kind")
            if kind == "wait" or kind is None:
                continue
            if task_of(instruction, job):
                continue  # the task again (a new session after a reconnect): still ours
            if kind == "secagg" and bytes(instruction.secagg.job_id) == job:
                if instruction.secagg.stage != pb.SHARE:
                    return EarlyShare(proceed=True, deferred=instruction)
                self.step(instruction.secagg)
                answered = job in self.jobs  # a refusal or a closed stage drops the job
                if answered:
                    when = "while the local work runs" if overlapped else "before the local work"
                    self.log(f"job {job.hex()[:8]}: shared keys {when}")
                return EarlyShare(proceed=answered)
            self.log(f"job {job.hex()[:8]}: the coordinator moved on before its share stage")
            self.forget(session)
            return EarlyShare(proceed=False, deferred=instruction)
        return EarlyShare(proceed=False)

    def await_next_step(self, session: SecureSession, work: Future[Any]) -> None:
        """While the overlapped local work runs (``statistics_task``): wait (long polls)
        for the job's next instruction and keep it for the main loop, so that the
        masked step is in hand the moment the input is set instead of one poll later
        (issue #24: that poll took 5–60 ms on the loaded 2-core box, and the last
        site's poll is on the job's critical path). Only a long poll happens early:
        nothing is computed or sent for the step before the input is set, and the
        main loop answers it exactly as it would have after polling itself.

        Returns when an instruction other than a wait (or the task again) arrived,
        when ``work`` finished without one (the main loop polls as before), when an
        instruction is already pending, or on a transport error (left to the main
        loop, which meets and handles it on its next poll)."""
        job = session.job_id
        while job in self.jobs and self._deferred is None and not work.done():
            request = pb.InstructionRequest(caller=self.caller(), wait_ms=self.poll_ms)
            try:
                instruction = self.transport.next_instruction(request)
            except TransportError:
                return
            kind = instruction.WhichOneof("kind")
            if kind == "wait" or kind is None or task_of(instruction, job):
                continue
            self._deferred = instruction
            return

    def set_input(
        self,
        task_id: str,
        session: SecureSession,
        vector: npt.NDArray[np.float64],
        *,
        noise: npt.NDArray[np.int64] | None = None,
        donate: bool = False,
    ) -> bool:
        """Fix the job's input once computed; False (reported) when it cannot be.
        With ``[policy] min_local_work_s`` it then waits until that long after the
        local work began, whatever the outcome (so the next messages' timing says
        nothing about the data; an encoding that fits and one that overflows differ
        by about a millisecond per million entries, so the wait comes after it).
        ``donate``: the caller gives ``vector`` up (its memory may hold the encoding,
        ``crypto.SecAggParticipant.set_input``)."""
        if session.job_id not in self.jobs:
            # the coordinator moved on during the local work: nothing to send, and no
            # withdrawal either (the job is over for it)
            self._hold_local_work(session)
            self.log(f"job {session.job_id.hex()[:8]}: ended before its input was set")
            return False
        pinned = self._pinned.get(session.job_id)
        if pinned is not None:
            # withheld before this site's restart: the work ran again (as a set input's
            # must, module docstring), but what it yields is never the job's input
            self.withhold(task_id, session, pinned)
            return False
        try:  # encoded before the hold: how long encoding takes is the data's too
            session.set_input(vector, noise=noise, donate=donate)
        except crypto.EncodingOverflow as exc:  # depends on the data: the job's release
            self.withhold(task_id, session, exc)  # (held there)
            return False
        except crypto.SecAggError as exc:  # the vector's length or dtype: not the data
            self._hold_local_work(session)
            self.abandon(task_id, session, exc)
            return False
        self._hold_local_work(session)
        return True

    def abandon(self, task_id: str, session: SecureSession | None, error: BaseException) -> None:
        """Withdraw from a task, and from its job if one was started, at once: for a
        refusal that depends only on what the coordinator sent (a job, a plan, a
        model this site will not work with). A refusal that depends on the data goes
        through :meth:`withhold`."""
        self.forget(session)
        self.refuse(task_id, error)

    def _hold_local_work(self, session: SecureSession) -> None:
        """With ``[policy] min_local_work_s``: return no earlier than that long after
        the job's local work began, whatever its outcome — an input set, withheld, or
        a job that ended meanwhile — so that when this site next speaks says nothing
        about its data. (Until 2026-11-27 only a computed input waited: local work
        that failed went back to the main loop at once, and a trap model that
        diverges on one record told, by the next poll's moment, whether any record
        had a pixel set.)"""
        started = self._started.pop(session.job_id, None)
        if self.min_local_work_s <= 0 or started is None:
            return
        left = started + self.min_local_work_s - time.monotonic()
        if left > 0:
            time.sleep(left)
        else:
            self.log(
                f"job {session.job_id.hex()[:8]}: local work took longer than "
                f"min_local_work_s = {self.min_local_work_s:g} s; its timing is not hidden"
            )

    def settled(self, session: SecureSession) -> bool:
        """Whether the job's local work is over for good: its input set, or withheld
        (:meth:`withhold`). A settled job asked again is continued — what was sent is
        sent again — and its local work is never run twice: run again, the
        downloads it makes (a model renamed outside the task's context misses the
        cache) and its moments would tell a coordinator that abandons the job which
        outcome the first run had, before any masked step, for free. (After this
        process's restart neither is settled until its work ran again here: a set
        input is not kept, and a withheld job must not look otherwise; module
        docstring.)"""
        return session.client.has_input or session.job_id in self._withheld

    def withhold(self, task_id: str, session: SecureSession, error: BaseException) -> None:
        """The started job's local work failed or its result will not be sent (outside
        the job's bound): a refusal that depends on the data, answered at the job's
        masked step and charged as the job's release there (module docstring), never
        at once and never for free. The session is kept until then; if the masked
        step is already in hand, the main loop answers it next. The mark is in the
        job's held record before this returns, so no restart of this process turns
        the job into one whose input is sent (module docstring); where the folder takes
        neither the record nor its deletion, nothing leaves now, and the masked step
        writes it again or refuses as it refuses a set input (:meth:`_release_withheld`)."""
        self._hold_local_work(session)
        trace = unforeseen(error)
        if trace is not None:  # a programming error shows in the site's log (failures)
            self.log(
                f"job {session.job_id.hex()[:8]}: the local work raised "
                f"{type(error).__name__}, which no foreseen failure is; withheld as any "
                f"failed local work:\n{trace}"
            )
        if session.job_id not in self.jobs:
            # the coordinator moved on before the masked step: nothing is answered —
            # a withdrawal now would tell it what an upload could not have
            self.log(
                f"job {session.job_id.hex()[:8]}: its input is withheld ({error}); the job "
                "ended before its masked step, so nothing is sent"
            )
            return
        pinned = self._pinned.pop(session.job_id, None)
        reason = pinned if pinned is not None else InputWithheld(error)
        self._withheld[session.job_id] = (task_id, reason)
        self._keep(session)  # durable before this returns
        if pinned is not None:
            also = "" if error is pinned else f" (and failed again: {error})"
            self.log(
                f"job {session.job_id.hex()[:8]}: its input was withheld before this "
                f"site's restart ({pinned.cause_name}); its local work ran again{also}, and "
                "what it yields is not sent: it withdraws at the job's masked step, counted "
                "as the job's release"
            )
            return
        self.log(
            f"job {session.job_id.hex()[:8]}: this site's input is withheld ({error}); "
            "it withdraws at the job's masked step, counted as the job's release"
        )

    def withheld(self, job_id: bytes) -> bool:
        """Whether the job's input is withheld (:meth:`withhold`)."""
        return job_id in self._withheld

    def _release_withheld(self, session: SecureSession, *, kept: bool) -> None:
        """The masked step of a job whose input is withheld: the steps of a set input's
        upload (:meth:`_upload_masked`) up to its first byte — the release checked, the
        job's held record written (withheld; the set input's: its masked input), the
        release charged — then the withdrawal in the upload's place, so each refusal on
        the way is the one a set input meets there. A crash after the charge leaves the
        charge (idempotent for one job) and the job's held record, still withheld: the
        restarted site withdraws again when the job's masked step comes after its task
        (charged once), whatever its local work yields then — never an input."""
        task_id, error = self._withheld.pop(session.job_id)
        job_hex = session.job_id.hex()
        if session.release is not None:
            try:  # first, as for a set input (_upload_masked): the same refusal, as soon
                self.releases.check_consumable(session.release)
            except (ReleaseRepeated, EvaluationsExhausted) as exc:
                self.abandon(job_hex, session, exc)
                return
        # ``kept``: the held record, withheld, written again at this step (:meth:`step`)
        # — where a set input's masked step stores its masked input
        # (held_upload.store_masked). A folder that can be neither written nor deleted
        # refuses a set input here, uncharged, under the job's id; a withheld one meets
        # the same refusal: until 2026-11-27 it was charged and withdrew with its own
        # kind and text, so a read-only disk told the coordinator which of the two the
        # input was, and the set one stayed uncharged to be asked again
        # (tests/security/test_held_write_failure.py)
        if not kept:
            self.abandon(job_hex, session, self._unkept(session))
            return
        if session.release is not None:
            try:
                self.releases.consume(session.release, answer=REFUSAL)
            except (ReleaseRepeated, EvaluationsExhausted) as exc:  # a concurrent job went first
                # refused exactly as a set input is at this point (_upload_masked: under
                # the job's id, uncharged); under the task's id it told, for free, which
                # of the two the input was
                self.abandon(job_hex, session, exc)
                return
        self.halter.check(
            "charged",
            purpose=session.purpose,
            round_index=session.round,
            what=session.job_id.hex(),
        )
        self.abandon(task_id, session, error)

    def forget(self, session: SecureSession | None) -> None:
        """Drop a started job's state (it answers nothing more in that job)."""
        if session is not None:
            self._drop(session.job_id)

    # ---------------------------------------------------------------- stages
    def _submit(self, session: SecureSession, stage: pb.SecAggStage, data: bytes) -> None:
        try:
            self.transport.submit_secagg(
                pb.SecAggSubmission(
                    caller=self.caller(), job_id=session.job_id, stage=stage, message=data
                )
            )
        except TransportError as exc:
            if exc.code is grpc.StatusCode.ALREADY_EXISTS:
                return
            if exc.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED):
                self.log(f"job {session.job_id.hex()[:8]} moved on without us: {exc.message}")
                self._drop(session.job_id)
                return
            raise

    def step(self, step: pb.SecAggStep) -> None:
        session = self.jobs.get(bytes(step.job_id))
        job_hex = bytes(step.job_id).hex()
        if session is None:
            self.refuse(job_hex, crypto.JobAborted("this participant holds no state for the job"))
            return
        stage_name = {
            pb.SHARE: "share",
            pb.MASKED: "masked",
            pb.CONSISTENCY: "consistency",
            pb.UNMASK: "unmask",
        }.get(step.stage)
        if stage_name is not None and stage_name != "masked":
            self.halter.check(
                stage_name, purpose=session.purpose, round_index=session.round, what=job_hex
            )
        withheld = step.stage == pb.MASKED and session.job_id in self._withheld
        # a repeated step gets the message already sent, whatever it now says
        repeated = session.has_sent(step.stage)
        # a withheld job's held record is written again where a set input's masked
        # input is stored, and its failure is met at the same point of the step
        # (:meth:`_release_withheld`); written before the bundle is taken, which moves
        # the session past the stage whose record holds its keys
        kept = self._keep(session) if withheld else True
        try:
            if withheld:  # the bundle is checked as for a set input, then the refusal
                session.take_share_bundle(step)
            else:
                out = session.respond(step)
        except crypto.SecAggError as exc:
            self._drop(session.job_id)
            complaint = getattr(exc, "complaint", None)
            if isinstance(complaint, crypto.ShareComplaint):
                self._complain(session, complaint)
            self.refuse(job_hex, exc)
            return
        if withheld:
            self._release_withheld(session, kept=kept)
            return
        if step.stage == pb.UNMASK and session.release is not None and not repeated:
            # the request this site answers, once: a repeat is answered with the first
            # answer, unchecked, so its survivor set is the coordinator's word alone
            self._record_survivors(session.release, bytes(step.message))
        if out is not None:
            # never deal other shares, sign or reveal twice, even across a restart
            if not self._keep(session):
                self._drop(session.job_id)
                self.refuse(job_hex, self._unkept(session))
                return
            self._submit(session, step.stage, out)
        else:
            self._upload_masked(session)
        if step.stage == pb.UNMASK:
            self._drop(session.job_id)

    def _record_survivors(self, release: str, message: bytes) -> None:
        """Store, with the release, the survivor set this site's input is summed with
        and who signed it (the unmask request carries both; the site answered it, so
        it was well formed): the site's own audit compares rosters from it."""
        request = crypto.UnmaskRequest.from_bytes(message)
        self.releases.record_survivors(
            release, list(request.survivors), [s.signer for s in request.signatures]
        )

    def _complain(self, session: SecureSession, complaint: crypto.ShareComplaint) -> None:
        """Send the signed complaint naming the dealer (best effort: the withdrawal
        follows either way)."""
        self.log(
            f"job {session.job_id.hex()[:8]}: shares of {complaint.dealer} failed; complaining"
        )
        try:
            self.transport.submit_secagg(
                pb.SecAggSubmission(
                    caller=self.caller(),
                    job_id=session.job_id,
                    stage=pb.COMPLAINT,
                    message=complaint.to_bytes(),
                )
            )
        except TransportError as exc:
            self.log(f"could not deliver the complaint: {exc.message}")

    def _upload_masked(self, session: SecureSession) -> None:
        """Stream the job's masked input: stored in the held-jobs folder (chunks,
        then the record naming their digest and no longer holding the keys), then
        charged to the release ledger, then sent — so any upload that started can be
        repeated bit for bit after a restart of this process, never with another
        input, and a crash between any two steps leaves either no charge or the
        stored input (see the module docstring). The bytes just stored go from
        memory (``stored_chunks``); a session that stored them before (restored, or
        the coordinator asks again after a delivered upload) streams the stored file;
        the ledger charge is idempotent for one job."""
        job_id = session.job_id
        if session.release is not None:
            try:  # before any masking: a refusal here comes as soon as a withheld one's
                self.releases.check_consumable(session.release)
            except (ReleaseRepeated, EvaluationsExhausted) as exc:  # a concurrent job went first
                self.abandon(job_id.hex(), session, exc)
                return
        if session.masked_seals is None and self.store is not None:
            try:
                refusal = store_masked(self.store, session, self.federation(), self.log)
            except crypto.SecAggError as exc:  # masking refused: a refusal, never an exit
                self.abandon(job_id.hex(), session, exc)
                return
            if refusal is not None:
                self.abandon(job_id.hex(), session, refusal)
                return
        self.halter.check(
            "stored", purpose=session.purpose, round_index=session.round, what=job_id.hex()
        )
        if session.release is not None:
            try:
                self.releases.consume(session.release)
            except (ReleaseRepeated, EvaluationsExhausted) as exc:  # a concurrent job went first
                self.abandon(job_id.hex(), session, exc)
                return
        self.halter.check(
            "charged", purpose=session.purpose, round_index=session.round, what=job_id.hex()
        )
        n = session.n_chunks
        stored = self.store is not None and session.masked_seals is not None
        if stored and session.resent:
            self.log(
                f"job {job_id.hex()[:8]}: sending its stored masked input again (its "
                "upload was cut by this site's restart)"
            )

        def chunks() -> Iterator[bytes]:
            if stored and session.stored_chunks is not None:
                yield from session.stored_chunks  # the bytes just stored, not read back
            elif stored:
                assert self.store is not None
                yield from self.store.masked_chunks(job_id)
            else:
                for index in range(n):
                    yield session.masked_chunk(index)

        def messages() -> Iterator[pb.MaskedUpload]:
            # A header first: a coordinator whose upload slots are all taken holds the
            # upload there until one frees, instead of refusing it after its first
            # chunk (an earlier version reads the header as an empty chunk, skipped)
            yield pb.MaskedUpload(caller=self.caller(), job_id=job_id)
            for index, chunk in enumerate(chunks()):
                if index == 1 or n == 1:
                    self.halter.check(
                        "masked",
                        purpose=session.purpose,
                        round_index=session.round,
                        what=job_id.hex(),
                    )
                yield pb.MaskedUpload(chunk=chunk)

        try:
            self.transport.upload_masked(messages())
            session.stored_chunks = None  # delivered: a repeat, if asked, reads the file
        except HeldJobError as exc:  # the stored input no longer reads back whole
            self.log(
                f"job {job_id.hex()[:8]}: its stored masked input cannot be read ({exc}); "
                "the job goes on without this site"
            )
            self._drop(job_id)
            return
        except TransportError as exc:
            if exc.code is grpc.StatusCode.ALREADY_EXISTS:
                return
            if exc.slots_busy:
                time.sleep(0.2 + random.random() * 0.5)  # coordinator busy: it re-asks
                return
            if exc.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED):
                self.log(f"job {job_id.hex()[:8]} closed its masked stage: {exc.message}")
                self._drop(job_id)
                return
            raise
