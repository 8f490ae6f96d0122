"""The first of the three steps of a masked upload: store the masked input, and drop
the job keys from disk, before the release is charged and before a byte leaves.

Why its own module: the order is the safety argument of issue #20 (see
``secure_jobs``: store, charge, send), and its failure paths are where a mistake
would matter — a site that sent a masked input must never restart to find its job
keys on disk, because it would then mask a recomputed, maybe different, input under
the same masks, and two masked inputs under the same masks reveal their difference.

:func:`store_masked` writes the masked chunks (``held_jobs.HeldJobStore.save_masked``)
and then replaces the job's record by one that names their digest and holds no keys
(the session is at the masked stage: ``crypto.HeldState`` holds keys only before
it), and keeps the chunks it wrote on the session (``stored_chunks``) so that the
upload sends those very bytes without reading the file back and decrypting it (a
restarted process, which has only the file, reads it). A failed write costs
durability only — the upload goes from the session's deterministic chunks, and a
restart during it loses the job, logged — *provided* the
keys are gone from disk: the record is replaced without them, or deleted; if neither
can be done, the upload must not go, and :func:`store_masked` returns the reason.

:func:`task_of` recognises a task that carries a given secure job (a site handed its
task again after it reconnected, ``coordinator.driver.secure_job.SecureJob.rejoined``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from spherecal import crypto
from spherecal.participant.held_jobs import HeldJobError, HeldJobStore
from spherecal.participant.secure_session import SecureSession
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.task_context import secure_task

__all__ = ["store_masked", "task_of"]


def store_masked(
    store: HeldJobStore, session: SecureSession, federation: str, log: Callable[[str], None]
) -> HeldJobError | None:
    """Write the masked input, then the record naming it (without the job keys);
    sets ``session.masked_seals``. None: the upload may go (stored, or not stored
    but no keys left on disk); a :class:`HeldJobError`: it must not (withdraw)."""
    job_id = session.job_id
    label = f"job {job_id.hex()[:8]}"
    kept: list[bytes] = []

    def chunks(n: int) -> Iterator[bytes]:
        for index in range(n):
            chunk = session.masked_chunk(index)
            kept.append(chunk)
            yield chunk

    try:
        n = session.n_chunks
        digest = store.save_masked(job_id, chunks(n), n)
    except OSError as exc:
        log(
            f"{label}: could not store its masked input ({exc}); a restart of this site "
            "during the upload would lose the job"
        )
        return _without_keys(store, session, federation, exc)
    session.masked_seals = digest
    session.stored_chunks = kept  # the upload streams these bytes, as written
    try:
        store.save(job_id, session.record(federation))
    except OSError as exc:
        # the masked file without a record naming it is deleted on restart; the
        # record with the keys must not survive beside a sent input
        session.masked_seals = None
        session.stored_chunks = None
        log(
            f"{label}: could not record its stored masked input ({exc}); a restart of "
            "this site during the upload would lose the job"
        )
        try:
            store.delete(job_id)
        except OSError as gone:
            return HeldJobError(
                f"its held job could be neither updated ({exc}) nor deleted ({gone}); a "
                "restart could mask another input under the same masks"
            )
    return None


def _without_keys(
    store: HeldJobStore, session: SecureSession, federation: str, cause: OSError
) -> HeldJobError | None:
    """The masked input could not be stored: the record without keys, or none."""
    try:
        store.save(session.job_id, session.record(federation))
        return None
    except OSError:
        pass
    try:
        store.delete(session.job_id)
        return None
    except OSError as gone:
        return HeldJobError(
            f"its held job keys could be neither replaced ({cause}) nor deleted ({gone}); "
            "a restart could mask another input under the same masks"
        )


def task_of(instruction: pb.Instruction, job: bytes) -> bool:
    """``instruction`` is a task (train, statistics, evaluate) of secure job ``job``."""
    task = secure_task(instruction)
    if task is None:
        return False
    try:
        return bool(crypto.JobSpec.from_bytes(task.secure.spec).job_id == job)
    except crypto.SecAggError:
        return False
