"""``spherecal status --watch`` ends on the federation's end (issue #23): the last screen
shows the final status, accuracies and true liveness; a coordinator gone between two
refreshes is read from its summary; the coordinator lingers for a watch it served."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from spherecal.coordinator.driver.board import Board
from spherecal.proto import spherecal_pb2 as pb
from spherecal.status import final_from_summary, render_status, render_summary_end


def _ended() -> pb.FederationStatus:
    return pb.FederationStatus(
        federation_id="f00d",
        name="hospitals",
        status="degraded",
        phase="degraded",
        rounds=40,
        completed_rounds=40,
        current_round=0,
        roster=[
            pb.RosterEntry(participant_id="a", joined=True, connected=False, told_done=True),
            pb.RosterEntry(participant_id="b", joined=True, connected=True, told_done=False),
            pb.RosterEntry(participant_id="c", joined=False, connected=False),
        ],
        accuracy=[
            pb.MethodAccuracy(method="none", accuracy=0.8714),
            pb.MethodAccuracy(method="ffc", accuracy=0.9102),
        ],
        status_reasons=["ccvr: no head shipped"],
    )


def test_final_screen_shows_status_accuracies_and_liveness() -> None:
    text = render_status(_ended())
    lines = text.splitlines()
    assert "round -" not in text
    assert lines[1] == "rounds completed 40 of 40"
    assert lines[2] == "final: degraded · accuracy: none 0.8714, ffc 0.9102"
    assert lines[3] == "  reason: ccvr: no head shipped"
    site = {line.split()[0]: line for line in lines if line.startswith("  ") and "joins" in line}
    assert "disconnected, told done" in site["a"]
    assert "connected" in site["b"] and "disconnected" not in site["b"]
    assert "absent" in site["c"]


def test_running_screen_names_the_round_in_progress() -> None:
    st = pb.FederationStatus(status="running", rounds=40, completed_rounds=2, current_round=3)
    text = render_status(st)
    assert "round 3 of 40 (completed 2)" in text and "final:" not in text


def test_final_from_summary_only_for_the_watched_federation_once_ended(tmp_path: Path) -> None:
    assert final_from_summary(None, "f00d") is None
    assert final_from_summary(tmp_path, "f00d") is None  # no summary yet
    path = tmp_path / "summary.json"
    summary = {
        "federation_id": "f00d",
        "status": "completed",
        "settings": {"name": "hospitals", "rounds": 2},
        "per_round": [{"round": 1}, {"round": 2}],
        "accuracy": {"none": 0.5, "ffc": 0.75, "ccvr": None},
    }
    path.write_text(json.dumps({**summary, "status": "running"}))
    assert final_from_summary(tmp_path, "f00d") is None  # the crash summary of a restart
    path.write_text(json.dumps({**summary, "federation_id": "other"}))
    assert final_from_summary(tmp_path, "f00d") is None  # an older federation's
    path.write_text("{not json")
    assert final_from_summary(tmp_path, "f00d") is None
    path.write_text(json.dumps(summary))
    found = final_from_summary(tmp_path, "f00d")
    assert found is not None
    text = render_summary_end(found)
    assert "final: completed · accuracy: none 0.5000, ffc 0.7500" in text
    assert "rounds completed 2 of 2" in text


def test_board_records_a_watch_and_its_final_view() -> None:
    board = Board()
    assert board.status_polled_at is None and not board.final_status_served
    woke = threading.Event()

    def waiter() -> None:
        with board.cond:
            board.cond.wait_for(lambda: board.final_status_served, timeout=30)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    board.status_served(final=False)
    assert board.status_polled_at is not None and not board.final_status_served
    board.status_served(final=True)
    thread.join(30)
    assert woke.is_set() and board.final_status_served
