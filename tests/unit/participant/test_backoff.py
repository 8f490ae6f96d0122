"""The reconnect back-off never waits longer than ``reconnect_max_s``, jitter included.

Before, the 0.5–1.5× jitter was applied after the cap: with ``reconnect_max_s = 10`` a
site logged ``reconnect attempt 8 in 14.6s``. The delays are checked as computed (the
back-off's random source and clock are its arguments), never by timing a sleep.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from spherecal.config import load_participant_config
from spherecal.participant.backoff import Backoff
from spherecal.participant.settings import ParticipantSettings


class _Draws(random.Random):
    """A random source whose every draw is ``value`` (the jitter's extremes)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


HIGHEST = 1.0 - 2**-53  # the largest value random.random() returns


def _delays(backoff: Backoff, n: int) -> list[float]:
    return [backoff.next_delay() for _ in range(n)]


def test_the_largest_jitter_stays_at_or_below_the_maximum() -> None:
    delays = _delays(Backoff(10.0, 600.0, rng=_Draws(HIGHEST)), 12)
    assert max(delays) <= 10.0
    # 1.5 × the nominal 0.2 s doubling, until 1.5 × nominal would pass the maximum
    assert delays[:6] == pytest.approx([0.3, 0.6, 1.2, 2.4, 4.8, 9.6])
    assert delays[6:] == pytest.approx([10.0] * 6)
    assert delays[7] < 14.0  # attempt 8 of the walkthrough: 14.6 s before


def test_the_smallest_jitter_is_half_the_nominal_delay() -> None:
    delays = _delays(Backoff(10.0, 600.0, rng=_Draws(0.0)), 10)
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0])


def test_at_the_cap_the_delays_stay_jittered_below_it() -> None:
    backoff = Backoff(10.0, 600.0, rng=random.Random(7))
    _delays(backoff, 8)  # the nominal delay has reached the cap
    capped = _delays(backoff, 400)
    assert all(5.0 <= d <= 10.0 for d in capped)
    assert len(set(capped)) == len(capped)  # spread, so sites do not retry in step
    assert min(capped) < 5.5 and max(capped) > 9.5


def test_every_delay_is_within_its_band_for_any_maximum() -> None:
    rng = random.Random(3)
    for maximum in (0.05, 0.2, 0.25, 1.0, 2.0, 10.0, 37.5):
        backoff = Backoff(maximum, 600.0, rng=rng)
        nominal = min(0.2, maximum)
        for _ in range(30):
            delay = backoff.next_delay()
            assert nominal / 2 <= delay <= min(1.5 * nominal, maximum) <= maximum
            nominal = min(maximum, 2 * nominal)


def test_the_logged_delay_is_the_one_slept_and_never_above_the_maximum() -> None:
    slept: list[float] = []
    lines: list[str] = []
    backoff = Backoff(10.0, 600.0, rng=_Draws(HIGHEST), sleep=slept.append)
    for _ in range(12):
        backoff.wait("UNAVAILABLE: failed to connect", lines.append, address="coord:50051")
    assert lines[0].startswith("cannot reach the coordinator at coord:50051")
    attempts = [re.fullmatch(r"reconnect attempt (\d+) in ([\d.]+)s \(.*\)", x) for x in lines[1:]]
    assert all(m is not None for m in attempts)
    numbers = [int(m.group(1)) for m in attempts if m is not None]
    logged = [float(m.group(2)) for m in attempts if m is not None]
    assert numbers == list(range(1, 13))
    assert logged == [round(s, 1) for s in slept]
    assert max(slept) <= 10.0 and max(logged) <= 10.0


def test_reset_starts_the_delays_over() -> None:
    backoff = Backoff(10.0, 600.0, rng=_Draws(HIGHEST), sleep=lambda _s: None)
    for _ in range(5):
        backoff.wait("UNAVAILABLE")
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.3)


def test_a_maximum_that_is_not_positive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        Backoff(0.0, 600.0)
    with pytest.raises(ValueError, match="reconnect_max_s must be positive"):
        ParticipantSettings(participant_id="p0", reconnect_max_s=0.0)
    config = tmp_path / "p0.toml"
    config.write_text('[participant]\nid = "p0"\ninsecure = true\nreconnect_max_s = -1\n')
    with pytest.raises(ValueError, match="reconnect_max_s must be positive"):
        load_participant_config(config)
