"""``spherecal status --json`` (issue #26): every field of ``FederationStatus`` by its
``.proto`` name, zero values included, 64-bit integers as JSON numbers."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict

from spherecal.proto import spherecal_pb2 as pb
from spherecal.status import status_json


def _check_keys(obj: dict[str, Any], descriptor: Any) -> int:
    """Assert ``obj`` has exactly the descriptor's field names; return fields seen."""
    assert set(obj) == {f.name for f in descriptor.fields}, descriptor.full_name
    seen = len(obj)
    for field in descriptor.fields:
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        values = obj[field.name] if field.is_repeated else [obj[field.name]]
        for value in values:
            seen += _check_keys(value, field.message_type)
    return seen


def _one_of_each() -> pb.FederationStatus:
    """A status with one element in every repeated message field (so the nested
    messages' keys are checked too), all at their zero values."""
    return pb.FederationStatus(
        roster=[pb.RosterEntry()],
        completed=[pb.RoundSummary()],
        jobs=[pb.JobStatus()],
        epsilon=[pb.EpsilonSpent()],
    )


def test_keys_are_the_descriptor_fields_at_every_level() -> None:
    out = json.loads(json.dumps(status_json(_one_of_each())))
    assert _check_keys(out, pb.FederationStatus.DESCRIPTOR) > 19
    # what the old output (MessageToDict) lost: the zero values
    old = MessageToDict(_one_of_each(), preserving_proto_field_name=True)
    assert "refusals" not in old and "privacy_enabled" not in old
    assert out["refusals"] == 0 and out["privacy_enabled"] is False
    assert (
        out["warnings"] == []
        and out["errors"] == []
        and out["epsilon"]
        == [
            {
                "subject": "",
                "epsilon": 0.0,
            }
        ]
    )
    assert out["roster"][0]["index"] == 0


def test_64_bit_integers_are_numbers_and_optionals_null_when_unset() -> None:
    st = pb.FederationStatus(
        refusals=2**64 - 1,
        completed=[pb.RoundSummary(round=1, test_accuracy=0.0), pb.RoundSummary(round=2)],
    )
    out = json.loads(json.dumps(status_json(st)))
    assert out["refusals"] == 2**64 - 1 and isinstance(out["refusals"], int)
    first, second = out["completed"]
    assert first["test_accuracy"] == 0.0 and first["federated_accuracy"] is None
    assert second["test_accuracy"] is None


def test_non_finite_floats_stay_valid_json() -> None:
    out = status_json(pb.FederationStatus(uptime_s=float("nan")))
    assert out["uptime_s"] == "NaN"
    json.loads(json.dumps(out, allow_nan=False))
