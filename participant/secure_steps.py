"""The participant's secure-aggregation jobs over the network: start one (advertise
first), fix its input, answer each stage, stream the masked input.

Why advertise first: the moment a participant advertises its keys is recorded by
the coordinator (audit table). If it advertised after training or computing its
statistics, that moment would reveal how long the local work took — and with it
the number of local examples (issue #9 measured a correlation of 0.9). So a job is
started and advertised as soon as the task arrives, the local work runs afterwards,
and :meth:`SecureSteps.set_input` fixes the vector (``crypto`` allows it at any
stage before unmasking).

Why here, not in the runner: one idea per module — the runner decides *what* to
compute; this module owns the job sessions, the release consumption at the moment
the input leaves (:mod:`participant.releases`), and complaints: a share that fails
authentication is answered with the signed complaint naming its dealer (stage
``COMPLAINT``) before the typed withdrawal, so the coordinator can exclude the dealer
when it retries.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import crypto
from proto import spherecal_pb2 as pb

from .faults import Halter
from .policy import PolicySettings, ReleaseRepeated
from .releases import ReleaseLedger
from .secure import SecureSession
from .transport import Transport, TransportError
from .trust import DirectoryTrust, UntrustedDirectory

__all__ = ["SecureSteps"]

Refuse = Callable[[str, BaseException], None]


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
        corrupt_shares: bool = False,
    ) -> None:
        self.pid = participant_id
        self.identity = identity
        self.ledger = ledger
        self.trust = trust
        self.transport = transport
        self.halter = halter
        self.releases = releases
        self.policy = policy.secagg()
        self.min_local_work_s = float(policy.min_local_work_s)
        self._started: dict[bytes, float] = {}
        self.caller = caller
        self.refuse = refuse
        self.log = log
        self.corrupt_shares = corrupt_shares
        self.jobs: dict[bytes, SecureSession] = {}

    def clear(self) -> None:
        self.jobs.clear()
        self._started.clear()

    # ---------------------------------------------------------------- start
    def start(
        self,
        task_id: str,
        job: pb.SecAggJob,
        *,
        round_index: int | None,
        expected_length: int,
        release: str | None = None,
    ) -> SecureSession | None:
        """Validate the job against this participant's policy, claim it, advertise
        keys — before any local work. None when refused (already reported)."""
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
        self.halter.check(
            "advertise", purpose=session.purpose, round_index=round_index, what=task_id
        )
        self.jobs[session.job_id] = session
        self._started[session.job_id] = time.monotonic()
        self._submit(session, pb.ADVERTISE, session.advertise())
        self.log(f"job {session.job_id.hex()[:8]}: advertised keys ({session.purpose})")
        return session

    def set_input(
        self,
        task_id: str,
        session: SecureSession,
        vector: npt.NDArray[np.float64],
        *,
        noise: npt.NDArray[np.int64] | None = None,
    ) -> bool:
        """Fix the job's input once computed; False (reported) when it cannot be.
        With ``[policy] min_local_work_s`` it first waits until that long after the
        task arrived (so the next messages' timing says nothing about the data)."""
        started = self._started.pop(session.job_id, None)
        if self.min_local_work_s > 0 and started is not None:
            left = started + self.min_local_work_s - time.monotonic()
            if left > 0:
                time.sleep(left)
            else:
                self.log(
                    f"job {session.job_id.hex()[:8]}: local work took longer than "
                    f"min_local_work_s = {self.min_local_work_s:g} s; its timing is not hidden"
                )
        try:
            session.set_input(vector, noise=noise)
        except crypto.SecAggError as exc:
            self.abandon(task_id, session, exc)
            return False
        return True

    def abandon(self, task_id: str, session: SecureSession | None, error: BaseException) -> None:
        """Withdraw from a task, and from its job if one was started (the local work
        failed or was refused)."""
        self.forget(session)
        self.refuse(task_id, error)

    def forget(self, session: SecureSession | None) -> None:
        """Drop a started job's state (it answers nothing more in that job)."""
        if session is not None:
            self.jobs.pop(session.job_id, None)
            self._started.pop(session.job_id, None)

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
                self.jobs.pop(session.job_id, None)
                return
            raise

    def step(self, step: pb.SecAggStep) -> None:
        session = self.jobs.get(bytes(step.job_id))
        job_hex = bytes(step.job_id).hex()
        if session is None:
            self.refuse(job_hex, crypto.JobAborted("this participant holds no state for the job"))
            return
        stage_name = {pb.SHARE: "share", pb.MASKED: "masked", pb.UNMASK: "unmask"}.get(step.stage)
        if stage_name is not None and stage_name != "masked":
            self.halter.check(
                stage_name, purpose=session.purpose, round_index=session.round, what=job_hex
            )
        try:
            out = session.respond(step)
        except crypto.SecAggError as exc:
            self.jobs.pop(session.job_id, None)
            complaint = getattr(exc, "complaint", None)
            if isinstance(complaint, crypto.ShareComplaint):
                self._complain(session, complaint)
            self.refuse(job_hex, exc)
            return
        if out is not None:
            self._submit(session, step.stage, out)
        else:
            self._upload_masked(session)
        if step.stage == pb.UNMASK:
            self.jobs.pop(session.job_id, None)

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
        job_id = session.job_id
        if session.release is not None:
            try:
                self.releases.consume(session.release)
            except ReleaseRepeated as exc:  # a concurrent job was released first
                self.abandon(job_id.hex(), session, exc)
                return
        n = session.n_chunks

        def messages() -> Iterator[pb.MaskedUpload]:
            for index in range(n):
                if index == 1 or n == 1:
                    self.halter.check(
                        "masked",
                        purpose=session.purpose,
                        round_index=session.round,
                        what=job_id.hex(),
                    )
                chunk = session.masked_chunk(index)
                if index == 0:
                    yield pb.MaskedUpload(caller=self.caller(), job_id=job_id, chunk=chunk)
                else:
                    yield pb.MaskedUpload(chunk=chunk)

        try:
            self.transport.upload_masked(messages())
        except TransportError as exc:
            if exc.code is grpc.StatusCode.ALREADY_EXISTS:
                return
            if exc.slots_busy:
                time.sleep(0.2 + random.random() * 0.5)  # coordinator busy: it re-asks
                return
            if exc.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED):
                self.log(f"job {job_id.hex()[:8]} closed its masked stage: {exc.message}")
                self.jobs.pop(job_id, None)
                return
            raise
