"""Reconnection back-off and the participant's exit-with-status exception."""

from __future__ import annotations

import random
import time

__all__ = ["Backoff", "ParticipantExit"]


class ParticipantExit(Exception):
    """Stop the participant with an exit code and a reason."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Backoff:
    """Exponential back-off with jitter; gives up after ``give_up`` seconds of failure."""

    def __init__(self, maximum: float, give_up: float) -> None:
        self.maximum = maximum
        self.give_up = give_up
        self._delay = 0.2
        self._failing_since: float | None = None

    def reset(self) -> None:
        self._delay = 0.2
        self._failing_since = None

    def wait(self, what: str) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since > self.give_up:
            raise ParticipantExit(3, f"giving up: {what} for {now - self._failing_since:.0f}s")
        time.sleep(self._delay * (0.5 + random.random()))
        self._delay = min(self.maximum, self._delay * 2)
