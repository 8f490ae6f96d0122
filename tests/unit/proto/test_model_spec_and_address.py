"""``ModelSpec`` ↔ protobuf/JSON in one place (``spherecal.proto.codec``), and the one
``host:port`` / loopback parser (``spherecal.proto.address``) both sides use."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any

import pytest

from spherecal.participant.grpc_transport import is_loopback_address as participant_check
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.address import is_loopback, is_loopback_address, split_host_port
from spherecal.proto.codec import (
    model_spec_from_json,
    model_spec_from_proto,
    model_spec_to_json,
    model_spec_to_proto,
)
from spherecal.spherefed.network import ModelSpec

SPEC = ModelSpec(
    extractor="convnet",
    head="plain",
    norm="batch",
    classifier="learned",
    classifier_seed=2**63 + 5,
    init_seed=7,
    num_classes=100,
    in_channels=3,
    image_size=(32, 24),
    feature_dim=64,
)


@pytest.mark.parametrize("spec", [SPEC, replace(SPEC, feature_dim=None), ModelSpec()])
def test_model_spec_round_trips_through_protobuf_bytes(spec: ModelSpec) -> None:
    wire = pb.ModelSpec.FromString(model_spec_to_proto(spec).SerializeToString())
    back = ModelSpec(**model_spec_from_proto(wire))
    size = spec.image_size if isinstance(spec.image_size, tuple) else (spec.image_size,) * 2
    assert back == replace(spec, image_size=size)
    assert wire.image_height == size[0] and wire.image_width == size[1]


@pytest.mark.parametrize("spec", [SPEC, replace(SPEC, feature_dim=None)])
def test_model_spec_round_trips_through_json(spec: ModelSpec) -> None:
    text = json.dumps(model_spec_to_json(spec))
    assert ModelSpec(**model_spec_from_json(json.loads(text))) == spec
    # every field of the dataclass is written (a new field cannot be forgotten)
    assert set(json.loads(text)) == set(asdict(spec))


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"extractor": None}, "extractor must be a str"),
        ({"num_classes": "10"}, "num_classes must be a int"),
        ({"init_seed": True}, "init_seed must be a int"),
        ({"image_size": [8]}, "image_size must be"),
        ({"image_size": [8, 0]}, "image_size must be"),
        ({"feature_dim": 1.5}, "feature_dim must be"),
    ],
)
def test_bad_model_spec_json_is_refused(patch: dict[str, Any], message: str) -> None:
    data = {**model_spec_to_json(SPEC), **patch}
    with pytest.raises(ValueError, match=message):
        model_spec_from_json(data)


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [("127.0.0.1:50051", "127.0.0.1", 50051), ("[::1]:0", "::1", 0), ("a.b:65535", "a.b", 65535)],
)
def test_split_host_port(address: str, host: str, port: int) -> None:
    assert split_host_port(address) == (host, port)


@pytest.mark.parametrize("address", ["nohost", "h:x", "h:70000", "[::1]"])
def test_split_host_port_refuses(address: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(address)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:1", True),
        ("127.8.9.1:1", True),
        ("localhost:1", True),
        ("LOCALHOST:1", True),
        ("[::1]:1", True),
        ("10.0.0.1:1", False),
        ("[::2]:1", False),
        ("localhost.evil.com:1", False),  # no DNS, no suffix games
        ("0.0.0.0:1", False),
    ],
)
def test_both_sides_agree_on_loopback(address: str, loopback: bool) -> None:
    assert is_loopback_address(address) is loopback
    assert participant_check is is_loopback_address  # one implementation
    host, _ = split_host_port(address)
    assert is_loopback(host) is loopback
