from __future__ import annotations

import pytest

from participant.faults import HaltPoint, parse_halt


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


@pytest.mark.parametrize("text", ["sleep", "share@r0", "share@later", "train@ffc"])
def test_invalid_points_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_halt(text)
