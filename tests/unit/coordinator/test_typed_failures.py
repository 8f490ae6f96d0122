"""Typed meaning on the wire: ``FailureKind`` (participant → coordinator) and
``ErrorReason`` (coordinator → participant), never class names or English text."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.dp_releases import CoordinatorPrivacy
from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.errors import ServiceError, failure_kind, from_secagg
from spherecal.coordinator.server.grpc_server import build_server
from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.server.traffic import Traffic
from spherecal.coordinator.settings import ServerSettings
from spherecal.coordinator.state.registry import Peer, Registry
from spherecal.coordinator.state.store import Store
from spherecal.participant.dp_gate import PrivacyRefused
from spherecal.participant.failures import failure_kind as participant_kind
from spherecal.participant.grpc_transport import GrpcTransport
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.transport import TransportError
from spherecal.participant.trust import UntrustedDirectory
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.error_detail import ERROR_DETAIL_KEY, error_metadata, reason_from_metadata
from spherecal.spherefed.privacy.ledger import BudgetExceeded
from spherecal.spherefed.privacy.settings import PrivacySettings

from .service_harness import Harness, settings_for


def _secagg_subclasses() -> list[type[crypto.SecAggError]]:
    found: list[type[crypto.SecAggError]] = []
    stack = list(crypto.SecAggError.__subclasses__())
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__name__)


def _bare(cls: type[crypto.SecAggError]) -> crypto.SecAggError:
    """An instance without running ``__init__`` (some take keyword-only numbers)."""
    return cls.__new__(cls)


@pytest.mark.parametrize("cls", _secagg_subclasses(), ids=lambda c: c.__name__)
def test_every_secagg_error_has_a_failure_kind_and_a_status(
    cls: type[crypto.SecAggError],
) -> None:
    error = _bare(cls)
    kind = participant_kind(error)
    assert kind not in (pb.FAILURE_KIND_UNSPECIFIED, pb.INTERNAL_ERROR), cls.__name__
    assert isinstance(from_secagg(error).code, grpc.StatusCode)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            BudgetExceeded(
                subject="p0",
                limit="total",
                budget_epsilon=1.0,
                spent_epsilon=1.0,
                release_epsilon=1.0,
                projected_epsilon=2.0,
                delta=1e-5,
                release_kind="ffc",
            ),
            pb.BUDGET_EXCEEDED,
        ),
        (PrivacyRefused("no noise"), pb.POLICY_REFUSAL),
        (PermissionError("no plaintext"), pb.POLICY_REFUSAL),
        (UntrustedDirectory("bad key"), pb.UNTRUSTED_DIRECTORY),  # a ValueError, but not bad input
        (ValueError("no data"), pb.BAD_INPUT),
        (_bare(crypto.TooFewSurvivors), pb.TOO_FEW_SURVIVORS),
        (_bare(crypto.ForgedShare), pb.SHARE_AUTHENTICATION),
        (RuntimeError("bug"), pb.INTERNAL_ERROR),
    ],
)
def test_participant_names_the_kind(error: BaseException, kind: int) -> None:
    assert participant_kind(error) == kind


def test_the_coordinator_reads_the_kind_not_the_text() -> None:
    report = pb.FailureReport(reason="BudgetExceeded: over budget", kind=pb.BAD_INPUT)
    assert failure_kind(report) == pb.BAD_INPUT
    assert failure_kind(pb.FailureReport(reason="x")) == pb.INTERNAL_ERROR  # unspecified
    with pytest.raises(ServiceError) as info:
        failure_kind(pb.FailureReport(kind=99))  # type: ignore[arg-type]
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_privacy_refusals_come_from_the_typed_report(tmp_path: Path) -> None:
    privacy = CoordinatorPrivacy(PrivacySettings(enabled=True, epsilon=1.0), tmp_path / "p.db")
    try:
        privacy.record_refusal("job1", "p0", pb.BUDGET_EXCEEDED)
        dropped = {
            "p0": "masked: withdrew: over the budget",
            "p1": "masked: withdrew: BudgetExceeded: PrivacyRefused: looks like one, is not",
        }
        lines = privacy.note_refusals("job1", "ffc", dropped)
        assert len(lines) == 1 and "p0" in lines[0]
        (refusal,) = privacy.refusals
        assert refusal["participant"] == "p0" and refusal["refusal"] == "BUDGET_EXCEEDED"
        assert privacy.note_refusals("job2", "ffc", {"p0": "x"}) == []  # another job
    finally:
        privacy.close()


def test_report_failure_withdraws_with_the_kind(tmp_path: Path) -> None:
    harness = Harness(settings_for(tmp_path, secure=True)).start()
    try:
        for pid in ("p0", "p1", "p2"):
            harness.join(pid)
        task = harness.poll("p1", {"train"})
        harness.service.report_failure(
            pb.FailureReport(
                caller=harness.caller("p1"), task_id=task.task_id, reason="r", kind=pb.BAD_INPUT
            ),
            Peer(),
        )
        assert harness.federation.board.task is not None
        job = harness.federation.board.task.job
        assert job is not None and job.withdrawn["p1"] == "BAD_INPUT: r"
        with pytest.raises(ServiceError) as info:
            harness.service.report_failure(
                pb.FailureReport(caller=harness.caller("p2"), task_id=task.task_id, kind=42),  # type: ignore[arg-type]
                Peer(),
            )
        assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "p2" not in job.withdrawn  # a bad report loses nothing
    finally:
        harness.close()


def test_error_detail_round_trip_and_garbage() -> None:
    assert reason_from_metadata(error_metadata(pb.SESSION_EXPIRED)) == pb.SESSION_EXPIRED
    assert error_metadata(pb.ERROR_REASON_UNSPECIFIED) == ()
    assert reason_from_metadata([(ERROR_DETAIL_KEY, b"\xff\xff")]) == pb.ERROR_REASON_UNSPECIFIED
    unknown = pb.ErrorDetail(reason=77).SerializeToString()  # type: ignore[arg-type]
    assert reason_from_metadata([(ERROR_DETAIL_KEY, unknown)]) == pb.ERROR_REASON_UNSPECIFIED
    assert reason_from_metadata(None) == pb.ERROR_REASON_UNSPECIFIED
    busy = from_secagg(_bare(crypto.UploadSlotsBusy))
    assert busy.code is grpc.StatusCode.UNAVAILABLE and busy.reason == pb.UPLOAD_SLOTS_BUSY
    # the participant's checks read the reason only
    assert not TransportError(grpc.StatusCode.UNAUTHENTICATED, "session expired").session_expired
    assert not TransportError(grpc.StatusCode.UNAVAILABLE, "slot busy").slots_busy
    assert TransportError(
        grpc.StatusCode.UNAUTHENTICATED, "", reason=pb.SESSION_EXPIRED
    ).session_expired


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[int]:
    settings = replace(
        settings_for(tmp_path, secure=False),
        server=ServerSettings(listen="127.0.0.1:0", insecure=True),
    )
    store = Store(settings.state_dir / "state.db")
    registry = Registry(
        settings.participants, store, require_certificates=False, heartbeat_timeout_s=30,
        clock_skew_s=60,
    )  # fmt: skip
    federation = Federation(settings, store, registry, say=lambda m: None)
    federation.prepare()
    service = CoordinatorService(settings, registry, federation, store, Traffic())
    grpc_server, port = build_server(settings, service)
    grpc_server.start()
    try:
        yield port
    finally:
        grpc_server.stop(grace=None).wait()
        store.close()


def test_an_expired_session_is_typed_over_real_grpc(server: int) -> None:
    transport = GrpcTransport(
        ParticipantSettings(participant_id="p0", coordinator=f"127.0.0.1:{server}", insecure=True)
    )
    try:
        with pytest.raises(TransportError) as info:
            transport.get_status(
                pb.StatusRequest(caller=pb.Caller(participant_id="p0", session="stale"))
            )
        assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
        assert info.value.reason == pb.SESSION_EXPIRED and info.value.session_expired
        # a refusal without a reason carries none
        with pytest.raises(TransportError) as other:
            transport.get_status(pb.StatusRequest(caller=pb.Caller(participant_id="zz")))
        assert other.value.reason == pb.ERROR_REASON_UNSPECIFIED
    finally:
        transport.close()


def _exception_classes() -> list[tuple[str, str]]:
    """(module path, class name) of every class in the project that derives from an
    exception class, found by reading the source (no imports)."""
    import ast

    root = Path(__file__).resolve().parents[3]
    names: dict[str, set[str]] = {}
    bases: dict[tuple[str, str], list[str]] = {}
    for package in ("proto", "crypto", "spherefed", "participant", "coordinator", "spherecal"):
        for path in (root / package).rglob("*.py"):
            if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    key = (str(path.relative_to(root)), node.name)
                    bases[key] = [
                        b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                        for b in node.bases
                    ]
                    names.setdefault(node.name, set()).add(key[0])
    exceptional = {"Exception", "ValueError", "RuntimeError", "PermissionError"}
    found: set[tuple[str, str]] = set()
    changed = True
    while changed:
        changed = False
        for key, parents in bases.items():
            if key not in found and any(
                p in exceptional or p in {k[1] for k in found} for p in parents
            ):
                found.add(key)
                changed = True
    return sorted(found)


def test_every_exception_class_is_in_a_documented_tree() -> None:
    from spherecal.coordinator import errors as coordinator_errors
    from spherecal.crypto import _exceptions as crypto_exceptions

    trees = (crypto_exceptions.__doc__ or "") + (coordinator_errors.__doc__ or "")
    classes = _exception_classes()
    assert ("coordinator/errors.py", "ServiceError") in classes  # the scan finds them
    missing = [
        f"{path}:{name}"
        for path, name in classes
        if not re.search(rf"(─ |^\s*){name}\b", trees, re.MULTILINE)
        and not path.startswith("crypto/dp.py")
    ]
    # crypto/dp.py's RingOverflowRisk / NoiseTooLarge join crypto's tree in another branch
    assert not missing, f"exception classes in no documented tree: {missing}"
