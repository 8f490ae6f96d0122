"""The job journal's large payloads — a masked stage's sum and a job's result — as
files beside ``state.db``, each durable before the journal row that names it.

Why files (issue #24): a statistics job's sum is a model- or moments-sized vector
(7.6 MB for FFC at l = 1280, C = 100). Written into SQLite, each one went through
~1,900 overflow pages of the WAL, usually tripped the automatic checkpoint, and was
freed page by page again when the job ended: 0.1–0.27 s per write on the 2-core
box, twice per job (the masked sum, then the result), on the critical path — the
masked stage's close and the job's end wait for them. A file is one ``write`` and
one ``fsync`` (2 ms + 6–30 ms there). The blob's SHA-256 is computed on a second
thread while those run (:class:`_Digest`): both passes over the payload were on the
critical path one after the other (7.6 MB: SHA-256 3.8 ms, write 3–3.8 ms, fsync
2.6–3.6 ms on the AVX-512 development machine; a CCVR sum at l = 512, C = 100 is
105 MB).

Durability is not weakened: a blob is written to a temporary file, fsynced, renamed
and its folder fsynced *before* the SQLite row that names it (by SHA-256) is
committed — so a committed row never names a blob that a crash could lose (the
blob is on disk first; the row's commit is itself synced when anyone waits for it,
``[federation] durability``, see :mod:`spherecal.coordinator.state.store`).
Reading checks the digest, so a damaged blob is refused like a damaged row was.

Orphans (a blob written and the process killed before its row committed; a row
deleted and the process killed before its blob was) are removed by
:meth:`JournalBlobs.sweep` when a journal is opened — only blobs of jobs the
database knows, never files it cannot account for.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from spherecal.coordinator.errors import StorageFailed
from spherecal.coordinator.state.storage_faults import storage_failure
from spherecal.spherefed.durable import write_durably

__all__ = ["BLOB_FOLDER", "CONCURRENT_DIGEST_BYTES", "BlobCorrupt", "JournalBlobs", "write_synced"]

BLOB_FOLDER = "journal"
"""The folder of a state directory that holds the blobs."""

_SUFFIX = ".blob"

Report = Callable[[StorageFailed], StorageFailed]

CONCURRENT_DIGEST_BYTES = 1 << 20
"""From this size on, a blob's digest is computed beside its write: below it the
second thread costs more than the overlap saves."""


class _Digest:
    """SHA-256 of a buffer, computed on its own thread — ``hashlib`` releases the GIL
    while it hashes a large buffer, as ``os.write`` and ``os.fsync`` do, so the hash
    of a blob overlaps the write and sync of the same bytes. The buffer must not
    change until :meth:`hexdigest` returns (the callers hand over a finished sum)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._hex: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="blob-digest", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._hex = hashlib.sha256(self._view).hexdigest()
        except BaseException as exc:  # re-raised by hexdigest() on the caller's thread
            self._error = exc

    def join(self) -> None:
        """Wait for the thread (a failed write waits for it too, so no thread outlives
        the call that started it)."""
        self._thread.join()

    def hexdigest(self) -> str:
        """The digest, once the thread is done."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._hex is not None
        return self._hex


class BlobCorrupt(ValueError):
    """A journal row names a blob that is missing or is not what was written."""


def write_synced(final: Path, payload: memoryview) -> None:
    """``payload`` as ``final``, durable on return (:func:`~spherecal.spherefed.durable.
    write_durably`: a temporary file beside it, 0600, fsynced, renamed, the folder
    fsynced — the file is absent, the old one or complete; the temporary file goes if
    a step fails, the ``OSError`` raised)."""
    write_durably(final, [payload])


class JournalBlobs:
    """The blob folder of one state directory (``<state_dir>/journal``)."""

    def __init__(self, folder: Path, *, report: Report | None = None) -> None:
        self.folder = folder
        self.report = report
        """Where a storage fault is reported (the store's ``report_failure``)."""

    @staticmethod
    def name(job_id: str, what: str) -> str:
        """The blob of ``job_id`` called ``what`` (a job id is hex, ``what`` a word
        or ``masked-<seq>``): one file name per payload, never reused by another job."""
        return f"{job_id}.{what}{_SUFFIX}"

    def path(self, name: str) -> Path:
        return self.folder / name

    def write(self, name: str, data: bytes | memoryview) -> str:
        """Write ``data`` as blob ``name``, durable on return (temporary file,
        fsync, rename, fsync of the folder); returns its SHA-256 (hex). A storage
        fault is reported to the store and raised as :class:`StorageFailed`."""
        final = self.path(name)
        payload = memoryview(data).cast("B")
        beside = _Digest(payload) if payload.nbytes >= CONCURRENT_DIGEST_BYTES else None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_synced(final, payload)
        except OSError as exc:
            fault = storage_failure(final, exc)
            if fault is None:
                raise
            raise (self.report(fault) if self.report is not None else fault) from exc
        finally:
            if beside is not None:
                beside.join()
        if beside is None:
            return hashlib.sha256(payload).hexdigest()
        return beside.hexdigest()

    def read(self, name: str, sha256: str) -> bytes:
        """Blob ``name``, checked against the digest its row recorded."""
        try:
            data = self.path(name).read_bytes()
        except FileNotFoundError:
            raise BlobCorrupt(f"journal blob {self.path(name)} is missing") from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise BlobCorrupt(f"journal blob {self.path(name)} is not what was written")
        return data

    def delete(self, names: Iterable[str]) -> None:
        """Remove blobs whose rows are gone (best effort: :meth:`sweep` retries)."""
        for name in names:
            with contextlib.suppress(OSError):
                self.path(name).unlink(missing_ok=True)

    def sweep(self, known_jobs: set[str], referenced: set[str]) -> list[str]:
        """Delete the blobs (and stale temporary files) of jobs in ``known_jobs``
        that no row references; returns their names. Files of jobs the database
        does not know are left alone."""
        if not self.folder.is_dir():
            return []
        removed = []
        for entry in sorted(self.folder.iterdir()):
            name = entry.name
            stem = name.lstrip(".")
            job = stem.split(".", 1)[0]
            if job not in known_jobs:
                continue
            stale_tmp = name.startswith(".") and name.endswith(".tmp")
            if stale_tmp or (name.endswith(_SUFFIX) and name not in referenced):
                try:
                    entry.unlink()
                except OSError:
                    continue
                removed.append(name)
        return removed
