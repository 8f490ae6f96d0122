"""The committed generated modules must match what protoc makes from the .proto."""

from __future__ import annotations

from pathlib import Path

import pytest

from spherecal.proto._generate import GENERATED, ROOT, generate

PROTO_DIR = ROOT / "proto"


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    fresh = generate(tmp_path)
    stale = [
        path.name for path in fresh if path.read_bytes() != (PROTO_DIR / path.name).read_bytes()
    ]
    assert not stale, (
        f"generated modules are stale: {stale}; "
        "run `python -m spherecal.proto._generate` and commit"
    )
    assert {p.name for p in fresh} == set(GENERATED)


def test_grpc_services_expose_every_rpc() -> None:
    from spherecal.proto import spherecal_pb2
    from spherecal.proto.services import grpc_services

    module = grpc_services()
    service = spherecal_pb2.DESCRIPTOR.services_by_name["Coordinator"]
    names = {m.name for m in service.methods}
    assert names == {
        "Join",
        "Heartbeat",
        "Presence",
        "NextInstruction",
        "DownloadTensor",
        "UploadTensor",
        "SubmitSecAgg",
        "UploadMasked",
        "ReportEvaluation",
        "ReportFailure",
        "GetStatus",
        "GetFederationStatus",
    }
    for name in names:
        assert hasattr(module.CoordinatorServicer, name)
