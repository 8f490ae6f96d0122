"""The site's held secure jobs on disk: what a restarted participant process needs to
answer the rest of a job whose masked input already left.

Why (issue #20): a job's per-job secrets live in the process. Killed after its
masked input left, a site used to lose them, so it could neither sign the survivor
set nor reveal its shares after its restart: its release stayed counted in its
ledger while the job went on without it — or failed, when it was needed for the
threshold. So before the masked input leaves (and again before each later message
is sent: the signed survivor set, the unmask answer) the session is written here;
a restarted process reads it back (``SecureSession.restore``) and answers the
coordinator's remaining steps for the *same* job id.

What is stored (:class:`HeldJob`): the job as received (spec and directory, checked
against the trust root again on restore), its purpose, round and release key, every
message already sent (answered again byte for byte, never recomputed: shares are
dealt at random), and :class:`spherecal.crypto.HeldState` — the shares this site
holds *for its neighbours*, the survivor set it signed, the unmask request it
answered. Not stored: its own job keys and its input (not needed once the masked
input left, see ``crypto.held_state``), nor any statistic.

How: one file per job, ``<state_dir>/held-jobs/<job id>.job``, mode 0600 in a 0700
folder, written atomically (temporary file, fsync, rename, fsync of the folder), and
sealed with AES-256-GCM under a key derived (HKDF-SHA256) from the site's identity
key, the participant id and the job id bound as associated data: a file that was
truncated, altered, copied from another job or sealed by another identity is refused
with :class:`CorruptHeldJob` rather than half-read. A file is deleted when its job
ends for the site (answered, refused, moved on without it) and when the federation
ends.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["FOLDER", "CorruptHeldJob", "HeldJob", "HeldJobError", "HeldJobStore"]

FOLDER = "held-jobs"
MAGIC = b"SPHERECAL-HELD-JOB 1\n"
NONCE_BYTES = 12
SUFFIX = ".job"


class HeldJobError(Exception):
    """A held job that cannot be used."""


class CorruptHeldJob(HeldJobError):
    """The file is not a sealed held job of this participant and this job."""


@dataclass(frozen=True)
class HeldJob:
    """One held job (see the module docstring)."""

    federation: str
    job: bytes
    """The ``pb.SecAggJob`` as received (spec, directory entries, purpose)."""
    round: int | None
    release: str | None
    sent: tuple[tuple[int, bytes], ...]
    """(``pb.SecAggStage``, message) of every message already sent, by stage."""
    state: bytes
    """``crypto.HeldState`` bytes."""

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "federation": self.federation,
                "job": self.job.hex(),
                "round": self.round,
                "release": self.release,
                "sent": [[stage, data.hex()] for stage, data in self.sent],
                "state": self.state.hex(),
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> HeldJob:
        try:
            doc: dict[str, Any] = json.loads(data)
            round_ = doc["round"]
            release = doc["release"]
            if round_ is not None and (not isinstance(round_, int) or isinstance(round_, bool)):
                raise TypeError("round must be an integer")
            if release is not None and not isinstance(release, str):
                raise TypeError("release must be a string")
            if not isinstance(doc["federation"], str):
                raise TypeError("federation must be a string")
            sent = tuple((int(stage), bytes.fromhex(hexed)) for stage, hexed in doc["sent"])
            return cls(
                federation=doc["federation"],
                job=bytes.fromhex(doc["job"]),
                round=round_,
                release=release,
                sent=sent,
                state=bytes.fromhex(doc["state"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptHeldJob(f"held job record is malformed: {exc}") from None


class HeldJobStore:
    """The held-jobs folder of one participant (see the module docstring)."""

    def __init__(self, state_dir: Path, participant_id: str, identity: Ed25519PrivateKey) -> None:
        self.folder = state_dir / FOLDER
        self.participant_id = participant_id
        secret = identity.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        self._key = HKDF(
            algorithm=hashes.SHA256(),
            length=32,
            salt=None,
            info=b"spherecal held-job store v1\x00" + participant_id.encode(),
        ).derive(secret)

    def path(self, job_id: bytes) -> Path:
        return self.folder / f"{job_id.hex()}{SUFFIX}"

    def _aad(self, job_id: bytes) -> bytes:
        return MAGIC + self.participant_id.encode() + b"\x00" + job_id

    def save(self, job_id: bytes, record: HeldJob) -> None:
        """Write (or replace) ``job_id``'s record atomically, durable on return."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self._key).encrypt(nonce, record.to_bytes(), self._aad(job_id))
        blob = MAGIC + bytes([len(job_id)]) + job_id + nonce + sealed
        final = self.path(job_id)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # a stale temporary file keeps its mode otherwise
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        self._sync_folder()

    def load(self, job_id: bytes) -> HeldJob:
        """``job_id``'s record; :class:`CorruptHeldJob` if it is not exactly what
        :meth:`save` wrote for this participant and job, FileNotFoundError if none."""
        blob = self.path(job_id).read_bytes()
        head = len(MAGIC)
        if not blob.startswith(MAGIC) or len(blob) < head + 1:
            raise CorruptHeldJob(f"{self.path(job_id)} is not a held-job file")
        n = blob[head]
        stored_id = blob[head + 1 : head + 1 + n]
        if stored_id != job_id:
            raise CorruptHeldJob(
                f"{self.path(job_id)} holds job {stored_id.hex()[:16]}, not {job_id.hex()[:16]}"
            )
        body = blob[head + 1 + n :]
        nonce, sealed = body[:NONCE_BYTES], body[NONCE_BYTES:]
        try:
            plain = AESGCM(self._key).decrypt(nonce, sealed, self._aad(job_id))
        except (InvalidTag, ValueError):
            raise CorruptHeldJob(
                f"{self.path(job_id)} fails its integrity check (altered, truncated, or "
                f"sealed by another identity than {self.participant_id!r})"
            ) from None
        return HeldJob.from_bytes(plain)

    def job_ids(self) -> list[bytes]:
        """Every job with a file here (names that are not a job id are ignored)."""
        if not self.folder.is_dir():
            return []
        out = []
        for entry in sorted(self.folder.iterdir()):
            if entry.suffix != SUFFIX or entry.name.startswith("."):
                continue
            try:
                out.append(bytes.fromhex(entry.stem))
            except ValueError:
                continue
        return out

    def delete(self, job_id: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(job_id).unlink()
            self._sync_folder()

    def clear(self) -> None:
        """Delete every held job (the federation ended) and stale temporary files."""
        if not self.folder.is_dir():
            return
        for entry in self.folder.iterdir():
            if entry.suffix == SUFFIX or entry.name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        self._sync_folder()

    def _sync_folder(self) -> None:
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
