"""The service core's boundary: every malformed, unauthenticated, wrong-stage,
oversized or replayed request gets the right status and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.state.registry import Peer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for, iter_chunks

from .service_harness import Harness, code_of, settings_for, shared_secure_round


def _upload(
    harness: Harness,
    pid: str,
    task_id: str,
    vector: np.ndarray,
    *,
    meta: pb.UpdateMeta | None = None,
    chunk: int = 8192,
    header: pb.TensorHeader | None = None,
) -> pb.UploadReceipt:
    def messages() -> Iterator[pb.TensorUpload]:
        yield pb.TensorUpload(
            header=pb.UploadHeader(
                caller=harness.caller(pid),
                task_id=task_id,
                tensor=header or header_for(vector),
                update=meta,
            )
        )
        for data in iter_chunks(vector, chunk):
            yield pb.TensorUpload(data=data)

    return harness.service.upload_tensor(messages(), Peer())


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(settings_for(tmp_path, secure=False)).start()
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(settings_for(tmp_path, secure=True)).start()
    try:
        yield harness
    finally:
        harness.close()


def test_join_and_authentication_boundary(plain: Harness) -> None:
    s = plain.service
    assert code_of(lambda: s.join(plain.join_request("mallory", plain.keys["p0"]), Peer())) is (
        grpc.StatusCode.PERMISSION_DENIED
    )
    bad_shape = plain.join_request("p0")
    bad_shape.data.CopyFrom(
        pb.DataShape(num_classes=10, in_channels=3, image_height=8, image_width=8)
    )
    assert code_of(lambda: s.join(bad_shape, Peer())) is grpc.StatusCode.INVALID_ARGUMENT
    other_classes = plain.join_request("p0")  # an older site's label range, not the model's
    other_classes.data.num_classes = 7
    assert code_of(lambda: s.join(other_classes, Peer())) is grpc.StatusCode.INVALID_ARGUMENT
    unsent = plain.join_request("p1")  # today's site: no label range, the images fit
    unsent.data.num_classes = 0
    assert s.join(unsent, Peer()).session
    plain.join("p0")
    stale = pb.Caller(participant_id="p0", session="not-a-session")
    assert code_of(lambda: s.heartbeat(pb.HeartbeatRequest(caller=stale), Peer())) is (
        grpc.StatusCode.UNAUTHENTICATED
    )
    nobody = pb.Caller(participant_id="mallory", session="x")
    assert code_of(lambda: s.next_instruction(pb.InstructionRequest(caller=nobody), Peer())) is (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert (
        code_of(
            lambda: s.download_tensor(
                pb.DownloadRequest(caller=plain.caller("p0"), name="x"), Peer()
            )
        )
        is grpc.StatusCode.NOT_FOUND
    )
    rejected = plain.store.query("SELECT code FROM audit WHERE status='rejected'")
    assert ("PERMISSION_DENIED",) in rejected and ("INVALID_ARGUMENT",) in rejected


def test_plaintext_upload_validation_then_the_round_completes(plain: Harness) -> None:
    for pid in ("p0", "p1", "p2"):
        plain.join(pid)
    instruction = plain.poll("p0", {"train"})
    task_id = instruction.task_id
    # FedAvg's layout: Σ n_k Δ_k (model length), then Σ n_k, then Σ loss.
    length = plain.model.length + 2

    def update(delta: float) -> np.ndarray:
        return np.concatenate([np.full(plain.model.length, delta), [10.0, 0.5]])

    ok = update(0.0)
    meta = pb.UpdateMeta(num_samples=10, mean_loss=0.5, num_steps=1)
    s = plain.service

    def no_header() -> pb.UploadReceipt:
        return s.upload_tensor(iter([pb.TensorUpload(data=b"x")]), Peer())

    assert code_of(no_header) is grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: _upload(plain, "p0", "feed", ok, meta=meta)) is grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: _upload(plain, "p0", task_id, np.zeros(length + 1), meta=meta)) is (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert code_of(lambda: _upload(plain, "p0", task_id, ok.astype(np.float32), meta=meta)) is (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    nan = ok.copy()
    nan[7] = np.nan
    assert code_of(lambda: _upload(plain, "p0", task_id, nan, meta=meta)) is (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert code_of(lambda: _upload(plain, "p0", task_id, ok)) is grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: _upload(plain, "p0", task_id, ok, meta=meta, chunk=1 << 20)) is (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    truncated_header = header_for(ok)
    assert (
        code_of(lambda: _upload(plain, "p0", task_id, ok[:-1], meta=meta, header=truncated_header))
        is grpc.StatusCode.INVALID_ARGUMENT
    )
    # None of that left a trace: the task still waits for p0.
    assert "p0" not in plain.federation.board.task.uploads  # type: ignore[union-attr]
    receipt = _upload(plain, "p0", task_id, ok, meta=meta)
    assert receipt.num_bytes == 8 * length
    assert code_of(lambda: _upload(plain, "p0", task_id, ok, meta=meta)) is (
        grpc.StatusCode.ALREADY_EXISTS
    )
    wrong_kind = pb.EvaluationReport(caller=plain.caller("p0"), task_id=task_id, total=1)
    assert code_of(lambda: s.report_evaluation(wrong_kind, Peer())) is (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    # The others carry on: the round completes from the two valid uploads.
    for pid in ("p1", "p2"):
        t = plain.poll(pid, {"train"})
        _upload(plain, pid, t.task_id, update(0.1), meta=meta)
    instruction = plain.poll("p0", {"statistics"})
    assert plain.federation.completed_rounds == 1
    np.testing.assert_allclose(
        plain.federation.global_vector, plain.model.initial_vector + 0.2 / 30, atol=1e-12
    )
    # An upload for the finished round's task is refused as over.
    assert code_of(lambda: _upload(plain, "p1", task_id, ok, meta=meta)) is (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    rejected = plain.store.query("SELECT count(*) FROM audit WHERE status='rejected'")[0][0]
    accepted = plain.store.query(
        "SELECT count(*) FROM audit WHERE status='accepted' AND stage='update'"
    )[0][0]
    assert rejected >= 8 and accepted == 3


def test_secure_task_refuses_plaintext_and_wrong_stage_messages(secure: Harness) -> None:
    for pid in ("p0", "p1", "p2"):
        secure.join(pid)
    instruction = secure.poll("p0", {"train"})
    assert instruction.train.HasField("secure")
    job = crypto.JobSpec.from_bytes(instruction.train.secure.spec)
    s = secure.service
    length = secure.model.length
    meta = pb.UpdateMeta(num_samples=1, mean_loss=0.0)
    assert code_of(
        lambda: _upload(secure, "p0", instruction.task_id, np.zeros(length), meta=meta)
    ) is (grpc.StatusCode.FAILED_PRECONDITION)
    unknown = pb.SecAggSubmission(
        caller=secure.caller("p0"), job_id=b"\x01" * 16, stage=pb.ADVERTISE, message=b"x"
    )
    assert code_of(lambda: s.submit_secagg(unknown, Peer())) is grpc.StatusCode.NOT_FOUND
    garbage = pb.SecAggSubmission(
        caller=secure.caller("p0"), job_id=job.job_id, stage=pb.ADVERTISE, message=b"\x00" * 40
    )
    assert code_of(lambda: s.submit_secagg(garbage, Peer())) is grpc.StatusCode.INVALID_ARGUMENT
    early = crypto.UnmaskResponse(job_id=job.job_id, sender="p0", shares=())
    wrong_stage = pb.SecAggSubmission(
        caller=secure.caller("p0"), job_id=job.job_id, stage=pb.UNMASK, message=early.to_bytes()
    )
    assert code_of(lambda: s.submit_secagg(wrong_stage, Peer())) is (
        grpc.StatusCode.FAILED_PRECONDITION
    )

    def masked_now() -> pb.UploadReceipt:
        first = pb.MaskedUpload(caller=secure.caller("p0"), job_id=job.job_id, chunk=b"")
        return s.upload_masked(iter([first]), Peer())

    assert code_of(masked_now) is grpc.StatusCode.FAILED_PRECONDITION
    # A real advertisement is accepted once; the replay is refused.
    directory = {
        e.participant_id: e.identity_public_key for e in instruction.train.secure.directory
    }
    client = crypto.SecAggParticipant(job, "p0", secure.keys["p0"], directory)
    client.set_input(np.zeros(job.length))
    advert = pb.SecAggSubmission(
        caller=secure.caller("p0"),
        job_id=job.job_id,
        stage=pb.ADVERTISE,
        message=client.advertise_keys().to_bytes(),
    )
    s.submit_secagg(advert, Peer())
    assert code_of(lambda: s.submit_secagg(advert, Peer())) is grpc.StatusCode.ALREADY_EXISTS
    # p1 withdraws with a reason: the job stops waiting for it.
    t1 = secure.poll("p1", {"train"})
    s.report_failure(
        pb.FailureReport(
            caller=secure.caller("p1"),
            task_id=t1.task_id,
            reason="input out of bound",
            kind=pb.BAD_INPUT,
        ),
        Peer(),
    )
    assert secure.federation.board.task is not None
    secure_job = secure.federation.board.task.job
    assert secure_job is not None and "p1" in secure_job.withdrawn


def test_oversized_masked_chunk_is_refused(secure: Harness) -> None:
    job, _ = shared_secure_round(secure, ("p0", "p1", "p2"))
    step = secure.poll("p0", {"secagg"}).secagg
    assert step.stage == pb.MASKED
    huge = pb.MaskedUpload(caller=secure.caller("p0"), job_id=job.job_id, chunk=b"\0" * (1 << 20))
    assert code_of(lambda: secure.service.upload_masked(iter([huge]), Peer())) is (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert secure.federation.board.task is not None and secure.federation.board.task.job is not None
    assert secure.federation.board.task.job.server.uploading() == frozenset()
