"""A coordinator process that stops mid-federation (SIGTERM, a storage fault) tells
the participants ``stopping`` — the federation is not over — while an operator's
``stop`` still ends it as ``failed`` (issue #20)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from spherecal.coordinator.errors import ServiceError
from spherecal.coordinator.state.registry import Peer
from spherecal.participant.backoff import Backoff, ParticipantExit, wait_if_stopping
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.federation_end import STOPPING_STATUS

from .service_harness import Harness, settings_for


def _ended(harness: Harness) -> None:
    harness.thread.join(timeout=30)
    assert not harness.thread.is_alive()


def test_a_suspended_federation_tells_participants_stopping_and_refuses_joins_as_unavailable(
    tmp_path: Path,
) -> None:
    harness = Harness(settings_for(tmp_path, secure=False)).start()
    harness.join("p0")
    harness.federation.board.suspend("terminated by SIGTERM")
    _ended(harness)
    answer = harness.poll("p0", {"done"})
    assert answer.done.status == STOPPING_STATUS
    assert "terminated by SIGTERM" in answer.done.message and "resumes" in answer.done.message
    with pytest.raises(ServiceError) as info:
        harness.service.join(harness.join_request("p1"), Peer())
    assert info.value.code is grpc.StatusCode.UNAVAILABLE  # retryable: come back later
    summary = harness.federation.summary()
    # not "failed": the federation is not over (the old summary said failed)
    assert summary["status"] == "stopped"
    assert summary["status_reasons"] == ["stopped: terminated by SIGTERM"]
    # The database says "stopped" (its restart resumes it), not "failed".
    assert harness.store.get_meta("status") == "stopped"
    harness.store.close()


def test_an_operator_stop_still_ends_the_federation_as_failed(tmp_path: Path) -> None:
    """Mutation check of the above: ``stop`` (not ``suspend``) must not say stopping."""
    harness = Harness(settings_for(tmp_path, secure=False)).start()
    harness.join("p0")
    harness.federation.stop("operator")
    _ended(harness)
    assert harness.poll("p0", {"done"}).done.status == "failed"
    assert harness.store.get_meta("status") == "failed"
    harness.store.close()


def test_the_closing_line_of_a_stopped_federation_says_it_resumes(tmp_path: Path) -> None:
    """``spherecal coordinator`` ends with one line saying how. A SIGTERM'd (suspended)
    federation's summary says ``stopped``, ``stopped: …`` (it said ``failed``) — and its
    line said ``ERROR exiting: federation failed`` though the same command resumes it;
    an operator doing a routine restart read that as the federation's end. A stop that
    ends it (and a federation that failed) still says ``failed``."""
    from spherecal.cli.coordinator import ending

    harness = Harness(settings_for(tmp_path / "suspended", secure=False)).start()
    harness.join("p0")
    harness.federation.board.suspend("terminated by SIGTERM")
    _ended(harness)
    what, level = ending(harness.federation.summary())
    assert what.startswith("federation stopped, not ended (terminated by SIGTERM)"), what
    assert "resumes" in what and level == "WARNING"
    harness.store.close()
    # an operator's stop ends the federation: its reason starts "stopped: " too
    assert ending({"status": "failed", "status_reasons": ["stopped: operator"]}) == (
        "federation failed",
        None,
    )
    assert ending({"status": "failed", "status_reasons": ["round 2 failed 3 times"]}) == (
        "federation failed",
        None,
    )
    assert ending({"status": "degraded", "status_reasons": ["ffc: …"]}) == (
        "federation degraded",
        None,
    )


def test_a_suspend_after_the_end_changes_nothing(tmp_path: Path) -> None:
    harness = Harness(settings_for(tmp_path, secure=False)).start()
    harness.join("p0")
    harness.federation.stop("operator")
    _ended(harness)
    harness.federation.board.suspend("terminated by SIGTERM")  # during the linger
    assert harness.poll("p0", {"done"}).done.status == "failed"
    harness.store.close()


def test_a_participant_told_stopping_waits_then_gives_up_with_exit_3() -> None:
    lines: list[str] = []
    backoff = Backoff(maximum=0.01, give_up=0.0)
    stopping = pb.Done(status=STOPPING_STATUS, message="coordinator stopping (SIGTERM)")
    assert wait_if_stopping(stopping, backoff, lines.append)
    assert backoff.failing and "waiting for it to come back" in lines[0]
    # The give_up_s clock started at the stop: the next failure past it ends with 3.
    with pytest.raises(ParticipantExit) as stop:
        backoff.wait("UNAVAILABLE", lines.append)
    assert stop.value.code == 3


@pytest.mark.parametrize("status", ["completed", "degraded", "failed"])
def test_a_federation_that_ended_is_not_waited_for(status: str) -> None:
    backoff = Backoff(maximum=0.01, give_up=60.0)
    assert not wait_if_stopping(pb.Done(status=status), backoff, lambda _m: None)
    assert not backoff.failing
