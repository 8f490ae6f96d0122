"""What left this site in plaintext (``allow_plaintext``), kept so that the same task
asked again gets the same bytes.

Why (2026-11-27): a plaintext release is keyed ``task-<task id>`` in the release
ledger, and a key admits the one value that left under it (``site_releases.value``,
the SHA-256 of what left): a coordinator that restarted asks the same task again —
the same task id and seed (``coordinator.driver.stages.task_id``) — and a site that
computes the same bytes again sends them again. Local DP-SGD does not: each training
draws fresh noise, so the second value differed from the first, the ledger refused
it (``RULE_RELEASE_REPEATED``), and the round went on without the site. A secure job
stores its masked input and sends those very bytes again (``held_jobs``); a plaintext
release now does the same: the bytes that leave are kept before the first of them
leaves, and the same task asked again is answered with them — nothing is trained,
noised or charged again (:func:`spherecal.participant.training_task.train_task`,
:func:`spherecal.participant.statistics_task.statistics_task`). The order is the
masked upload's: kept, charged, sent; a crash between any two leaves the kept bytes,
which the same task then sends (charged then, once).

What is kept (:class:`SentPlaintext`): the release's ledger key, the federation, the
digest of the task it answered (:func:`task_digest`: the task's content as the secure
jobs' binding digests it, ``proto.task_context``, and the training seed), the vector
as float64 bytes and the update's metadata. Only the same task gets it: the same task
id with another seed is another value of the release, computed and refused by the
ledger as before. One file per kind (``update``, ``ffc``, ``ccvr``), the latest
release of that kind: a restarted coordinator resumes after its last completed round
and asks only the task then in flight again, and a file per round would hold the
model's size once per round until the federation ends. A file of another release or
task is replaced by the next upload of its kind.

Is it new material at rest? What is kept left the site in the clear: the coordinator
holds it. It is sealed as the held masked input is — AES-256-GCM under a key derived
(HKDF-SHA256) from the site's identity key with its own label, the participant id and
the kind bound as associated data — in a 0700 folder, mode 0600, written atomically
(temporary file, fsync, rename, fsync of the folder). A file that fails its check is
not used (deleted, logged): the task is then computed again, as before. The files go
when the federation ends, and those of another federation when the site joins one.
A site process that holds no jobs on disk (``ParticipantRunner(hold_jobs=False)``: a
host of virtual participants, which restarts none) keeps them in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from spherecal.participant.held_jobs import sealing_key
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.task_context import task_context
from spherecal.spherefed.durable import fsync_folder, write_durably

__all__ = ["FOLDER", "SentPlaintext", "SentPlaintextStore", "task_digest"]

FOLDER = "sent-plaintext"
MAGIC = b"SPHERECAL-SENT-PLAINTEXT 1\n"
SUFFIX = ".sent"
NONCE_BYTES = 12
_TASK_DOMAIN = b"spherecal sent plaintext task v1\x00"


def task_digest(task: pb.TrainTask | pb.StatisticsTask, plan: pb.Plan) -> bytes:
    """What a kept release answers: the task's content under ``plan``
    (:func:`~spherecal.proto.task_context.task_context`, which leaves the seed out)
    and, for training, its seed — everything the value is computed from that the
    coordinator sends (module docstring)."""
    h = hashlib.sha256(_TASK_DOMAIN + task_context(task, plan))
    if isinstance(task, pb.TrainTask):
        h.update(int(task.seed).to_bytes(8, "big", signed=True))
    return h.digest()


@dataclass(frozen=True)
class SentPlaintext:
    """One plaintext release as it left (module docstring)."""

    federation: str
    release: str
    """Its release-ledger key (``task-<task id>``)."""
    task: bytes
    """:func:`task_digest` of the task it answered."""
    vector: npt.NDArray[np.float64]
    meta: pb.UpdateMeta | None

    def to_bytes(self) -> bytes:
        vector = np.ascontiguousarray(self.vector, dtype=np.float64)
        head = json.dumps(
            {
                "federation": self.federation,
                "release": self.release,
                "task": self.task.hex(),
                "meta": None
                if self.meta is None
                else self.meta.SerializeToString(deterministic=True).hex(),
                "length": int(vector.shape[0]),
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        return len(head).to_bytes(4, "big") + head + vector.astype("<f8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> SentPlaintext:
        """Raises ValueError (or KeyError, TypeError) when ``data`` is not what
        :meth:`to_bytes` makes."""
        size = int.from_bytes(data[:4], "big")
        doc: dict[str, Any] = json.loads(data[4 : 4 + size])
        body = data[4 + size :]
        length = int(doc["length"])
        if len(body) != 8 * length:
            raise ValueError(f"{len(body)} bytes for {length} entries")
        meta = None if doc["meta"] is None else pb.UpdateMeta.FromString(bytes.fromhex(doc["meta"]))
        return cls(
            federation=str(doc["federation"]),
            release=str(doc["release"]),
            task=bytes.fromhex(doc["task"]),
            vector=np.frombuffer(body, dtype="<f8").astype(np.float64),
            meta=meta,
        )


class SentPlaintextStore:
    """The kept plaintext releases of one participant, one per kind (module
    docstring); ``state_dir`` None keeps them in memory only."""

    def __init__(
        self,
        state_dir: Path | None,
        participant_id: str,
        identity: Ed25519PrivateKey,
        log: Callable[[str], None],
    ) -> None:
        self.folder = None if state_dir is None else state_dir / FOLDER
        self.participant_id = participant_id
        self.log = log
        self._memory: dict[str, SentPlaintext] = {}
        self._key = sealing_key(identity, participant_id, b"spherecal sent plaintext store v1")

    def _path(self, kind: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{kind}{SUFFIX}"

    def _aad(self, kind: str) -> bytes:
        return MAGIC + self.participant_id.encode() + b"\x00" + kind.encode()

    def keep(self, kind: str, sent: SentPlaintext) -> None:
        """Keep ``sent`` as the latest release of ``kind``, durable on return (OSError
        when it cannot be written: the caller sends anyway, without this copy)."""
        if self.folder is None:
            self._memory[kind] = sent
            return
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self._key).encrypt(nonce, sent.to_bytes(), self._aad(kind))
        write_durably(self._path(kind), [MAGIC, nonce, sealed])

    def find(self, kind: str, release: str, task: bytes) -> SentPlaintext | None:
        """The release of ``kind`` kept under ``release`` for the task of digest
        ``task``; None when there is none (or the one there is another's)."""
        kept = self._load(kind)
        if kept is None or kept.release != release or kept.task != task:
            return None
        return kept

    def _load(self, kind: str) -> SentPlaintext | None:
        if self.folder is None:
            return self._memory.get(kind)
        where = self._path(kind)
        try:
            blob = where.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.log(f"the plaintext release kept in {where} cannot be read ({exc})")
            return None
        try:
            if not blob.startswith(MAGIC):
                raise ValueError("not a kept plaintext release")
            nonce = blob[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
            plain = AESGCM(self._key).decrypt(
                nonce, blob[len(MAGIC) + NONCE_BYTES :], self._aad(kind)
            )
            return SentPlaintext.from_bytes(plain)
        except (InvalidTag, ValueError, KeyError, TypeError) as exc:
            reason = "it fails its integrity check" if isinstance(exc, InvalidTag) else str(exc)
            self.log(f"the plaintext release kept in {where} is not used ({reason}); deleting it")
            self.delete(kind)
            return None

    def delete(self, kind: str) -> None:
        if self.folder is None:
            self._memory.pop(kind, None)
            return
        with contextlib.suppress(FileNotFoundError):
            self._path(kind).unlink()
            fsync_folder(self.folder)

    def keep_only(self, federation: str) -> None:
        """Delete what was kept for any other federation than ``federation`` (this
        process joined it: nothing of another is asked again)."""
        for kind in self._kinds():
            kept = self._load(kind)
            if kept is not None and kept.federation != federation:
                self.delete(kind)

    def clear(self) -> None:
        """Delete everything kept (the federation ended) and stale temporary files."""
        self._memory.clear()
        if self.folder is None or not self.folder.is_dir():
            return
        for entry in self.folder.iterdir():
            if entry.suffix == SUFFIX or entry.name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        fsync_folder(self.folder)

    def _kinds(self) -> list[str]:
        if self.folder is None:
            return sorted(self._memory)
        if not self.folder.is_dir():
            return []
        return sorted(e.stem for e in self.folder.iterdir() if e.suffix == SUFFIX)
