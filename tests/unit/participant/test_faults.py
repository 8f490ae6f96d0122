from __future__ import annotations

import pytest

from spherecal.participant.faults import HaltPoint, parse_halt


def test_parse_and_match() -> None:
    point = parse_halt("share@ffc")
    assert point == HaltPoint("share", "ffc")
    assert point.matches("share", purpose="ffc", round_index=None)
    assert not point.matches("share", purpose="ccvr", round_index=None)
    assert not point.matches("masked", purpose="ffc", round_index=None)
    r2 = parse_halt("train@r2")
    assert r2.matches("train", purpose="update", round_index=1)
    assert not r2.matches("train", purpose="update", round_index=0)
    assert parse_halt("unmask").matches("unmask", purpose="update", round_index=4)
    assert str(r2) == "train@r2"
    evaluation = parse_halt("advertise@evaluate")
    assert evaluation.matches("advertise", purpose="evaluate", round_index=None)
    assert not evaluation.matches("advertise", purpose="ffc", round_index=None)


@pytest.mark.parametrize(
    "text", ["sleep", "share@r0", "share@later", "train@ffc", "train@evaluate"]
)
def test_invalid_points_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_halt(text)


def test_on_halt_replaces_the_process_halt_and_fires_once() -> None:
    from spherecal.participant.faults import Halter

    calls: list[tuple[str, str, str]] = []

    class Killed(Exception):
        pass

    def on_halt(stage: str, purpose: str, what: str) -> None:
        calls.append((stage, purpose, what))
        raise Killed

    halter = Halter((parse_halt("share@ffc"),), on_halt)
    halter.check("share", purpose="update", round_index=0, what="job-a")  # not this one
    assert calls == []
    with pytest.raises(Killed):
        halter.check("share", purpose="ffc", round_index=None, what="job-b")
    assert calls == [("share", "ffc", "job-b")]


def test_an_on_halt_that_returns_does_not_let_the_participant_go_on() -> None:
    from spherecal.participant.faults import Halter

    halter = Halter((parse_halt("advertise"),), lambda *_: None)
    with pytest.raises(AssertionError, match="must not go on"):
        halter.check("advertise", purpose="update", round_index=0, what="job")
