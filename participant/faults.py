"""Fault injection: make a participant stop dead at a named point of the protocol.

``spherecal simulate --drop p3:share`` must kill participant ``p3`` *at* the share
stage — not a little before or after, which a harness watching from outside could not
guarantee. So the participant cooperates: given ``halt_before = share``, it prints one
line ``SPHERECAL-HALT <stage> <what>`` on stdout right before it would send its
``share`` message, then blocks forever; the harness reads the line and SIGKILLs it.
The kill is still a real SIGKILL of a real process (sockets reset, nothing flushed).

Stages (what the participant has *not* done when it halts):

``train``      the local training of a round (it received the Train instruction)
``advertise``  sending its key advertisement (before its local work; its job keys
               are held on disk already, so a restart advertises the same ones)
``share``      sending its encrypted Shamir shares (it has the key roster; before its
               local work, unless its ``[policy] share_wait_s`` ran out)
``masked``     finishing its masked upload: it halts after the first chunk, with the
               stream open, so the coordinator sees a broken upload (one-chunk
               inputs halt before any chunk); its release is charged and its masked
               input stored, so a restart sends the same bytes again (``held_jobs``)
``stored``     charging its release: its masked input and the record naming it are
               stored, nothing is charged or sent (issue #20's crash window, test-only)
``charged``    sending the first byte of its masked input: stored and charged
               (test-only, as ``stored``)
``consistency`` signing the survivor set (its masked input is in the sum)
``unmask``     answering the unmask request (its masked input is in the sum)

``@WHEN`` narrows where: ``rN`` (round N, 1-based), ``update`` (any round's secure
update), ``ffc`` or ``ccvr`` (that statistics job), ``evaluate`` (an evaluation's:
a validation split's or the final one, whichever comes first). Without it, the first
occurrence.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HALT_MARKER", "HALT_STAGES", "HaltPoint", "Halter", "OnHalt", "parse_halt"]

HALT_STAGES = (
    "train",
    "advertise",
    "share",
    "stored",
    "charged",
    "masked",
    "consistency",
    "unmask",
)
HALT_MARKER = "SPHERECAL-HALT"
JOB_PURPOSES = ("update", "ffc", "ccvr", "evaluate")
"""The ``@WHEN`` that name a kind of secure job (its purpose)."""


@dataclass(frozen=True)
class HaltPoint:
    stage: str
    when: str | None = None

    def __post_init__(self) -> None:
        if self.stage not in HALT_STAGES:
            raise ValueError(f"unknown halt stage {self.stage!r}; use one of {HALT_STAGES}")
        w = self.when
        is_round = w is not None and w.startswith("r") and w[1:].isdigit() and int(w[1:]) >= 1
        if w is not None and w not in JOB_PURPOSES and not is_round:
            raise ValueError(f"'@{w}' must be rN (1-based round), update, ffc, ccvr or evaluate")
        if self.stage == "train" and w in ("ffc", "ccvr", "evaluate"):
            raise ValueError("statistics and evaluation jobs have no train stage")

    def matches(self, stage: str, *, purpose: str, round_index: int | None) -> bool:
        if stage != self.stage:
            return False
        if self.when is None:
            return True
        if self.when in JOB_PURPOSES:
            return purpose == self.when
        return round_index is not None and round_index + 1 == int(self.when[1:])

    def __str__(self) -> str:
        return self.stage + (f"@{self.when}" if self.when else "")


def parse_halt(text: str) -> HaltPoint:
    stage, _, when = text.partition("@")
    return HaltPoint(stage.strip(), when.strip() or None)


OnHalt = Callable[[str, str, str], None]
"""``on_halt(stage, purpose, what)``: kill the participant now; must not return."""


def _announce_and_wait(stage: str, purpose: str, what: str) -> None:
    """The process engine's halt: announce on stdout, block until the SIGKILL."""
    print(f"{HALT_MARKER} {stage} {purpose} {what}", file=sys.stdout, flush=True)
    threading.Event().wait()  # until SIGKILL


class Halter:
    """Checks halt points; each point fires once.

    ``on_halt`` is what halting means: by default the process announces the point
    on stdout and blocks until the harness SIGKILLs it; a virtual participant
    hosted with many others in one process (``spherecal.engines``) passes a
    callback that cuts its own connection and raises instead — the process-wide
    stdout and SIGKILL would take every neighbour down with it.
    """

    def __init__(self, points: tuple[HaltPoint, ...], on_halt: OnHalt | None = None) -> None:
        self._points = list(points)
        self._on_halt = on_halt or _announce_and_wait

    def check(self, stage: str, *, purpose: str, round_index: int | None, what: str) -> None:
        for point in self._points:
            if point.matches(stage, purpose=purpose, round_index=round_index):
                if stage == "masked":
                    time.sleep(1.0)  # let the first chunk leave: the upload is cut mid-stream
                self._on_halt(stage, purpose, what)
                raise AssertionError("on_halt returned: a halted participant must not go on")
