"""Masked uploads that open with a header wait for a free upload slot instead of being
refused (``coordinator/driver/upload_queue.py``, issue #24): they go in the moment a
slot frees, in the order they began to wait, and the wait ends when the masked stage
closes or the call is cancelled. An upload whose first message carries a chunk (a site
of an earlier version) is refused as before."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.driver import upload_queue
from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.coordinator.driver.upload_queue import UploadQueue
from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.settings import SecAggSettings
from spherecal.coordinator.state.registry import Peer
from spherecal.proto import spherecal_pb2 as pb

from .helpers import finish_after_masked, make_job, masked_streams
from .service_harness import Harness, settings_for, shared_secure_round

LENGTH = 20_000


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for another thread to reach a state (synchronisation, not a timing check)."""
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within 30 s: {what}")
        time.sleep(0.005)


class Uploader(threading.Thread):
    """One participant's upload as the service handles it (begin, wait for a slot,
    absorb every chunk, end); ``hold`` stops it after its first chunk until set."""

    def __init__(
        self,
        job: SecureJob,
        pid: str,
        chunks: Iterator[crypto.MaskedChunk],
        *,
        hold: threading.Event | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(daemon=True)
        self.job, self.pid, self.chunks, self.hold = job, pid, chunks, hold
        self.cancelled = cancelled
        self.slotted: list[str] | None = None  # where to note when it got its slot
        self.error: ServiceError | None = None
        self.complete: bool | None = None

    def run(self) -> None:
        job = self.job
        job.begin_upload(self.pid)
        try:
            job.wait_for_slot(self.pid, cancelled=self.cancelled)
            if self.slotted is not None:
                self.slotted.append(self.pid)
            for k, chunk in enumerate(self.chunks):
                job.absorb(self.pid, chunk.to_bytes())
                if k == 0 and self.hold is not None:
                    self.hold.wait()
        except ServiceError as exc:
            self.error = exc
        finally:
            self.complete = job.end_upload(self.pid)


def _one_slot_job(n: int) -> tuple[SecureJob, dict[str, crypto.SecAggParticipant], dict]:
    job, clients = make_job(n, LENGTH, chunk_entries=4096, max_in_flight=1)
    rng = np.random.default_rng(n)
    inputs = {p: rng.uniform(-5, 5, LENGTH) for p in clients}
    return job, clients, {"inputs": inputs, "streams": masked_streams(job, clients, inputs)}


def test_waiting_uploads_go_in_as_slots_free_in_the_order_they_began_to_wait() -> None:
    job, clients, state = _one_slot_job(3)
    streams = state["streams"]
    hold = threading.Event()
    slotted: list[str] = []
    first = Uploader(job, "p0", streams["p0"], hold=hold)
    first.slotted = slotted
    first.start()
    _until(lambda: job.server.uploading() == {"p0"}, "p0 holds the only slot")
    second = Uploader(job, "p1", streams["p1"])
    second.slotted = slotted
    second.start()
    _until(lambda: job.uploads.waiting() == ("p1",), "p1 waits")
    third = Uploader(job, "p2", streams["p2"])
    third.slotted = slotted
    third.start()
    _until(lambda: job.uploads.waiting() == ("p1", "p2"), "p2 waits behind p1")
    hold.set()
    for uploader in (first, second, third):
        uploader.join(timeout=30)
        assert not uploader.is_alive()
        assert uploader.error is None and uploader.complete is True
    assert slotted == ["p0", "p1", "p2"]  # in the order they began to wait
    assert job.uploads.waits == 2 and job.uploads.waiting() == ()
    outcome = finish_after_masked(job, clients)
    expected = np.sum(list(state["inputs"].values()), axis=0)
    np.testing.assert_allclose(np.asarray(outcome.values), expected, atol=1e-6)


def test_a_wait_ends_when_the_masked_stage_closes() -> None:
    job, clients, state = _one_slot_job(5)  # threshold 3
    for pid in ("p2", "p3", "p4"):  # enough inputs for the stage to close, not fail
        done = Uploader(job, pid, state["streams"][pid])
        done.run()
        assert done.error is None and done.complete is True
    hold = threading.Event()
    holder = Uploader(job, "p0", state["streams"]["p0"], hold=hold)
    holder.start()
    _until(lambda: job.server.uploading() == {"p0"}, "p0 holds the only slot")
    waiter = Uploader(job, "p1", state["streams"]["p1"])
    waiter.start()
    _until(lambda: job.uploads.waiting() == ("p1",), "p1 waits")
    job.advance(frozenset(clients), now=time.monotonic() + 3600)  # the stage's deadline
    waiter.join(timeout=30)
    assert not waiter.is_alive() and waiter.error is not None
    assert waiter.error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "closed its masked stage" in waiter.error.message
    assert job.uploads.waiting() == ()
    hold.set()
    holder.join(timeout=30)
    assert holder.error is not None  # its stage closed under it: abandoned, not summed
    assert job.server.stage is crypto.Stage.CONSISTENCY
    assert sorted(job.server.survivors) == ["p2", "p3", "p4"]


def test_a_cancelled_wait_leaves_the_queue_and_the_next_moves_up() -> None:
    job, clients, state = _one_slot_job(4)
    streams = state["streams"]
    hold = threading.Event()
    holder = Uploader(job, "p0", streams["p0"], hold=hold)
    holder.start()
    _until(lambda: job.server.uploading() == {"p0"}, "p0 holds the only slot")
    gone = threading.Event()
    cancelled = Uploader(job, "p1", streams["p1"], cancelled=gone.is_set)
    cancelled.start()
    _until(lambda: job.uploads.waiting() == ("p1",), "p1 waits")
    behind = Uploader(job, "p2", streams["p2"])
    behind.start()
    _until(lambda: job.uploads.waiting() == ("p1", "p2"), "p2 waits behind p1")
    gone.set()  # p1's call is cancelled (its site went away)
    cancelled.join(timeout=30)
    assert cancelled.error is not None and cancelled.error.code is grpc.StatusCode.CANCELLED
    assert cancelled.complete is False
    _until(lambda: job.uploads.waiting() == ("p2",), "p2 first in the queue")
    hold.set()
    for uploader in (holder, behind):
        uploader.join(timeout=30)
        assert uploader.error is None and uploader.complete is True


def test_an_upload_arriving_when_a_slot_frees_does_not_pass_one_already_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slot goes to the upload that waited longest, not to whichever thread looks
    first: here the newcomer looks while the waiting one has not been woken yet."""
    monkeypatch.setattr(upload_queue, "RECHECK_S", 3600.0)  # wakes only when notified
    queue = UploadQueue(threading.RLock(), capacity=1)
    in_use: set[str] = {"a"}
    got: list[str] = []

    def upload(pid: str) -> None:
        queue.wait(
            pid, in_use=lambda: frozenset(in_use), check=lambda: None, cancelled=lambda: False
        )
        got.append(pid)

    waiting = threading.Thread(target=upload, args=("b",), daemon=True)
    waiting.start()
    _until(lambda: queue.waiting() == ("b",), "b waits")
    in_use.clear()  # a's upload ended, and nobody has been told yet
    newcomer = threading.Thread(target=upload, args=("c",), daemon=True)
    newcomer.start()
    _until(lambda: queue.waiting() == ("b", "c"), "c waits behind b")
    assert got == []
    queue.release("a")  # what SecureJob.end_upload does: wake the waiting uploads
    _until(lambda: got == ["b"], "b has the slot")
    assert queue.waiting() == ("c",)
    queue.release("b")
    for thread in (waiting, newcomer):
        thread.join(timeout=30)
    assert got == ["b", "c"] and queue.waits == 2


def test_a_chunk_first_upload_cannot_take_a_slot_given_to_a_waiting_one() -> None:
    """An earlier site's upload (no header, so no wait) is refused while the only slot
    is given to an upload that waited for it but has not sent its first chunk yet."""
    job, clients, state = _one_slot_job(3)
    streams = state["streams"]
    job.begin_upload("p0")
    job.wait_for_slot("p0")  # the slot is free: given at once, no chunk summed yet
    assert job.server.uploading() == frozenset()
    job.begin_upload("p1")
    with pytest.raises(ServiceError) as refused:
        job.absorb("p1", next(streams["p1"]).to_bytes())
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    assert job.end_upload("p1") is False
    for chunk in streams["p0"]:
        job.absorb("p0", chunk.to_bytes())
    assert job.end_upload("p0") is True
    job.begin_upload("p1")  # the slot is free again: p1 goes in from the start
    for chunk in clients["p1"].masked_chunks():
        job.absorb("p1", chunk.to_bytes())
    assert job.end_upload("p1") is True


# ------------------------------------------------------------ through the service
@pytest.fixture
def one_slot(tmp_path: Path) -> Iterator[Harness]:
    settings = settings_for(tmp_path, secure=True)
    secagg = SecAggSettings(
        updates=True, statistics=True, chunk_entries=4096, max_in_flight=1, in_flight_mb=0
    )
    harness = Harness(dataclasses.replace(settings, secagg=secagg)).start()
    try:
        yield harness
    finally:
        harness.close()


def test_the_service_holds_a_header_first_upload_and_refuses_a_chunk_first_one(
    one_slot: Harness,
) -> None:
    h = one_slot
    spec, clients = shared_secure_round(h, ("p0", "p1", "p2"))
    for pid, c in clients.items():
        c.receive_shares(crypto.ShareBundle.from_bytes(h.poll(pid, {"secagg"}).secagg.message))
    job = h.federation.board.job(spec.job_id)
    assert job is not None and job.server.max_in_flight == 1
    chunks = {p: [chunk.to_bytes() for chunk in c.masked_chunks()] for p, c in clients.items()}
    assert len(chunks["p0"]) > 1
    header = {p: pb.MaskedUpload(caller=h.caller(p), job_id=spec.job_id) for p in clients}
    hold = threading.Event()
    receipts: dict[str, pb.UploadReceipt | BaseException] = {}

    def messages(pid: str, held: bool) -> Iterator[pb.MaskedUpload]:
        yield header[pid]
        for k, chunk in enumerate(chunks[pid]):
            yield pb.MaskedUpload(chunk=chunk)
            if k == 0 and held:
                hold.wait()

    def upload(pid: str, held: bool) -> None:
        try:
            receipts[pid] = h.service.upload_masked(messages(pid, held), Peer())
        except BaseException as exc:  # reported through receipts
            receipts[pid] = exc

    first = threading.Thread(target=upload, args=("p0", True), daemon=True)
    first.start()
    _until(lambda: job.server.uploading() == {"p0"}, "p0 holds the only slot")
    second = threading.Thread(target=upload, args=("p1", False), daemon=True)
    second.start()
    _until(lambda: job.uploads.waiting() == ("p1",), "p1's upload waits")
    # a site of an earlier version: its first message carries the first chunk
    old = [pb.MaskedUpload(caller=h.caller("p2"), job_id=spec.job_id, chunk=chunks["p2"][0])]
    with pytest.raises(ServiceError) as refused:
        h.service.upload_masked(iter(old), Peer())
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    hold.set()
    for thread in (first, second):
        thread.join(timeout=30)
    for pid in ("p0", "p1"):
        receipt = receipts[pid]
        assert isinstance(receipt, pb.UploadReceipt), receipt
        assert receipt.chunks == len(chunks[pid])
    rejected = h.store.query(
        "SELECT sender FROM audit WHERE stage='masked' AND status != 'accepted'"
    )
    assert rejected == [("p2",)]  # only the chunk-first upload was refused
