"""A ``FailureReport`` without a task id: the site refused the federation's plan and
leaves. The coordinator ends its session at once — it is neither joined nor alive,
and ``spherecal status`` shows why it left — records the refusal, and takes the site
back when it joins again. The join window no longer waits for it: it closes once
every other site joined, fails the federation at once when the others cannot make
its minimum, and counts a site that joins again as any other. (The whole path with
real processes: ``tests/integration/test_plan_refusal.py``.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.state.registry import Peer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.status import render_status

from .service_harness import Harness, code_of, settings_for

LABELS = "this site's labels do not fit the plan's model of 10 classes"
NOISE = "the plan's integrity checks allow sd 2"
WAITING = "waiting for participants"


def _until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait for a state to be reached (never a duration asserted). The join windows
    below are 600 s: a window that waited for a site that refused never gets there."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def _long_window(tmp_path: Path, *, secure: bool) -> Harness:
    settings = settings_for(tmp_path, secure=secure)
    return Harness(replace(settings, timeouts=replace(settings.timeouts, join_s=600.0)))


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


def test_the_join_window_does_not_wait_for_a_site_that_refused(tmp_path: Path) -> None:
    harness = _long_window(tmp_path, secure=False).start()  # needs 2 of p0, p1, p2
    try:
        harness.join("p0")
        _refuse_plan(harness, "p0")
        harness.join("p1")
        assert harness.federation.phase == WAITING  # p2 may still come: it waits for it
        harness.join("p2")
        # every site that did not refuse is in: round 1 starts, not after 600 s
        train = harness.poll("p1", {"train"})
        assert train.train.round == 0
        warning = (
            "every participant that has not left joined: continuing with 2 of 3 "
            f"participants, without ['p0'] (p0 refused the federation's plan: BAD_INPUT: "
            f"{LABELS})"
        )
        assert warning in harness.federation.warnings
        events = [m for (m,) in harness.store.query("SELECT message FROM events ORDER BY id")]
        assert warning in events
    finally:
        harness.close()


def test_the_federation_fails_at_once_when_the_rest_cannot_make_the_minimum(
    tmp_path: Path,
) -> None:
    harness = _long_window(tmp_path, secure=True).start()  # secure: needs 2 of 3
    board = harness.federation.board
    try:
        harness.join("p0")
        _refuse_plan(harness, "p0")
        harness.join("p1")
        _refuse_plan(
            harness, "p1", kind=pb.POLICY_REFUSAL, rule=pb.RULE_EXAMPLE_COUNT_NOISE, reason=NOISE
        )
        _until(lambda: board.done is not None, "the federation ended")
        reason = (
            "at most 1 of 3 participants can join (need 2): p0 refused the federation's "
            f"plan: BAD_INPUT: {LABELS}; p1 refused the federation's plan: "
            f"POLICY_REFUSAL/RULE_EXAMPLE_COUNT_NOISE: {NOISE}"
        )
        assert board.done == ("failed", reason)
        assert harness.federation.errors == [reason]
        # p2, which never came, is told it is over when it does
        with pytest.raises(ServiceError) as ended:
            harness.join("p2")
        assert ended.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "failed" in ended.value.message
    finally:
        harness.close()


def test_a_site_that_refused_and_joins_again_is_let_back_in(tmp_path: Path) -> None:
    """Its operator fixed its data or settings and started it again: it accepts the
    plan this time, so the window counts it as any site that joined, and it trains."""
    harness = _long_window(tmp_path, secure=False).start()
    try:
        harness.join("p0")
        _refuse_plan(harness, "p0")
        harness.join("p1")
        harness.join("p0")  # back, accepting the plan
        assert harness.federation.phase == WAITING  # p2 may still come
        harness.join("p2")
        harness.poll("p0", {"train"})  # p0 takes part in round 1
        assert not [w for w in harness.federation.warnings if "continuing with" in w]
        assert _roster(harness)["p0"].left == ""
    finally:
        harness.close()


def test_a_restarted_coordinator_does_not_wait_for_a_site_that_refused(tmp_path: Path) -> None:
    """Who refused is kept with the member's row: the coordinator restarted during its
    join window closes it as soon as every other site joined, as the first would have
    (until 2026-11-27 it was held in memory, and the restarted one waited join_s)."""
    first = _long_window(tmp_path, secure=False)
    first.join("p0")
    _refuse_plan(first, "p0")
    first.store.close()  # the coordinator goes down before its window closed
    harness = _long_window(tmp_path, secure=False)
    assert _roster(harness)["p0"].left == f"refused the federation's plan: BAD_INPUT: {LABELS}"
    harness.start()
    try:
        harness.join("p1")
        assert harness.federation.phase == WAITING  # p2 may still come
        harness.join("p2")
        assert harness.poll("p1", {"train"}).train.round == 0  # not after 600 s
        assert any(
            "without ['p0'] (p0 refused the federation's plan" in w
            for w in harness.federation.warnings
        )
    finally:
        harness.close()


def test_a_site_that_joins_again_is_no_longer_recorded_as_left(tmp_path: Path) -> None:
    first = _long_window(tmp_path, secure=False)
    first.join("p0")
    _refuse_plan(first, "p0")
    first.join("p0")  # back, accepting the plan
    first.store.close()
    harness = _long_window(tmp_path, secure=False)
    try:
        assert _roster(harness)["p0"].left == ""
        (row,) = harness.store.query(
            "SELECT left_reason FROM participants WHERE participant_id = 'p0'"
        )
        assert row == (None,)
    finally:
        harness.store.close()
