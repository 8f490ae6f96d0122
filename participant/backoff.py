"""Stopping and waiting: the participant's exit reasons and its reconnect back-off.

When the coordinator is unreachable the participant says so once, then retries with a
jittered exponential back-off that never waits longer than ``reconnect_max_s``
(:class:`Backoff`), logging every attempt with its delay and the reason, and exits
with status 3 after ``give_up_s`` of continuous failure.

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
    """Stop the participant with an exit code and a reason (logged as it stops)."""

    def __init__(self, code: int, message: str, *, ending: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.ending = ending
        """How the process ended, for its closing line (``exiting: ENDING (exit status
        N)``), where the status's usual words would mislead: status 2 is the coordinator
        refusing this site as well as this site refusing the federation's plan. ``""``:
        the usual words (``spherecal.cli.participant.PARTICIPANT_EXITS``)."""


class Backoff:
    """Exponential back-off with jitter, never longer than ``maximum``; gives up (exit 3)
    after ``give_up`` s of failure.

    The k-th delay (k = 0, 1, …) is drawn uniformly from ``[d/2, min(3d/2, maximum)]``
    with the nominal ``d = min(0.2 s · 2^k, maximum)``: about ``d`` while it doubles,
    and at the cap spread over ``[maximum/2, maximum]``. Why the jitter stays under the
    cap rather than on top of it: ``reconnect_max_s`` is what an operator sets to bound
    how late a site notices its coordinator is back; until 2026-11-27 the jitter was
    applied after the cap, and a site with ``reconnect_max_s = 10`` waited up to 15 s
    (``reconnect attempt 8 in 14.6s``). Jitter there is still needed: sites that lost
    the coordinator together must not come back in step. ``rng`` and ``sleep`` are the
    randomness and the clock (tests pass their own, to see every delay without
    waiting for it)."""

    BASE_S = 0.2
    """The first nominal delay (seconds)."""

    def __init__(
        self,
        maximum: float,
        give_up: float,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not maximum > 0:
            raise ValueError(f"the longest back-off must be positive, got {maximum!r}")
        self.maximum = maximum
        self.give_up = give_up
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep
        self._delay = min(self.BASE_S, maximum)
        self._failing_since: float | None = None
        self.attempts = 0

    def reset(self) -> None:
        self._delay = min(self.BASE_S, self.maximum)
        self._failing_since = None

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    def next_delay(self) -> float:
        """The next delay (class docstring), advancing the nominal one: never above
        ``maximum``."""
        nominal = self._delay
        low, high = nominal / 2, min(nominal * 1.5, self.maximum)
        self._delay = min(self.maximum, nominal * 2)
        return low + (high - low) * self._rng.random()

    def wait(
        self,
        what: str,
        log: Callable[[str], None] | None = None,
        *,
        address: str = "",
        hint: str = "",
    ) -> None:
        """Sleep the next back-off (:meth:`next_delay`); with ``log``, say which attempt
        comes next, after how long and why — and, on the first failure with
        ``address``, that the coordinator there cannot be reached (and ``hint``, what
        to fix, when the failure says more than that)."""
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
        delay = self.next_delay()
        self.attempts += 1
        if log is not None:
            log(
                f"reconnect attempt {self.attempts} in {delay:.1f}s ({what}; giving up after "
                f"{self.give_up:.0f}s without success)"
            )
        self._sleep(delay)


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
