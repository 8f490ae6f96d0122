"""Test-only fault hook: stop the coordinator dead at a named point of a secure job.

Why: issue #20's chaos tests must kill the coordinator *at* each stage of each job
kind — after the first advertisement, in the middle of the masked uploads, right
after the aggregate exists — which a harness watching log lines from outside cannot
time. As with the participants' ``--drop`` (:mod:`spherecal.participant.faults`), the
process cooperates: with ``SPHERECAL_TEST_FAULTS=1`` and
``SPHERECAL_COORDINATOR_HALT=POINT@WHEN`` it prints one line
``SPHERECAL-HALT POINT WHAT`` on stderr when a job first reaches ``POINT`` and blocks
that thread for good; the harness reads the line and sends a real SIGKILL.

Points, in protocol order: ``advertise``, ``share``, ``consistency``, ``unmask`` (the
first such message accepted and journaled), ``masked`` (the first complete masked
upload), ``advertise-closed``, ``share-closed``, ``masked-closed``,
``consistency-closed`` (the stage closed and journaled), ``aggregated`` (the result
journaled, before the driver uses it), ``recorded`` (a distributed DP-SGD step
charged in the coordinator's ledger, not yet checkpointed), ``added`` (a round's later
job added to its short sum kept, before the server step). ``WHEN`` is a job purpose (``update``,
``ffc``, ``ccvr``, ``evaluate``) or ``rN`` (round N's update, 1-based).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

from spherecal.coordinator.driver.secure_job import Halt, SecureJob

__all__ = [
    "DRIVER_HALT_POINTS",
    "HALT_ENV",
    "HALT_MARKER",
    "HALT_POINTS",
    "CoordinatorHalt",
    "halt_from_env",
]

HALT_ENV = "SPHERECAL_COORDINATOR_HALT"
HALT_MARKER = "SPHERECAL-HALT"
TEST_FAULTS_ENV = "SPHERECAL_TEST_FAULTS"
HALT_POINTS = (
    "advertise",
    "advertise-closed",
    "share",
    "share-closed",
    "masked",
    "masked-closed",
    "consistency",
    "consistency-closed",
    "unmask",
    "aggregated",
)
"""The points inside a secure job (:class:`SecureJob` calls the halt at each)."""
DRIVER_HALT_POINTS = ("recorded", "added")
"""The points in the driver, after a job: ``recorded`` and ``added`` (a round's sum
added from a later job to a short one kept, before the server step uses it;
``training_rounds``)."""


@dataclass(frozen=True)
class CoordinatorHalt:
    point: str
    when: str

    @classmethod
    def parse(cls, text: str) -> CoordinatorHalt:
        point, _, when = text.partition("@")
        if point not in HALT_POINTS + DRIVER_HALT_POINTS:
            raise ValueError(
                f"unknown halt point {point!r}; use one of {HALT_POINTS + DRIVER_HALT_POINTS}"
            )
        if not when:
            raise ValueError(f"{text!r}: say where, e.g. {point}@update, {point}@r2, {point}@ccvr")
        return cls(point, when)

    def matches(self, point: str, purpose: str, job: SecureJob) -> bool:
        if point != self.point:
            return False
        w = self.when
        if w.startswith("r") and w[1:].isdigit():
            return purpose == "update" and job.round is not None and job.round + 1 == int(w[1:])
        return purpose == w

    def __call__(self, point: str, purpose: str, job: SecureJob) -> None:
        if not self.matches(point, purpose, job):
            return
        sys.stderr.write(f"{HALT_MARKER} {point} {job.label()}\n")
        sys.stderr.flush()
        threading.Event().wait()  # until the harness's SIGKILL


def halt_from_env() -> Halt | None:
    """The configured halt, or None; refuses to arm without the test-faults switch."""
    text = os.environ.get(HALT_ENV)
    if not text:
        return None
    if os.environ.get(TEST_FAULTS_ENV) != "1":
        raise ValueError(f"{HALT_ENV} is a test-only fault and needs {TEST_FAULTS_ENV}=1")
    return CoordinatorHalt.parse(text)
