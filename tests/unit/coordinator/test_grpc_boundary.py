"""The gRPC boundary over a real loopback socket: undecodable bytes, the documented
status codes, exact ids, the end of a federation, a busy port, health, reflection."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import spherecal.coordinator.errors as errors_module
from spherecal import crypto
from spherecal.coordinator.errors import (
    DOCUMENTED_CODES,
    ERROR_CODES,
    ServiceError,
    from_secagg,
    status_for,
)
from spherecal.coordinator.server.grpc_server import (
    _METHODS,
    SERVICE_NAME,
    PortInUse,
    build_server,
    ensure_port_free,
)
from spherecal.coordinator.server.health import HealthReporter
from spherecal.coordinator.server.log_limit import RepeatFilter, RepeatLimiter, rate_limited
from spherecal.coordinator.state.registry import Peer
from spherecal.participant.backoff import ParticipantExit, stop_if_ended
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.federation_end import ended_status
from tests.joins import signed_join

from .service_harness import Harness, code_of, settings_for

GARBAGE = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"  # an unterminated varint tag


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Harness, grpc.Channel, HealthReporter, int]]:
    settings = settings_for(tmp_path, secure=False)
    settings = replace(settings, server=replace(settings.server, listen="127.0.0.1:0"))
    harness = Harness(settings)
    health = HealthReporter()
    server, port = build_server(settings, harness.service, health=health)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield harness, channel, health, port
    finally:
        channel.close()
        server.stop(grace=None).wait()
        harness.store.close()


def _raw_code(channel: grpc.Channel, name: str, streams_in: bool, streams_out: bool) -> str:
    path = f"/{SERVICE_NAME}/{name}"
    try:
        if streams_in:
            channel.stream_unary(path)(iter([GARBAGE]), timeout=10)
        elif streams_out:
            list(channel.unary_stream(path)(GARBAGE, timeout=10))
        else:
            channel.unary_unary(path)(GARBAGE, timeout=10)
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


def test_undecodable_bytes_get_invalid_argument_on_every_method(
    served: tuple[Harness, grpc.Channel, HealthReporter, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, channel, _, _ = served
    with caplog.at_level(logging.DEBUG):
        codes = {
            name: _raw_code(channel, name, streams_in, streams_out)
            for name, streams_in, streams_out, _, _ in _METHODS
        }
    assert codes == {name: "INVALID_ARGUMENT" for name, *_ in _METHODS}
    assert not [r for r in caplog.records if r.exc_info], "no traceback for bad bytes"


def test_every_service_method_is_served_with_a_safe_deserializer() -> None:
    names = {m.name for m in pb.DESCRIPTOR.services_by_name["Coordinator"].methods}
    assert {name for name, *_ in _METHODS} == names


def test_unmapped_exception_is_internal_and_logged(
    served: tuple[Harness, grpc.Channel, HealthReporter, int],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness, channel, _, _ = served

    def broken(request: pb.StatusRequest, peer: Peer) -> pb.StatusReply:
        raise RuntimeError("a bug")

    monkeypatch.setattr(harness.service, "get_status", broken)  # fault injection
    stub = channel.unary_unary(
        f"/{SERVICE_NAME}/GetStatus",
        request_serializer=pb.StatusRequest.SerializeToString,
        response_deserializer=pb.StatusReply.FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        stub(pb.StatusRequest(), timeout=10)
    assert info.value.code() is grpc.StatusCode.INTERNAL
    assert "a bug" not in (info.value.details() or "")  # internals stay in the log
    assert any(r.exc_info and "internal error" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------- error table
def _all_subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    children: list[type] = type.__subclasses__(cls)
    for child in children:
        out |= {child} | _all_subclasses(child)
    return out


def test_every_secagg_error_class_has_an_explicit_documented_code() -> None:
    explicit = {kind for kind, _ in ERROR_CODES}
    subclasses = {
        c
        for c in _all_subclasses(crypto.SecAggError)
        if c.__module__.startswith("spherecal.crypto")
    }
    assert subclasses, "crypto defines its error classes"
    assert subclasses <= explicit, f"unmapped: {sorted(c.__name__ for c in subclasses - explicit)}"
    doc = errors_module.__doc__ or ""
    for kind, code in ERROR_CODES:
        assert code in DOCUMENTED_CODES and code.name in doc, kind
        instance = kind.__new__(kind)  # some take keyword-only details; not needed here
        Exception.__init__(instance, "x")
        mapped = status_for(instance)
        assert mapped is not None and mapped.code is code


def test_every_error_class_of_coordinator_errors_maps_to_a_documented_code() -> None:
    classes = [
        obj
        for obj in vars(errors_module).values()
        if isinstance(obj, type)
        and issubclass(obj, Exception)
        and obj.__module__ == errors_module.__name__
    ]
    assert {c.__name__ for c in classes} >= {"ServiceError", "FederationFailed"}
    for cls in classes:
        if cls is ServiceError:
            continue  # carries its own code
        mapped = status_for(cls("x"))
        assert mapped is not None and mapped.code in DOCUMENTED_CODES, cls
    assert status_for(errors_module.FederationFailed("stopped")).code is (  # type: ignore[union-attr]
        grpc.StatusCode.FAILED_PRECONDITION
    )


def test_status_for_keeps_service_errors_and_leaves_unknown_ones_unmapped() -> None:
    error = ServiceError(grpc.StatusCode.NOT_FOUND, "no")
    assert status_for(error) is error
    assert status_for(RuntimeError("bug")) is None
    assert status_for(KeyError("x")) is None
    assert from_secagg(crypto.DuplicateMessage("t")).code is grpc.StatusCode.ALREADY_EXISTS


# ---------------------------------------------------------------------- exact ids
def test_ids_are_matched_exactly(served: tuple[Harness, grpc.Channel, HealthReporter, int]) -> None:
    harness, _, _, _ = served
    harness.join("p0")
    # (an empty id is no task: the site refusing the plan, test_plan_refusal.py)
    for task_id in (" 00ff", "00ff ", "00FF", "0 0ff", "0g"):
        report = pb.FailureReport(caller=harness.caller("p0"), task_id=task_id, reason="r")
        assert (
            code_of(lambda r=report: harness.service.report_failure(r, Peer()))
            is grpc.StatusCode.INVALID_ARGUMENT
        ), task_id
    unknown = pb.FailureReport(caller=harness.caller("p0"), task_id="00ff", reason="r")
    assert code_of(lambda: harness.service.report_failure(unknown, Peer())) is (
        grpc.StatusCode.NOT_FOUND
    )


# ---------------------------------------------------------------------- federation end
def test_join_after_the_end_says_so_and_the_participant_stops(
    served: tuple[Harness, grpc.Channel, HealthReporter, int],
) -> None:
    harness, _, _, _ = served
    harness.start()
    harness.federation.stop("operator")
    harness.thread.join(timeout=30)
    assert harness.federation.board.done is not None
    with pytest.raises(ServiceError) as info:
        harness.service.join(harness.join_request("p1"), Peer())
    assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert ended_status(info.value.message) == "failed"
    with pytest.raises(ParticipantExit) as stop:
        stop_if_ended(info.value.code, info.value.message)
    assert stop.value.code == 1 and "federation has ended" in str(stop.value)
    stop_if_ended(grpc.StatusCode.FAILED_PRECONDITION, "task 'ab' is over")  # not the end
    stop_if_ended(grpc.StatusCode.UNAVAILABLE, "federation has ended (completed)")
    # told the end, never its reasons: they name sites and what they sent
    assert "stopped: operator" not in info.value.message
    assert info.value.message.endswith(
        "its reasons are in the coordinator's status and summary (its operator's view)"
    )
    # and only a roster member is told (until 2026-11-27 anyone who asked)
    with pytest.raises(ServiceError) as outsider:
        harness.service.join(signed_join("mallory", crypto.generate_identity()), Peer())
    assert outsider.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert ended_status(outsider.value.message) is None


# ---------------------------------------------------------------------- port, health, reflection
def test_a_second_server_on_a_busy_port_is_refused(
    served: tuple[Harness, grpc.Channel, HealthReporter, int], tmp_path: Path
) -> None:
    harness, _, _, port = served
    settings = replace(
        harness.settings, server=replace(harness.settings.server, listen=f"127.0.0.1:{port}")
    )
    with pytest.raises(PortInUse, match=f"port {port} is already in use"):
        build_server(settings, harness.service)
    with pytest.raises(PortInUse, match=f"port {port} is already in use"):
        ensure_port_free(f"127.0.0.1:{port}")  # the early check, before any state is opened
    ensure_port_free("127.0.0.1:0")


def test_health_reports_serving_then_not_serving(
    served: tuple[Harness, grpc.Channel, HealthReporter, int],
) -> None:
    _, channel, health, _ = served
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE_NAME):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    health.serving(False)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_reflection_lists_the_coordinator_service(
    served: tuple[Harness, grpc.Channel, HealthReporter, int],
) -> None:
    _, channel, _, _ = served
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = list(
        stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    )
    names = {s.name for s in replies[0].list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names
    symbol = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME)
    (reply,) = list(stub.ServerReflectionInfo(iter([symbol])))
    assert reply.file_descriptor_response.file_descriptor_proto  # the .proto is served


# ---------------------------------------------------------------------- log rate limit
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_repeated_lines_are_written_once_per_window_with_counts() -> None:
    clock = _Clock()
    lines: list[str] = []
    say = rate_limited(lines.append, RepeatLimiter(window_s=10, clock=clock))
    for _ in range(500):
        say("refused: bad bytes")
    say("other")
    assert lines == ["refused: bad bytes", "other"]
    clock.now = 11
    say("refused: bad bytes")
    assert lines[-1] == "refused: bad bytes (+499 identical in 11s)"
    say("refused: bad bytes")  # a new window began
    clock.now = 30
    say("third")
    assert lines[-2:] == ["refused: bad bytes (+1 identical in 19s, then stopped)", "third"]


def test_repeat_filter_drops_identical_records() -> None:
    clock = _Clock()
    filt = RepeatFilter(RepeatLimiter(window_s=5, clock=clock))

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("x", logging.ERROR, __file__, 1, message, None, None)

    assert filt.filter(record("boom"))
    assert not any(filt.filter(record("boom")) for _ in range(99))
    clock.now = 6
    again = record("boom")
    assert filt.filter(again) and again.getMessage() == "boom (+99 identical in 6s)"
