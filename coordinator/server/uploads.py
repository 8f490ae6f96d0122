"""The coordinator's two streamed uploads: plaintext tensors and masked inputs.

Both read a client stream chunk by chunk under the same rules — the first message
names the caller and the task or job, every chunk is bounded by ``max_chunk_bytes``,
each is counted as traffic, audited and passed on (to the spool, or to the secure
job's running sum) before the next is read, and a stream that ends early is refused
and loses nothing — so they sit together here, beside the RPC boundary of
:mod:`spherecal.coordinator.server.service`, which delegates to them. What a
complete upload then does (a task's uploads, a job's sum) belongs to the driver.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from typing import Protocol

import grpc

from spherecal import crypto
from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.driver.tasks import PlainUpload, Task
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.server.traffic import Traffic
from spherecal.coordinator.state.registry import Peer, Registry
from spherecal.coordinator.state.store import Store
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import TensorFormatError

__all__ = ["CHUNK_FRAMING_BYTES", "UploadStreams"]

#: A MaskedChunk's framing on top of its payload (magic, ids, index, lengths).
CHUNK_FRAMING_BYTES = 512


class Reject(Protocol):
    """``CoordinatorService._reject``: counts, audits and returns a refusal."""

    def __call__(
        self,
        sender: str,
        stage: str,
        kind: str,
        data: bytes,
        error: ServiceError,
        job: str | None = None,
    ) -> ServiceError: ...


def _masked_wire_size(message: pb.MaskedUpload, chunk: bytes) -> int:
    """``message.ByteSize()`` without serialising a chunk-only message again (it would
    be one more pass over the chunk): field 3's tag, the length varint, the bytes."""
    if message.job_id or message.HasField("caller"):
        return message.ByteSize()
    return 1 + (max(len(chunk).bit_length(), 1) + 6) // 7 + len(chunk)


class UploadStreams:
    """The upload RPCs' stream handling; built by the service with its collaborators."""

    def __init__(
        self,
        *,
        registry: Registry,
        federation: Federation,
        store: Store,
        traffic: Traffic,
        max_chunk: int,
        reject: Reject,
        task: Callable[[str, str], Task],
    ) -> None:
        self.registry = registry
        self.federation = federation
        self.store = store
        self.traffic = traffic
        self.max_chunk = max_chunk
        self._reject = reject
        self._task = task

    def plain(self, requests: Iterable[pb.TensorUpload], peer: Peer) -> pb.UploadReceipt:
        """``UploadTensor``: one plaintext tensor (a model update or statistics of a
        task that does not aggregate securely), spooled to disk as it arrives."""
        iterator = iter(requests)
        first = next(iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT, "an upload must start with its header"
            )
        header = first.header
        member = self.registry.authenticate(header.caller, peer)
        pid = member.participant_id
        raw_header = first.SerializeToString()
        try:
            task = self._task(header.task_id, pid)
            stage = "update" if task.kind == "train" else "statistics"
            self._check_plain_upload(task, header, pid)
        except ServiceError as exc:
            raise self._reject(pid, "upload", "UploadHeader", raw_header, exc) from None
        if not task.begin_upload(pid):
            raise self._reject(
                pid,
                stage,
                "UploadHeader",
                raw_header,
                ServiceError(grpc.StatusCode.ALREADY_EXISTS, "an upload is already in progress"),
            )
        writer = None
        self.traffic.received(pid, stage, len(raw_header))
        try:
            try:
                writer = self.federation.spool.writer(
                    task.task_id, pid, header.tensor, task.expected_shape
                )
            except TensorFormatError as exc:
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            for message in iterator:
                if message.WhichOneof("part") != "data":
                    raise ServiceError(
                        grpc.StatusCode.INVALID_ARGUMENT, "only one header per upload"
                    )
                if len(message.data) > self.max_chunk:
                    raise ServiceError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"chunk of {len(message.data)} bytes exceeds the limit of "
                        f"{self.max_chunk} bytes",
                    )
                self.traffic.received(pid, stage, message.ByteSize())
                try:
                    writer.add(message.data)
                except TensorFormatError as exc:
                    raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            try:
                digest = writer.finish()
            except TensorFormatError as exc:
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            meta = header.update
            upload = PlainUpload(
                path=writer.path,
                sha256=digest,
                num_samples=int(meta.num_samples),
                mean_loss=float(meta.mean_loss),
                num_steps=int(meta.num_steps),
            )
            if not task.add_upload(pid, upload):
                writer.path.unlink(missing_ok=True)
                raise ServiceError(grpc.StatusCode.ALREADY_EXISTS, "already uploaded")
            self.store.audit(
                sender=pid,
                job=task.task_id,
                stage=stage,
                kind="TensorUpload",
                nbytes=writer.nbytes,
                sha256=digest,
            )
            receipt = pb.UploadReceipt(
                num_bytes=writer.nbytes, chunks=writer.chunks, sha256=bytes.fromhex(digest)
            )
            writer = None
            self.federation.notify()
            return receipt
        except ServiceError as exc:
            raise self._reject(pid, stage, "TensorUpload", raw_header, exc, task.task_id) from None
        finally:
            if writer is not None:
                writer.abort()
            task.end_upload(pid)

    def _check_plain_upload(self, task: Task, header: pb.UploadHeader, pid: str) -> None:
        if task.kind not in ("train", "statistics"):
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION, f"task {task.task_id} takes no upload"
            )
        if task.job is not None:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this task aggregates securely: plaintext uploads are refused",
            )
        if task.finished(pid):
            raise ServiceError(grpc.StatusCode.ALREADY_EXISTS, f"{pid!r} already uploaded")
        if task.kind == "train":
            if not header.HasField("update"):
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT, "a model update needs its UpdateMeta"
                )
            if not math.isfinite(header.update.mean_loss):
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "mean_loss is not finite")

    def masked(self, requests: Iterable[pb.MaskedUpload], peer: Peer) -> pb.UploadReceipt:
        """``UploadMasked``: one participant's masked input to a secure job, absorbed
        chunk by chunk into the job's running sum (never held whole)."""
        iterator = iter(requests)
        first = next(iterator, None)
        if first is None:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "empty masked upload")
        member = self.registry.authenticate(first.caller, peer)
        pid = member.participant_id
        job = self.federation.board.job(first.job_id)
        job_hex = bytes(first.job_id).hex()[:64]
        try:
            if job is None:
                raise ServiceError(grpc.StatusCode.NOT_FOUND, "no such secure-aggregation job")
            job.begin_upload(pid)
        except ServiceError as exc:
            raise self._reject(
                pid, "masked", "MaskedUpload", bytes(first.chunk), exc, job_hex
            ) from None
        total, chunks = 0, 0
        digest = hashlib.sha256()
        limit = self.max_chunk + CHUNK_FRAMING_BYTES
        try:
            if not first.chunk:
                # A header (caller and job, no chunk): wait for a slot rather than be
                # refused after the first chunk (coordinator/driver/upload_queue.py)
                job.wait_for_slot(
                    pid, cancelled=lambda: bool(getattr(requests, "cancelled", False))
                )
            message: pb.MaskedUpload | None = first
            while message is not None:
                data = bytes(message.chunk)
                if data:
                    if len(data) > limit:
                        raise ServiceError(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"masked chunk of {len(data)} bytes exceeds the limit of {limit}",
                        )
                    if message.job_id and message.job_id != first.job_id:
                        raise ServiceError(
                            grpc.StatusCode.INVALID_ARGUMENT, "one upload carries one job"
                        )
                    # One SHA-256 pass per chunk (the audit's, the job's comparison of
                    # a repeated upload); the receipt digests those digests in order
                    # rather than hashing the upload again.
                    chunk_digest = hashlib.sha256(data).digest()
                    index = job.absorb(pid, data, chunk_digest)
                    if index == 0:
                        self._record_sample(job_hex, pid, job.purpose, data)
                    chunk_sha = chunk_digest.hex()
                    digest.update(chunk_digest)
                    self.store.audit(
                        sender=pid,
                        job=job_hex,
                        stage="masked",
                        kind=f"MaskedChunk[{index}]",
                        nbytes=len(data),
                        sha256=chunk_sha,
                    )
                    self.traffic.received(pid, "masked", _masked_wire_size(message, data))
                    total += len(data)
                    chunks += 1
                message = next(iterator, None)
        except ServiceError as exc:
            raise self._reject(pid, "masked", "MaskedUpload", b"", exc, job_hex) from None
        finally:
            complete = job.end_upload(pid)
            self.federation.notify()
        if not complete:
            raise self._reject(
                pid,
                "masked",
                "MaskedUpload",
                b"",
                ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"upload ended after {chunks} chunks without the whole masked input; "
                    "it was discarded (send every chunk in one stream)",
                ),
                job_hex,
            )
        return pb.UploadReceipt(num_bytes=total, chunks=chunks, sha256=digest.digest())

    def _record_sample(self, job_hex: str, pid: str, purpose: str, data: bytes) -> None:
        limit = self.federation.settings.secagg.audit_sample_bytes
        if limit <= 0:
            return
        try:
            payload = crypto.MaskedChunk.from_bytes(data).payload
        except crypto.SecAggError:
            return
        self.store.masked_sample(job_hex, pid, purpose, bytes(payload[:limit]))
