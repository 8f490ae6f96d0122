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

The masked input itself (issue #20, a site killed *during* its upload): a sibling
file ``<job id>.masked`` holds the masked chunks exactly as they are streamed,
written after the release is charged and before the first byte leaves, so a
restarted site sends the *identical* bytes again for the same job — never another
input. Why the masked vector and not the job keys and the encoded input from which
the same bytes could be recomputed: ``y_u = x_u + PRG(b_u) ± Σ PRG(s_uv)`` is what
the coordinator receives anyway, one-time-padded by masks whose seeds are not on
this disk (the self mask ``b_u`` and ``s_sk`` are held only as Shamir shares by the
*neighbours*); the keys plus the input would put the plaintext statistic and every
mask seed at rest, and a reader of the file would hold the input in the clear. So
the only new material at rest is a ciphertext the coordinator sees too. Each chunk
is sealed on its own (AES-256-GCM, the job id, the chunk index and the chunk count
bound as associated data: no chunk can be dropped, reordered or moved to another
job), so writing and streaming take one chunk of memory at a time. The held-job
record names the file by the digest of its seals — each chunk's nonce and tag
(:func:`seals_digest`; format 2, issue #24: no second pass over the vector), so a
restored file must be the very file written before the record — and a file of format
1, named by the digest of its chunks, is refused with its reason.

How: one file per job, ``<state_dir>/held-jobs/<job id>.job``, mode 0600 in a 0700
folder, sealed with AES-256-GCM under a key derived (HKDF-SHA256) from the site's
identity key, the participant id and the job id bound as associated data: a file that
was altered, copied from another job or sealed by another identity is refused with
:class:`CorruptHeldJob` rather than half-read.

The file is a *log* of records (issue #24; since version 2 of the format): a header (magic,
job id) and then one sealed record per save, each the whole :class:`HeldJob` (a few
kB; the newest one is the job's state), framed as its length, nonce and ciphertext,
with its position in the log (0, 1, …) bound as associated data too (no record can be
dropped from the middle, repeated or reordered). The file is *created* atomically
(temporary file, fsync, rename, fsync of the folder: two syncs) and each later save
*appends* one record made durable by one ``fdatasync``
(``spherefed.durable.append_durably``) — no temporary file, rename or folder sync on
the consistency and unmask rounds' critical path, where each site's answer waits for
its save. A power loss during an append leaves a *torn* tail: a record whose length
runs past the end of the file. The reader takes the records before it (the torn
record's message never left: it is sent only once the sync returned) and the next
append cuts it off. A *complete* record that fails its check is not a torn write but
damage, and the file is refused whole, as before: falling back to the record before
it could be the state from before a signature or an unmask answer that did leave,
and a restarted site must never sign or reveal a second time.

The keys never outlive the masked input on disk: a record *without* job keys is never
appended to a log whose records hold them — it starts a new log, written atomically
over the old one (:meth:`HeldJobStore.save` checks the record's state), so once the
record naming the stored masked input is durable no record of the keys is left in the
file. Version 1 files (one sealed record) are still read; the next save rewrites them
as a log.

**A withheld input** (version 3, 2026-11-27). A record may say that the job's input
is *withheld* (:attr:`HeldJob.withheld`: the name of its cause's class, never its
text, which can carry values of the data): its local work failed or its result fell
outside the job's bound, and the site answers the job's masked step with a charged
withdrawal (``SecureSteps.withhold``). Written before ``withhold`` returns, so a
restarted site cannot turn the job into one whose input is sent: its local work runs
again when its task comes again — as a job whose input was set must, that input not
being kept — and whatever it yields, the job stays withheld. A version 2 log cannot
say so, so it is read as before (its job not withheld: no process that wrote one knew
the mark) and its next save writes a version 3 log whole, never a version 3 record
appended to a version 2 file; a reader of version 2 refuses a version 3 file ("not a
held-job file") rather than read a withheld job as one whose input is still to come.

A file is deleted when its job ends for the site (answered, refused, moved on without
it) and when the federation ends; its masked input goes with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from spherecal import crypto
from spherecal.spherefed.durable import append_durably, fsync_folder, write_durably

__all__ = [
    "FOLDER",
    "CorruptHeldJob",
    "HeldJob",
    "HeldJobError",
    "HeldJobStore",
    "MASKED_SUFFIX",
    "seals_digest",
    "sealing_key",
]

FOLDER = "held-jobs"
MAGIC = b"SPHERECAL-HELD-JOB 1\n"  # version 1: one sealed record (still read)
LOG_MAGIC_V2 = b"SPHERECAL-HELD-JOB 2\n"  # version 2: a log, no withheld mark (still read)
LOG_MAGIC = b"SPHERECAL-HELD-JOB 3\n"  # version 3: a log whose records may be withheld
MASKED_MAGIC_V1 = b"SPHERECAL-HELD-MASKED 1\n"  # named by its chunks' SHA-256: refused
MASKED_MAGIC = b"SPHERECAL-HELD-MASKED 2\n"  # named by its seals (:func:`seals_digest`)
_SEALS_CONTEXT = b"spherecal held masked seals v2\x00"
NONCE_BYTES = 12
SUFFIX = ".job"
MASKED_SUFFIX = ".masked"
_LEN = 4  # big-endian length of one sealed chunk
_TAG = 16  # AES-GCM's authentication tag


def seals_digest(seals: Iterable[bytes]) -> str:
    """SHA-256 (hex) over the nonce and authentication tag of each sealed chunk of a
    stored masked input, in order: what the held-job record names the file by (format 2).

    Why the seals and not the chunks (issue #24): each chunk is sealed with AES-GCM
    under the store's key, its job, index and count bound as associated data, so the
    (nonce, tag) pairs identify one written file — another file of the same job (a
    recomputed input, or the same chunks sealed again: fresh random nonces) names
    itself by other seals, and no one without the key can make chunks that pass under
    these tags. A SHA-256 of the plaintext chunks (format 1) bound the same file with a
    second pass over the 7.6 MB vector (5 ms of CPU per site in the FFC stage)."""
    outer = hashlib.sha256(_SEALS_CONTEXT)
    for seal in seals:
        outer.update(seal)
    return outer.hexdigest()


def _after_job_id(where: Path, blob: bytes, head: int, job_id: bytes) -> int:
    """The offset after a held-job file's job id (a length byte at ``head``, then the
    id), once the id is checked to be ``job_id``; both file versions start so."""
    if len(blob) < head + 1:
        raise CorruptHeldJob(f"{where} is not a held-job file")
    n = blob[head]
    stored_id = blob[head + 1 : head + 1 + n]
    if stored_id != job_id:
        raise CorruptHeldJob(f"{where} holds job {stored_id.hex()[:16]}, not {job_id.hex()[:16]}")
    return head + 1 + n


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
    masked: str | None = None
    """:func:`seals_digest` of the masked input in the sibling ``.masked`` file, once
    written (None: the upload had not been prepared, or a record of the first
    version)."""
    withheld: str | None = None
    """The job's input is withheld: the name of its cause's class (``EncodingOverflow``,
    ``MemoryError``, …; module docstring, version 3). None: not withheld, or a record
    of an earlier version."""

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "federation": self.federation,
            "job": self.job.hex(),
            "masked": self.masked,
            "round": self.round,
            "release": self.release,
            "sent": [[stage, data.hex()] for stage, data in self.sent],
            "state": self.state.hex(),
        }
        if self.withheld is not None:
            doc["withheld"] = self.withheld
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

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
            masked = doc.get("masked")
            if masked is not None and (not isinstance(masked, str) or len(masked) != 64):
                raise TypeError("masked must be a SHA-256 hex digest")
            withheld = doc.get("withheld")
            if withheld is not None and (not isinstance(withheld, str) or not withheld):
                raise TypeError("withheld must be the name of its cause")
            sent = tuple((int(stage), bytes.fromhex(hexed)) for stage, hexed in doc["sent"])
            return cls(
                federation=doc["federation"],
                job=bytes.fromhex(doc["job"]),
                round=round_,
                release=release,
                sent=sent,
                state=bytes.fromhex(doc["state"]),
                masked=masked,
                withheld=withheld,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptHeldJob(f"held job record is malformed: {exc}") from None


@dataclass(frozen=True)
class _Log:
    """A job's log as this process last made it durable."""

    end: int
    """Its length: where the next record is appended."""
    records: int
    """How many records it holds: the next one's position."""
    keys: bool
    """Whether any of them holds the job keys (then a record without keys starts a
    new log instead of being appended)."""


def _holds_keys(record: HeldJob) -> bool:
    """Whether ``record``'s state carries the job keys; a state that does not parse
    counts as holding them (the safe side: what follows it without keys is written as
    a new log)."""
    try:
        return crypto.HeldState.from_bytes(record.state).keys is not None
    except crypto.SecAggError:
        return True


def sealing_key(identity: Ed25519PrivateKey, participant_id: str, store: bytes) -> bytes:
    """The AES-256-GCM key a site's ``store`` of files at rest is sealed under: HKDF-SHA256
    of its identity key, ``store`` and the participant id as the context — one key per
    store and identity, so a file sealed by another identity or for another store is
    refused, never half-read (held jobs here; the kept plaintext releases,
    :mod:`spherecal.participant.sent_plaintext`)."""
    secret = identity.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=None,
        info=store + b"\x00" + participant_id.encode(),
    ).derive(secret)


class HeldJobStore:
    """The held-jobs folder of one participant (see the module docstring)."""

    def __init__(self, state_dir: Path, participant_id: str, identity: Ed25519PrivateKey) -> None:
        self.folder = state_dir / FOLDER
        self.participant_id = participant_id
        self._key = sealing_key(identity, participant_id, b"spherecal held-job store v1")
        self._logs: dict[bytes, _Log] = {}
        """Per job, the log as this process last made it durable (where the next
        record goes); a job not here is written whole at its next save."""
        self._lock = threading.Lock()

    def path(self, job_id: bytes) -> Path:
        return self.folder / f"{job_id.hex()}{SUFFIX}"

    def _aad(self, job_id: bytes) -> bytes:
        return MAGIC + self.participant_id.encode() + b"\x00" + job_id

    def _log_aad(self, job_id: bytes, index: int, magic: bytes = LOG_MAGIC) -> bytes:
        return magic + self.participant_id.encode() + b"\x00" + job_id + index.to_bytes(4, "big")

    def _frame(self, job_id: bytes, index: int, record: HeldJob) -> bytes:
        """Record ``index`` of the job's log: length, nonce, ciphertext."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self._key).encrypt(nonce, record.to_bytes(), self._log_aad(job_id, index))
        return (NONCE_BYTES + len(sealed)).to_bytes(_LEN, "big") + nonce + sealed

    def save(self, job_id: bytes, record: HeldJob) -> None:
        """Make ``record`` the job's state, durable on return: appended to the job's
        log with one ``fdatasync`` where this process knows the log, else (the first
        save, a log of another process or of an earlier version, a record that drops
        the job keys, a failed append) a new log written atomically."""
        keys = _holds_keys(record)
        with self._lock:
            log = self._logs.pop(job_id, None)  # unknown until this save succeeds
            if log is not None and (keys or not log.keys):
                frame = self._frame(job_id, log.records, record)
                try:
                    appended = append_durably(self.path(job_id), frame, at=log.end)
                except FileNotFoundError:
                    appended = False  # gone meanwhile: written whole below
                if appended:
                    self._logs[job_id] = _Log(log.end + len(frame), log.records + 1, log.keys)
                    return
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            head = LOG_MAGIC + bytes([len(job_id)]) + job_id
            blob = head + self._frame(job_id, 0, record)
            write_durably(self.path(job_id), [blob])
            self._logs[job_id] = _Log(len(blob), 1, keys)

    # ---------------------------------------------------------------- masked input
    def masked_path(self, job_id: bytes) -> Path:
        return self.folder / f"{job_id.hex()}{MASKED_SUFFIX}"

    def _masked_aad(self, job_id: bytes, index: int, count: int) -> bytes:
        return (
            MASKED_MAGIC
            + self.participant_id.encode()
            + b"\x00"
            + job_id
            + index.to_bytes(4, "big")
            + count.to_bytes(4, "big")
        )

    def save_masked(self, job_id: bytes, chunks: Iterable[bytes], count: int) -> str:
        """Write ``job_id``'s masked input (``count`` chunk messages, in order)
        atomically, durable on return; returns its :func:`seals_digest` (the record
        names the file by it). A file already there is replaced (the same chunks:
        they are deterministic; new seals)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        aead = AESGCM(self._key)
        seals: list[bytes] = []
        written = 0
        # One ciphertext buffer for every chunk, sealed into in place: a fresh
        # chunk-sized allocation per seal, and the two concatenations that framed it,
        # cost more than the encryption (first touch of new pages; issue #24: 19 ms
        # of CPU per 7.6 MB FFC input, 2 ms this way). Reusing it is safe because
        # ``write_durably`` writes each part whole before it asks for the next.
        sealed = bytearray()

        def parts() -> Iterator[bytes | memoryview]:
            nonlocal written, sealed
            yield MASKED_MAGIC + bytes([len(job_id)]) + job_id + count.to_bytes(4, "big")
            for index, chunk in enumerate(chunks):
                if index >= count:
                    raise ValueError(f"more than the {count} chunks announced")
                nonce = os.urandom(NONCE_BYTES)
                size = len(chunk) + _TAG
                if len(sealed) < size:
                    sealed = bytearray(size)
                out = memoryview(sealed)[:size]
                aead.encrypt_into(nonce, chunk, self._masked_aad(job_id, index, count), out)
                seals.append(nonce + bytes(out[-_TAG:]))
                written += 1
                yield (NONCE_BYTES + size).to_bytes(_LEN, "big") + nonce
                yield out
            if written != count:
                raise ValueError(f"{written} chunks written, {count} announced")

        write_durably(self.masked_path(job_id), parts())
        return seals_digest(seals)

    def masked_chunks(self, job_id: bytes) -> Iterator[bytes]:
        """The stored masked chunks of ``job_id`` in order, each checked as it is read
        (one chunk in memory at a time); :class:`CorruptHeldJob` at the first one
        that is not exactly what :meth:`save_masked` wrote — a truncated file is
        refused at its end, so a stream of it is cut before it is whole and the
        coordinator discards it — and for a file of format 1 (its record names it by
        another digest). FileNotFoundError if there is none."""
        for chunk, _ in self._masked_read(job_id):
            yield chunk

    def _masked_read(self, job_id: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(chunk, its seal: nonce and tag) of each stored chunk, checked as read."""
        aead = AESGCM(self._key)
        where = self.masked_path(job_id)
        with where.open("rb") as f:
            head = f.read(len(MASKED_MAGIC) + 1)
            if head.startswith(MASKED_MAGIC_V1):
                raise CorruptHeldJob(
                    f"{where} is a masked input stored in format 1 (named by another "
                    "digest than its record's format 2 names); it is not sent again"
                )
            if len(head) != len(MASKED_MAGIC) + 1 or not head.startswith(MASKED_MAGIC):
                raise CorruptHeldJob(f"{where} is not a held masked input")
            stored_id = f.read(head[-1])
            if stored_id != job_id:
                raise CorruptHeldJob(f"{where} holds another job's masked input")
            count = int.from_bytes(f.read(4), "big")
            for index in range(count):
                size = int.from_bytes(f.read(_LEN), "big")
                sealed = f.read(size)
                if size <= NONCE_BYTES or len(sealed) != size:
                    raise CorruptHeldJob(f"{where} is truncated at chunk {index} of {count}")
                try:
                    chunk = aead.decrypt(
                        sealed[:NONCE_BYTES],
                        sealed[NONCE_BYTES:],
                        self._masked_aad(job_id, index, count),
                    )
                except InvalidTag:
                    raise CorruptHeldJob(
                        f"{where} fails its integrity check at chunk {index}"
                    ) from None
                yield chunk, sealed[:NONCE_BYTES] + sealed[-_TAG:]
            if f.read(1):
                raise CorruptHeldJob(f"{where} has bytes after its last chunk")

    def check_masked(self, job_id: bytes, digest: str) -> None:
        """Read the whole stored masked input once: :class:`CorruptHeldJob` unless
        every chunk is intact and its :func:`seals_digest` is ``digest`` (the
        record's: this very file, not another of the same job)."""
        if seals_digest(seal for _, seal in self._masked_read(job_id)) != digest:
            raise CorruptHeldJob(
                f"{self.masked_path(job_id)} is not the masked input its job record names"
            )

    def load(self, job_id: bytes) -> HeldJob:
        """``job_id``'s state, the newest record of its log; :class:`CorruptHeldJob`
        if the file is not what :meth:`save` wrote for this participant and job (a
        torn last record is not damage: the records before it are read, see the
        module docstring), FileNotFoundError if there is none."""
        where = self.path(job_id)
        blob = where.read_bytes()
        if blob.startswith(MAGIC):
            return self._load_v1(job_id, blob)
        magic = next((m for m in (LOG_MAGIC, LOG_MAGIC_V2) if blob.startswith(m)), None)
        if magic is None:
            raise CorruptHeldJob(f"{where} is not a held-job file")
        at = _after_job_id(where, blob, len(magic), job_id)
        aead = AESGCM(self._key)
        plain: bytes | None = None
        keys = False
        index = 0
        while len(blob) - at >= _LEN:
            size = int.from_bytes(blob[at : at + _LEN], "big")
            if at + _LEN + size > len(blob):
                break  # torn: the append was cut by a crash, its message never left
            sealed = blob[at + _LEN : at + _LEN + size]
            try:
                plain = aead.decrypt(
                    sealed[:NONCE_BYTES],
                    sealed[NONCE_BYTES:],
                    self._log_aad(job_id, index, magic),
                )
            except (InvalidTag, ValueError):
                raise CorruptHeldJob(
                    f"{where} fails its integrity check at record {index} (altered, or "
                    f"sealed by another identity than {self.participant_id!r})"
                ) from None
            keys = keys or _holds_keys(HeldJob.from_bytes(plain))
            at += _LEN + size
            index += 1
        if plain is None:
            raise CorruptHeldJob(
                f"{where} fails its integrity check: no complete record (truncated)"
            )
        if magic == LOG_MAGIC:  # a version 2 log is written whole, as version 3, next
            with self._lock:
                self._logs[job_id] = _Log(at, index, keys)
        return HeldJob.from_bytes(plain)

    def _load_v1(self, job_id: bytes, blob: bytes) -> HeldJob:
        """A version 1 file: one sealed record (its next save writes a log)."""
        body = blob[_after_job_id(self.path(job_id), blob, len(MAGIC), job_id) :]
        nonce, sealed = body[:NONCE_BYTES], body[NONCE_BYTES:]
        try:
            plain = AESGCM(self._key).decrypt(nonce, sealed, self._aad(job_id))
        except (InvalidTag, ValueError):
            raise CorruptHeldJob(
                f"{self.path(job_id)} fails its integrity check (altered, truncated, or "
                f"sealed by another identity than {self.participant_id!r})"
            ) from None
        return HeldJob.from_bytes(plain)

    def job_ids(self, suffix: str = SUFFIX) -> list[bytes]:
        """Every job with a record here (with ``suffix = MASKED_SUFFIX``: with a
        masked input; names that are not a job id are ignored)."""
        if not self.folder.is_dir():
            return []
        out = []
        for entry in sorted(self.folder.iterdir()):
            if entry.suffix != suffix or entry.name.startswith("."):
                continue
            try:
                out.append(bytes.fromhex(entry.stem))
            except ValueError:
                continue
        return out

    def delete_masked(self, job_id: bytes) -> None:
        """Delete the job's masked input alone (a file its record does not name)."""
        with contextlib.suppress(FileNotFoundError):
            self.masked_path(job_id).unlink()
            fsync_folder(self.folder)

    def delete_record(self, job_id: bytes) -> None:
        """Delete the job's record alone (absent is fine): what a restarted process
        would answer the job from. A masked input left beside it has no record and is
        deleted at the restart (``SecureSteps.restore_held``); until then this process
        can still send it again."""
        with self._lock:
            self._logs.pop(job_id, None)
        try:
            self.path(job_id).unlink()
        except FileNotFoundError:
            return
        fsync_folder(self.folder)

    def delete(self, job_id: bytes) -> None:
        """Delete the job's record and its masked input (either may be absent)."""
        with self._lock:
            self._logs.pop(job_id, None)
        removed = False
        for where in (self.path(job_id), self.masked_path(job_id)):
            with contextlib.suppress(FileNotFoundError):
                where.unlink()
                removed = True
        if removed:
            fsync_folder(self.folder)

    def clear(self) -> None:
        """Delete every held job (the federation ended) and stale temporary files."""
        with self._lock:
            self._logs.clear()
        if not self.folder.is_dir():
            return
        for entry in self.folder.iterdir():
            if entry.suffix in (SUFFIX, MASKED_SUFFIX) or entry.name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        fsync_folder(self.folder)
