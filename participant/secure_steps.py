"""The participant's secure-aggregation steps: start a job, answer each stage, upload masked.

A mixin of :class:`participant.runner.ParticipantRunner`, in its own module so that
the runner stays one idea (the instruction loop) — the methods here were moved whole.
What makes a step safe is in :class:`participant.secure.SecureSession` and
:mod:`crypto`; this is the plumbing between them and the transport: a job the
coordinator already moved past is dropped quietly, busy upload slots are retried when
the coordinator asks again, and any protocol error is refused with its typed kind.
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
from .secure import SecureSession
from .transport import Transport, TransportError
from .trust import DirectoryTrust, UntrustedDirectory

__all__ = ["SecureAggregationSteps"]


class SecureAggregationSteps:
    """Secure-aggregation steps; the runner provides the state named below."""

    pid: str
    identity: Ed25519PrivateKey
    ledger: crypto.JobLedger
    trust: DirectoryTrust
    transport: Transport
    halter: Halter
    jobs: dict[bytes, SecureSession]
    log: Callable[[str], None]

    def _caller(self) -> pb.Caller:
        raise NotImplementedError  # ParticipantRunner's

    def _refuse(self, task_id: str, error: BaseException) -> None:
        raise NotImplementedError  # ParticipantRunner's

    # ---------------------------------------------------------------- secure aggregation
    def _start_secure(
        self,
        task_id: str,
        job: pb.SecAggJob,
        vector: npt.NDArray[np.float64],
        round_index: int | None,
        expected_length: int,
        *,
        noise: npt.NDArray[np.int64] | None = None,
    ) -> None:
        try:
            session = SecureSession(
                job,
                participant_id=self.pid,
                identity=self.identity,
                ledger=self.ledger,
                trust=self.trust,
                vector=vector,
                round_index=round_index,
                noise=noise,
            )
            if session.spec.length != expected_length:
                raise crypto.WrongLength(
                    f"job length {session.spec.length} is not the expected {expected_length}"
                )
        except (crypto.SecAggError, UntrustedDirectory) as exc:
            self._refuse(task_id, exc)
            return
        self.halter.check(
            "advertise", purpose=session.purpose, round_index=round_index, what=task_id
        )
        self.jobs[session.job_id] = session
        self._submit(session, pb.ADVERTISE, session.advertise())

    def _submit(self, session: SecureSession, stage: pb.SecAggStage, data: bytes) -> None:
        try:
            self.transport.submit_secagg(
                pb.SecAggSubmission(
                    caller=self._caller(), job_id=session.job_id, stage=stage, message=data
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

    def _secagg_step(self, step: pb.SecAggStep) -> None:
        session = self.jobs.get(bytes(step.job_id))
        job_hex = bytes(step.job_id).hex()
        if session is None:
            self._refuse(job_hex, crypto.JobAborted("this participant holds no state for the job"))
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
            self._refuse(job_hex, exc)
            return
        if out is not None:
            self._submit(session, step.stage, out)
        else:
            self._upload_masked(session)
        if step.stage == pb.UNMASK:
            self.jobs.pop(session.job_id, None)

    def _upload_masked(self, session: SecureSession) -> None:
        job_id = session.job_id
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
                    yield pb.MaskedUpload(caller=self._caller(), job_id=job_id, chunk=chunk)
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
