"""A ``FailureReport`` without a task id: the site refused the federation's plan and
leaves. The coordinator ends its session at once — it is neither joined nor alive,
so a join window waits for it and ``spherecal status`` shows why it left — records
the refusal, and takes the site back when it joins again. (The whole path with real
processes: ``tests/integration/test_plan_refusal.py``.)"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.state.registry import Peer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.status import render_status

from .service_harness import Harness, code_of, settings_for

LABELS = "this site's labels do not fit the plan's model of 10 classes"


def _refuse_plan(harness: Harness, pid: str, **report: object) -> pb.Receipt:
    fields: dict[str, object] = {"reason": LABELS, "kind": pb.BAD_INPUT, **report}
    request = pb.FailureReport(caller=harness.caller(pid), task_id="", **fields)  # type: ignore[arg-type]
    return harness.service.report_failure(request, Peer())


def _roster(harness: Harness) -> dict[str, pb.RosterEntry]:
    status = harness.service.get_federation_status(pb.FederationStatusRequest(), Peer())
    return {r.participant_id: r for r in status.roster}


def test_a_site_that_refuses_the_plan_leaves_at_once(tmp_path: Path) -> None:
    harness = Harness(settings_for(tmp_path, secure=False))
    try:
        harness.join("p0")
        harness.join("p1")
        assert _refuse_plan(harness, "p0").message == "noted"
        assert harness.registry.joined() == {"p1"} and harness.registry.alive() == {"p1"}
        entry = _roster(harness)["p0"]
        assert (entry.joined, entry.connected, entry.joins) == (False, False, 1)
        assert entry.left == f"refused the federation's plan: BAD_INPUT: {LABELS}"
        text = render_status(
            harness.service.get_federation_status(pb.FederationStatusRequest(), Peer())
        )
        (line,) = [x for x in text.splitlines() if x.strip().startswith("p0 ")]
        assert line.split()[1] == "left" and line.endswith(entry.left)
        warning = f"p0 refused the federation's plan and left: BAD_INPUT: {LABELS}"
        assert f"WARNING: {warning}" in text
        # its old session is over; a later join makes it a member like any other again
        with pytest.raises(ServiceError) as expired:
            harness.service.heartbeat(pb.HeartbeatRequest(caller=harness.caller("p0")), Peer())
        assert expired.value.reason == pb.SESSION_EXPIRED
        harness.join("p0")
        entry = _roster(harness)["p0"]
        assert (entry.joined, entry.connected, entry.joins, entry.left) == (True, True, 2, "")
        # the events table, written behind the calls, in order
        events = [m for (m,) in harness.store.query("SELECT message FROM events ORDER BY id")]
        assert events.index(warning) < events.index("p0 joined (join #2)")
    finally:
        harness.store.close()


def test_a_policy_refusal_of_the_plan_is_a_typed_refusal(tmp_path: Path) -> None:
    harness = Harness(settings_for(tmp_path, secure=False))
    try:
        harness.join("p2")
        _refuse_plan(
            harness,
            "p2",
            kind=pb.POLICY_REFUSAL,
            rule=pb.RULE_EXAMPLE_COUNT_NOISE,
            reason="the plan's integrity checks allow sd 2",
        )
        (refusal,) = harness.federation.stages.conduct.refusals
        assert (refusal.participant, refusal.job, refusal.purpose) == ("p2", "", "plan")
        assert (refusal.kind, refusal.rule) == ("POLICY_REFUSAL", "RULE_EXAMPLE_COUNT_NOISE")
        assert harness.federation.warnings == [
            "p2 refused the federation's plan and left: POLICY_REFUSAL/"
            "RULE_EXAMPLE_COUNT_NOISE: the plan's integrity checks allow sd 2"
        ]
    finally:
        harness.store.close()


def test_a_refusal_of_an_unknown_kind_is_refused_and_the_site_stays(tmp_path: Path) -> None:
    harness = Harness(settings_for(tmp_path, secure=False))
    try:
        harness.join("p0")
        code = code_of(lambda: _refuse_plan(harness, "p0", kind=99))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert harness.registry.joined() == {"p0"} and _roster(harness)["p0"].left == ""
    finally:
        harness.store.close()
