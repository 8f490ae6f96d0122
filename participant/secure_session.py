"""The participant's side of one secure-aggregation job over the network.

Wraps ``crypto.SecAggParticipant`` with what a flaky network needs: every outgoing
message is cached by stage, so when a reply is lost and the coordinator repeats a
step the participant already acted on, it re-sends the *same* bytes (the coordinator
answers ALREADY_EXISTS if it had them) instead of computing a new message — never
two different messages for one stage, which could leak. Masked chunks are
deterministic (CTR seeking) and computed one at a time while streaming, so a
participant's memory is O(vector), and a broken upload can simply be retried.

Job ids are claimed in a persistent ledger (SQLite in the participant's state
directory) before any key is generated, so a coordinator cannot make a participant
run the same job id twice, even across restarts.

A session survives this process's restart from the moment its keys are made
(issue #20): :meth:`SecureSession.record` is what ``spherecal.participant.held_jobs``
writes, and :meth:`SecureSession.restore` rebuilds the session from it — the same
cached messages and a ``crypto`` participant resumed where it stood. Before its
masked input is stored, that participant holds the job's keys and masks its input,
recomputed by the restarted process, once it is set; after, it holds no keys, and
(:attr:`SecureSession.masked_seals`) the masked input as it was stored before its
upload began is what a restored session resends unchanged when the coordinator asks
for it again (the upload was cut) — it never computes one.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spherecal import crypto
from spherecal.crypto import JobSpec, ParticipantStage, SecAggParticipant
from spherecal.participant.held_jobs import HeldJob
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb

__all__ = ["SecureSession", "SqliteJobLedger", "corrupt"]


def corrupt(shares: crypto.ShareKeys) -> crypto.ShareKeys:
    """TEST ONLY (``corrupt_shares``): flip one ciphertext bit of every share dealt
    to another holder, so each holder's AES-GCM check fails and it complains."""
    out = []
    for share in shares.shares:
        if share.receiver != shares.sender:
            flipped = bytes([share.ciphertext[0] ^ 1]) + share.ciphertext[1:]
            share = dataclasses.replace(share, ciphertext=flipped)
        out.append(share)
    return dataclasses.replace(shares, shares=tuple(out))


class SqliteJobLedger:
    """``crypto.JobLedger`` that survives restarts.

    A claim is *pending* until :meth:`keys_out` marks that the job's keys are about
    to leave the site (its advertisement is sent): only then is a second run of the
    job refused. Why (issue #20): the claim is made before the keys exist, and the
    site holds the keys (``held_jobs``) before its advertisement leaves; a process
    killed between the claim and that moment has nothing on disk and sent nothing,
    so when its task comes again it runs the job as if for the first time instead of
    refusing it — a job whose keys never left was never run. (Without the pending
    state, that instant would lose the job for the site.)"""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS jobs (participant TEXT, job_id BLOB, "
            "PRIMARY KEY (participant, job_id))"
        )
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(jobs)")}
        if "pending" not in columns:  # a ledger written before: every claim is final
            self._conn.execute("ALTER TABLE jobs ADD COLUMN pending INTEGER NOT NULL DEFAULT 0")

    def claim(self, participant_id: str, job_id: bytes) -> None:
        with self._lock:
            row = self._conn.execute(
                "SELECT pending FROM jobs WHERE participant = ? AND job_id = ?",
                (participant_id, bytes(job_id)),
            ).fetchone()
            if row is not None and not row[0]:
                raise crypto.JobReplayed(
                    f"participant {participant_id!r} already ran job {bytes(job_id).hex()[:32]}; "
                    "a job id is never run twice"
                )
            self._conn.execute(
                "INSERT OR IGNORE INTO jobs (participant, job_id, pending) VALUES (?, ?, 1)",
                (participant_id, bytes(job_id)),
            )

    def keys_out(self, participant_id: str, job_id: bytes) -> None:
        """The job's keys are about to leave (or left, before a restart): the claim
        is final."""
        with self._lock:
            self._conn.execute(
                "INSERT INTO jobs (participant, job_id, pending) VALUES (?, ?, 0) "
                "ON CONFLICT (participant, job_id) DO UPDATE SET pending = 0",
                (participant_id, bytes(job_id)),
            )

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class SecureSession:
    """One job: construct (validates the spec and directory against this
    participant's policy, claims the job id), then :meth:`advertise` — before any
    local work, so the advertisement's timing says nothing about the data —, then
    :meth:`set_input` once the vector is computed, then :meth:`respond` to each step."""

    def __init__(
        self,
        job: pb.SecAggJob,
        *,
        participant_id: str,
        identity: Ed25519PrivateKey,
        ledger: crypto.JobLedger,
        trust: DirectoryTrust,
        vector: npt.NDArray[np.float64] | None = None,
        round_index: int | None = None,
        noise: npt.NDArray[np.int64] | None = None,
        policy: crypto.SecAggPolicy | None = None,
        release: str | None = None,
        corrupt_shares: bool = False,
    ) -> None:
        spec = JobSpec.from_bytes(job.spec)
        if vector is not None and spec.length != vector.shape[0]:
            raise crypto.WrongLength(
                f"job expects {spec.length} entries but this participant's input has "
                f"{vector.shape[0]}"
            )
        directory = trust.verify(job.directory, crypto.keys_needed(spec, participant_id))
        self.spec = spec
        self._job = job.SerializeToString()
        self.restored = False
        """Rebuilt from the site's held-jobs folder after a restart (:meth:`restore`)."""
        self.purpose = job.purpose
        self.round = round_index
        self.release = release
        """Release-ledger key consumed right before the masked input leaves."""
        self._corrupt = corrupt_shares
        self.client = SecAggParticipant(
            spec, participant_id, identity, directory, ledger=ledger, policy=policy
        )
        if vector is not None:
            self.set_input(vector, noise=noise)
        self._sent: dict[pb.SecAggStage, bytes] = {}
        self.masked_seals: str | None = None
        """``held_jobs.seals_digest`` of the masked input stored in the site's
        held-jobs folder before its upload began (None: not stored)."""
        self.resent = False
        """Restored with its masked input stored: an upload of it now is a repeat."""
        self.stored_chunks: list[bytes] | None = None
        """The masked chunks exactly as this process stored them (``held_upload``),
        kept until the upload completes so that it streams them from memory instead
        of reading the file back; None after a restart (the file is read)."""

    # ---------------------------------------------------------------- restarts
    def record(self, federation: str) -> HeldJob:
        """What a restarted process needs to go on with this job
        (``spherecal.participant.held_jobs``): taken before each message is sent
        (advertisement, shares, signature, unmask answer) and when the masked input
        is stored, before it leaves."""
        return HeldJob(
            federation=federation,
            job=self._job,
            round=self.round,
            release=self.release,
            sent=tuple((int(stage), data) for stage, data in sorted(self._sent.items())),
            state=self.client.held_state().to_bytes(),
            masked=self.masked_seals,
        )

    @classmethod
    def restore(
        cls,
        record: HeldJob,
        *,
        participant_id: str,
        identity: Ed25519PrivateKey,
        trust: DirectoryTrust,
        policy: crypto.SecAggPolicy | None = None,
    ) -> SecureSession:
        """The session of a job this site took part in before this process started.
        The directory is verified against the trust root and the spec against the
        site's policy again, as for a new job; the job id is not claimed again."""
        job = pb.SecAggJob.FromString(record.job)
        spec = JobSpec.from_bytes(job.spec)
        directory = trust.verify(job.directory, crypto.keys_needed(spec, participant_id))
        state = crypto.HeldState.from_bytes(record.state)
        self = cls.__new__(cls)
        self.spec = spec
        self._job = record.job
        self.restored = True
        self.purpose = job.purpose
        self.round = record.round
        self.release = record.release
        self._corrupt = False
        self.client = SecAggParticipant.resume(
            spec, participant_id, identity, directory, state, policy=policy
        )
        self._sent = {cast(pb.SecAggStage, stage): data for stage, data in record.sent}
        self.masked_seals = record.masked
        self.resent = record.masked is not None
        self.stored_chunks = None
        return self

    def set_input(
        self,
        vector: npt.NDArray[np.float64],
        *,
        noise: npt.NDArray[np.int64] | None = None,
        donate: bool = False,
    ) -> None:
        """Fix the job's input; ``donate``: the caller gives ``vector`` up, and it may
        be encoded in its own memory (``crypto.SecAggParticipant.set_input``)."""
        if self.spec.length != vector.shape[0]:
            raise crypto.WrongLength(
                f"job expects {self.spec.length} entries but this participant's input has "
                f"{vector.shape[0]}"
            )
        self.client.set_input(vector, noise=noise, donate=donate)

    @property
    def job_id(self) -> bytes:
        return self.spec.job_id

    @property
    def done(self) -> bool:
        return self.client.stage in (ParticipantStage.DONE, ParticipantStage.FAILED)

    def advertise(self) -> bytes:
        if pb.ADVERTISE not in self._sent:
            self._sent[pb.ADVERTISE] = self.client.advertise_keys().to_bytes()
        return self._sent[pb.ADVERTISE]

    def sent(self) -> list[tuple[pb.SecAggStage, bytes]]:
        """Every message already sent in this job, in stage order (to send again,
        identical, to a coordinator that restarted)."""
        return sorted(self._sent.items())

    def has_sent(self, stage: pb.SecAggStage) -> bool:
        return stage in self._sent

    def respond(self, step: pb.SecAggStep) -> bytes | None:
        """The message to submit for ``step`` (SHARE/CONSISTENCY/UNMASK), or None for
        MASKED (the caller then streams :meth:`masked_chunks`)."""
        stage = step.stage
        if stage in self._sent:
            return self._sent[stage]
        data = bytes(step.message)
        if stage == pb.SHARE:
            shares = self.client.share_keys(crypto.KeyRoster.from_bytes(data))
            out = (corrupt(shares) if self._corrupt else shares).to_bytes()
        elif stage == pb.MASKED:
            if self.masked_seals is not None:
                return None  # the stored bytes go again, identical (secure_jobs)
            if self.client.input_left:
                raise crypto.OutOfStage(
                    "this site's masked input for the job left before its restart and "
                    "was not stored; a job's masked input is never computed twice"
                )
            if not self.client.has_input:
                # the local work comes with the task (a restarted site gets it again);
                # nothing is masked, and nothing charged, without the input
                raise crypto.OutOfStage("the masked stage came before this site's input")
            self.take_share_bundle(step)
            return None
        elif stage == pb.CONSISTENCY:
            request = crypto.ConsistencyRequest.from_bytes(data)
            out = self.client.consistency_signature(request).to_bytes()
        elif stage == pb.UNMASK:
            out = self.client.unmask(crypto.UnmaskRequest.from_bytes(data)).to_bytes()
        else:
            raise crypto.OutOfStage(f"unknown secure-aggregation stage {stage}")
        self._sent[stage] = out
        return out

    def take_share_bundle(self, step: pb.SecAggStep) -> None:
        """Check and take the MASKED step's share bundle (once). A job whose input is
        withheld takes it too, before its refusal is charged: a bundle that fails
        (malformed, a forged share, too few survivors) then ends the job with the same
        uncharged refusal whatever the input's fate — checked only for a set input,
        a coordinator sending a bad bundle read "input fits" for free and "input
        withheld" for one charge (``SecureSteps.step``)."""
        stage = self.client.stage
        if stage in (ParticipantStage.ADVERTISE, ParticipantStage.SHARE):
            # the masked step before this site's share answer (sent during its share
            # wait, say): out of order whatever the input — it used to pass for a set
            # input and end the process when its masking found the wrong stage
            raise crypto.OutOfStage(
                f"the masked step came before this site's share answer (at {stage.value})"
            )
        if stage is ParticipantStage.RECEIVE_SHARES:
            self.client.receive_shares(crypto.ShareBundle.from_bytes(bytes(step.message)))

    @property
    def n_chunks(self) -> int:
        return self.spec.n_chunks

    def masked_chunk(self, index: int) -> bytes:
        return self.client.masked_chunk(index).to_bytes()

    def masked_chunks(self) -> Iterator[bytes]:
        for index in range(self.spec.n_chunks):
            yield self.masked_chunk(index)
