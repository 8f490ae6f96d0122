"""The coordinator's boundary over real gRPC with mutual TLS (a real coordinator
process): unauthenticated, impersonating, unlisted, malformed, oversized, replayed and
wrong-stage requests get the right status code — and the federation still completes
with every participant afterwards, so none of them corrupted any state."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.certs import init_ca, issue_participant
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for
from spherecal.proto.identity import load_identity_key
from spherecal.proto.services import grpc_services
from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig
from tests.joins import signed_join

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Simulation, int]]:
    out = tmp_path_factory.mktemp("mtls")
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=1),
        out=out,
        calibration=("ffc",),
        tls=True,
        timeout_s=240,
    )
    sim = Simulation(settings)
    try:
        issue_participant(out / "certs", "mallory")  # valid CA, not on the roster
        init_ca(out / "eve-ca")
        issue_participant(out / "eve-ca", "p0")  # right name, wrong CA
        port = sim.start_coordinator()
        yield sim, port
    finally:
        sim.close()


def _channel(port: int, certs: Path | None, name: str | None) -> grpc.Channel:
    root = (Path(certs or ".") / "ca.pem") if certs else None
    ca = (root.read_bytes()) if root else None
    if name is None:
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        assert certs is not None
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(certs / f"{name}.key").read_bytes(),
            certificate_chain=(certs / f"{name}.pem").read_bytes(),
        )
    return grpc.secure_channel(f"127.0.0.1:{port}", creds)


def _stub(channel: grpc.Channel) -> Any:
    return grpc_services().CoordinatorStub(channel)


def _join_request(pid: str, key_path: Path | None) -> pb.JoinRequest:
    return signed_join(pid, load_identity_key(key_path) if key_path else None)


def _join_when_free(stub: Any, request: pb.JoinRequest) -> Any:
    """Join, retrying while the identity is held by another connection (as a site's
    process does: ``IDENTITY_IN_USE`` is retryable) — the previous test's stub left, and
    the coordinator sees its stream close a moment later."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return stub.Join(request, timeout=10)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.ALREADY_EXISTS or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _quietly(stream: Any) -> Iterator[Any]:
    try:
        yield from stream
    except grpc.RpcError:
        return


def _code(call: Any, *args: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, timeout=10)
        if hasattr(result, "__next__"):
            list(result)
    return info.value.code()


def test_connections_without_a_valid_client_certificate_are_refused(
    mtls: tuple[Simulation, int],
) -> None:
    sim, port = mtls
    certs = sim.out / "certs"
    probe = pb.HeartbeatRequest(caller=pb.Caller(participant_id="p0", session="x"))
    no_cert = _stub(_channel(port, certs, None))
    assert _code(no_cert.Heartbeat, probe) is grpc.StatusCode.UNAVAILABLE
    foreign = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.pem").read_bytes(),
        private_key=(sim.out / "eve-ca" / "p0.key").read_bytes(),
        certificate_chain=(sim.out / "eve-ca" / "p0.pem").read_bytes(),
    )
    eve = _stub(grpc.secure_channel(f"127.0.0.1:{port}", foreign))
    assert _code(eve.Heartbeat, probe) is grpc.StatusCode.UNAVAILABLE
    plaintext = _stub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    assert _code(plaintext.Heartbeat, probe) is grpc.StatusCode.UNAVAILABLE


def test_certificate_identity_roster_and_keys_are_enforced(mtls: tuple[Simulation, int]) -> None:
    sim, port = mtls
    certs = sim.out / "certs"
    p0 = _stub(_channel(port, certs, "p0"))
    # p0's certificate naming p1 in the request: impersonation.
    assert _code(p0.Join, _join_request("p1", certs / "p1.identity.key")) is (
        grpc.StatusCode.UNAUTHENTICATED
    )
    # A certificate from the federation CA for someone not on the roster.
    mallory = _stub(_channel(port, certs, "mallory"))
    assert _code(mallory.Join, _join_request("mallory", certs / "mallory.identity.key")) is (
        grpc.StatusCode.PERMISSION_DENIED
    )
    # ... nor its status: the roster, the jobs and their reasons are the federation's
    # (until 2026-11-27 any certificate of the CA was answered)
    mallory_status = pb.StatusRequest(caller=pb.Caller(participant_id="mallory"))
    assert _code(mallory.GetStatus, mallory_status) is grpc.StatusCode.PERMISSION_DENIED
    # The right certificate with an identity key it does not bind.
    assert _code(p0.Join, _join_request("p0", None)) is grpc.StatusCode.PERMISSION_DENIED
    request = _join_request("p0", certs / "p0.identity.key")
    reply = p0.Join(request, timeout=10)
    assert reply.session and reply.plan.participant_index == 0
    assert _code(p0.Join, request) is grpc.StatusCode.ALREADY_EXISTS  # replayed
    bad_session = pb.InstructionRequest(caller=pb.Caller(participant_id="p0", session="nope"))
    assert _code(p0.NextInstruction, bad_session) is grpc.StatusCode.UNAUTHENTICATED
    status = p0.GetStatus(pb.StatusRequest(caller=pb.Caller(participant_id="p0")), timeout=10)
    assert status.phase == "waiting for participants"
    # a member sees its own presence only
    assert [m.participant_id for m in status.participants] == ["p0"]
    # Malformed and oversized requests.
    caller = pb.Caller(participant_id="p0", session=reply.session)
    assert _code(p0.UploadTensor, iter([pb.TensorUpload(data=b"x")])) is (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    huge = pb.SecAggSubmission(caller=caller, job_id=b"\1" * 16, message=b"\0" * (9 << 20))
    assert _code(p0.SubmitSecAgg, huge) is grpc.StatusCode.RESOURCE_EXHAUSTED  # > 8 MiB
    unknown_job = pb.SecAggSubmission(caller=caller, job_id=b"\1" * 16, stage=pb.ADVERTISE)
    assert _code(p0.SubmitSecAgg, unknown_job) is grpc.StatusCode.NOT_FOUND
    _leave(p0, caller)


def _leave(stub: Any, caller: pb.Caller) -> None:
    """End this stub's hold on the identity as a site's process does when it goes: its
    presence stream closes. A session heard from within the heartbeat timeout is live,
    and another connection's join is refused meanwhile (one process per identity), so
    the next test's "process" could not join for 20 s otherwise."""
    presence = stub.Presence(pb.HeartbeatRequest(caller=caller))
    next(presence)  # the coordinator has opened it
    presence.cancel()


def test_wrong_stage_requests_during_a_job_then_the_federation_completes(
    mtls: tuple[Simulation, int],
) -> None:
    sim, port = mtls
    certs = sim.out / "certs"
    p0 = _stub(_channel(port, certs, "p0"))
    session = _join_when_free(p0, _join_request("p0", certs / "p0.identity.key")).session
    caller = pb.Caller(participant_id="p0", session=session)
    # Stay visibly alive while we misbehave (and until the real p0 has taken over).
    presence = p0.Presence(pb.HeartbeatRequest(caller=caller))
    threading.Thread(target=lambda: list(_quietly(presence)), daemon=True).start()
    sim.start_participants(only=["p1", "p2"])
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, "round 1 never started"
        instruction = p0.NextInstruction(
            pb.InstructionRequest(caller=caller, wait_ms=2000), timeout=30
        )
        if instruction.WhichOneof("kind") == "train":
            break
    job = crypto.JobSpec.from_bytes(instruction.train.secure.spec)
    assert {e.participant_id for e in instruction.train.secure.directory} == {"p0", "p1", "p2"}
    assert all(e.certificate_pem for e in instruction.train.secure.directory)

    garbage = pb.SecAggSubmission(
        caller=caller, job_id=job.job_id, stage=pb.ADVERTISE, message=b"SCSA\x01\x10junk"
    )
    assert _code(p0.SubmitSecAgg, garbage) is grpc.StatusCode.INVALID_ARGUMENT
    early = crypto.UnmaskResponse(job_id=job.job_id, sender="p0", shares=())
    wrong_stage = pb.SecAggSubmission(
        caller=caller, job_id=job.job_id, stage=pb.UNMASK, message=early.to_bytes()
    )
    assert _code(p0.SubmitSecAgg, wrong_stage) is grpc.StatusCode.FAILED_PRECONDITION
    vector = np.zeros(job.length - 2)
    plain = iter(
        [
            pb.TensorUpload(
                header=pb.UploadHeader(
                    caller=caller,
                    task_id=instruction.task_id,
                    tensor=header_for(vector),
                    update=pb.UpdateMeta(num_samples=1),
                )
            )
        ]
    )
    assert _code(p0.UploadTensor, plain) is grpc.StatusCode.FAILED_PRECONDITION
    masked = iter([pb.MaskedUpload(caller=caller, job_id=job.job_id, chunk=b"")])
    assert _code(p0.UploadMasked, masked) is grpc.StatusCode.FAILED_PRECONDITION
    status = p0.GetStatus(pb.StatusRequest(caller=caller), timeout=10)
    assert [(j.purpose, j.state, j.stage) for j in status.jobs] == [
        ("update", "running", "advertise")
    ]

    # Now the misbehaving client goes away and the real p0 takes over (same identity,
    # new session; one live process per identity, so not while the other is connected).
    presence.cancel()
    sim.start_participants(only=["p0"])
    try:
        assert sim.wait_coordinator(180) == 0
    finally:
        presence.cancel()
    codes = sim.wait_participants()
    assert codes == {"p0": 0, "p1": 0, "p2": 0}
    summary = sim.summary()
    assert summary["status"] == "completed", summary.get("errors")
    # the round, the statistics and the (secure) federated evaluation
    assert [j["purpose"] for j in summary["jobs"]][-1] == "evaluate"
    # (the round-1 attempt the impostor held ends when it leaves, and is retried)
    contributed = [j["contributors"] for j in summary["jobs"]]
    assert contributed[-3:] == [["p0", "p1", "p2"]] * 3
    assert all(c in ([], ["p0", "p1", "p2"]) for c in contributed), contributed
    db = sqlite3.connect(summary["audit_log"])
    codes_seen = {row[0] for row in db.execute("SELECT code FROM audit WHERE status='rejected'")}
    assert {
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "ALREADY_EXISTS",
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "FAILED_PRECONDITION",
    } <= codes_seen
