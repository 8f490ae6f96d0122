"""Stopping and waiting: the participant's exit reasons and its reconnect back-off."""

from __future__ import annotations

import random
import time

import grpc

from proto.federation_end import ended_status

__all__ = ["Backoff", "ParticipantExit", "stop_if_ended"]


class ParticipantExit(Exception):
    """Stop the participant with an exit code and a reason."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Backoff:
    """Exponential back-off with jitter; gives up (exit 3) after ``give_up`` s of failure."""

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


def stop_if_ended(code: grpc.StatusCode, message: str) -> None:
    """The coordinator says the federation is over: stop now (exit 0 if it completed,
    1 otherwise) instead of retrying until ``give_up_s``."""
    if code is not grpc.StatusCode.FAILED_PRECONDITION:
        return
    status = ended_status(message)
    if status is not None:
        raise ParticipantExit(
            0 if status == "completed" else 1,
            f"coordinator says the {message}; nothing left to do, stopping",
        )
