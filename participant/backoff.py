"""Stopping and waiting: the participant's exit reasons and its reconnect back-off.

When the coordinator is unreachable the participant says so once, then retries with a
jittered exponential back-off (0.2 s doubling up to ``reconnect_max_s``), logging
every attempt with its delay and the reason, and exits with status 3 after
``give_up_s`` of continuous failure.

A coordinator that says it is *stopping* (``Done(status="stopping")``: SIGTERM or a
storage fault, the federation not over) is waited for the same way — its restart
resumes the federation — with the ``give_up_s`` clock started at once, so a
coordinator that never comes back still ends the participant (exit 3), while one
that does is simply rejoined (issue #20).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import grpc

from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.federation_end import STOPPING_STATUS, SUCCESSFUL_STATUSES, ended_status

__all__ = ["Backoff", "ParticipantExit", "stop_if_ended", "wait_if_stopping"]


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
        self.attempts = 0

    def reset(self) -> None:
        self._delay = 0.2
        self._failing_since = None

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    def wait(
        self,
        what: str,
        log: Callable[[str], None] | None = None,
        *,
        address: str = "",
        hint: str = "",
    ) -> None:
        """Sleep the next back-off (jittered, doubling up to ``maximum``); with ``log``,
        say which attempt comes next, after how long and why — and, on the first
        failure with ``address``, that the coordinator there cannot be reached (and
        ``hint``, what to fix, when the failure says more than that)."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            self.attempts = 0
            if log is not None and address:
                fix = f" — {hint}" if hint else ""
                log(
                    f"cannot reach the coordinator at {address} ({what}){fix}; retrying "
                    "with back-off"
                )
        elif now - self._failing_since > self.give_up:
            raise ParticipantExit(3, f"giving up: {what} for {now - self._failing_since:.0f}s")
        delay = self._delay * (0.5 + random.random())
        self.attempts += 1
        if log is not None:
            log(
                f"reconnect attempt {self.attempts} in {delay:.1f}s ({what}; giving up after "
                f"{self.give_up:.0f}s without success)"
            )
        time.sleep(delay)
        self._delay = min(self.maximum, self._delay * 2)


def stop_if_ended(code: grpc.StatusCode, message: str) -> None:
    """The coordinator says the federation is over: stop now (exit 0 if it completed,
    1 otherwise) instead of retrying until ``give_up_s``."""
    if code is not grpc.StatusCode.FAILED_PRECONDITION:
        return
    status = ended_status(message)
    if status is not None:
        raise ParticipantExit(
            0 if status in SUCCESSFUL_STATUSES else 1,
            f"coordinator says the {message}; nothing left to do, stopping",
        )


def wait_if_stopping(done: pb.Done, backoff: Backoff, log: Callable[[str], None]) -> bool:
    """If ``done`` says the coordinator is stopping (not that the federation ended):
    say so, start the back-off's ``give_up_s`` clock, sleep its first delay and
    return True — the caller forgets its session and joins again. False otherwise."""
    if done.status != STOPPING_STATUS:
        return False
    if not backoff.failing:
        log(
            f"coordinator is stopping ({done.message}); waiting for it to come back "
            f"(giving up after {backoff.give_up:.0f}s)"
        )
    backoff.wait("coordinator stopping", log)
    return True
