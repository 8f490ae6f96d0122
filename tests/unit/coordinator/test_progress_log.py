"""A quiet coordinator log (issue #23): routine secure-aggregation bookkeeping at DEBUG,
problems and the one line per round (with its ETA) at INFO."""

from __future__ import annotations

import io
from typing import cast

import pytest

from spherecal.coordinator.driver.progress_log import (
    DEBUG_PREFIX,
    eta_text,
    is_routine,
    leveled,
    round_line,
)
from spherecal.coordinator.summary_schema import RoundMetrics
from spherecal.logs import line_writer

# Lines exactly as a healthy 3-site run wrote them (docs: issue #23's 383-line log).
ROUTINE = (
    "update round 1 job 822669f7: 3 participants, threshold 2, complete graph, "
    "158562 entries, 64-bit ring, scale 2^-33",
    "round 1/3: training on 3 participants",
    "update round 1 job 822669f7: stage advertise closed, 3/3 sent",
    "update round 12 job 822669f7: stage masked closed, 10/10 sent",
    "ccvr job a835f27a: stage unmask closed, 3/3 sent",
    "evaluate job 07e4bc6e: aggregated 3 inputs (dropouts [], excluded [])",
)
PROBLEMS = (
    # a stage that lost someone, and the job that recovered from it, stay visible
    "update round 2 job 822669f7: stage masked closed, 2/3 sent; dropped p1 "
    "(masked: disconnected / heartbeat timeout)",
    "update round 2 job 822669f7: stage share closed, 2/3 sent",
    "update round 2 job 822669f7: aggregated 2 inputs (dropouts ['p1'], excluded [])",
    "round 3/5: training on 2 participants (not connected: ['p2'])",
    "round 1/3: 3 updates, loss 0.5939 (6.2s) · 1/3 rounds, 6.2 s/round, ETA 12s",
    "WARNING: join window of 300s expired",
    "p0 joined",
)


@pytest.mark.parametrize("line", ROUTINE)
def test_routine_bookkeeping_is_debug(line: str) -> None:
    assert is_routine(line)


@pytest.mark.parametrize("line", PROBLEMS)
def test_problems_and_round_lines_stay_info(line: str) -> None:
    assert not is_routine(line)


def test_leveled_marks_only_routine_lines() -> None:
    said: list[str] = []
    say = leveled(said.append)
    for line in (*ROUTINE, *PROBLEMS):
        say(line)
    assert said[: len(ROUTINE)] == [DEBUG_PREFIX + line for line in ROUTINE]
    assert said[len(ROUTINE) :] == list(PROBLEMS)


def test_writer_hides_debug_unless_asked() -> None:
    quiet, loud = io.StringIO(), io.StringIO()
    for debug, stream in ((False, quiet), (True, loud)):
        say = leveled(line_writer("coordinator", "text", stream, debug=debug))
        say(ROUTINE[2])
        say(PROBLEMS[0])
    assert quiet.getvalue().count("\n") == 1 and " INFO coordinator: " in quiet.getvalue()
    lines = loud.getvalue().splitlines()
    assert len(lines) == 2
    assert " DEBUG coordinator: update round 1 job 822669f7: stage advertise" in lines[0]
    assert DEBUG_PREFIX not in lines[0]  # the mark chooses the level, it is not printed


def test_eta_is_mean_round_time_times_rounds_left() -> None:
    assert eta_text([2.0, 4.0], 2, 10) == "2/10 rounds, 3.0 s/round, ETA 24s"
    assert eta_text([60.0] * 3, 3, 40) == "3/40 rounds, 60.0 s/round, ETA 37m"
    assert eta_text([3600.0], 1, 4) == "1/4 rounds, 3600.0 s/round, ETA 3.0h"
    assert eta_text([1.0, 1.0], 2, 2) == "2/2 rounds, 1.0 s/round, training done"
    assert eta_text([], 0, 5) == "0/5 rounds"


def test_round_line_carries_progress_and_eta() -> None:
    history = cast(
        list[RoundMetrics],
        [
            {"round": 1, "seconds": 5.0},
            {
                "round": 2,
                "contributors": ["p0", "p1", "p2"],
                "train_loss": 0.25,
                "test_accuracy": 0.75,
                "federated_accuracy": 0.5,
                "dropped": {},
                "seconds": 3.0,
            },
        ],
    )
    line = round_line(history[-1], history, 5)
    assert line == (
        "round 2/5: 3 updates, loss 0.2500, test acc 0.7500, federated acc 0.5000 (3.0s)"
        " · 2/5 rounds, 4.0 s/round, ETA 12s"
    )
    assert not is_routine(line)
