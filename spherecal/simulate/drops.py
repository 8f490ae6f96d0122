"""The ``--drop`` grammar: which participant process the harness kills, and where.

Grammar::

    SPEC  := ITEM ("," ITEM)*
    ITEM  := PARTICIPANT ":" STAGE ["@" WHEN]
    STAGE := train | advertise | share | stored | charged | masked | consistency | unmask
    WHEN  := rN (round N, 1-based) | update | ffc | ccvr | evaluate

e.g. ``p3:share`` (p3 dies right before sending its shares, in the first job that
gets there), ``p5:train@r2`` (dies during round 2's training), ``p4:masked@ccvr``
(dies half-way through its masked CCVR upload). See ``spherecal.participant.faults`` for what
each stage means. The participant announces the point on stdout and waits; the
harness (:mod:`spherecal.simulate.processes`) kills it with SIGKILL, so the kill lands
exactly there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spherecal.participant.faults import HaltPoint, parse_halt

__all__ = ["Drop", "parse_drops"]


@dataclass(frozen=True)
class Drop:
    participant: str
    point: HaltPoint

    def __str__(self) -> str:
        return f"{self.participant}:{self.point}"


def parse_drops(spec: str | None, participants: Sequence[str]) -> tuple[Drop, ...]:
    """Parse ``--drop`` (grammar in the module docstring)."""
    if not spec:
        return ()
    out: list[Drop] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        pid, sep, rest = item.partition(":")
        if not sep or not rest:
            raise ValueError(f"--drop item {item!r} must be PARTICIPANT:STAGE[@WHEN]")
        if pid not in participants:
            raise ValueError(f"--drop names {pid!r}, which is not one of {list(participants)}")
        out.append(Drop(pid, parse_halt(rest)))
    seen = [d.participant for d in out]
    if len(set(seen)) != len(seen):
        raise ValueError("--drop names a participant twice (a process dies only once)")
    return tuple(out)
