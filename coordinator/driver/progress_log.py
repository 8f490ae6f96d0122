"""How loud each progress line is, and the one line a training round earns.

Why: a 40-round federation wrote 383 INFO lines, 210 of them a secure-aggregation
stage closing (issue #23). An operator wants one line per round that says how far the
run is and when it will end; the per-stage bookkeeping is for debugging a stuck job.
The driver's modules report through a plain ``say`` callable, and the secure-job
module's lines are bookkeeping an operator does not need at INFO, so this module
*classifies* lines instead of each caller choosing: :func:`leveled` marks routine
bookkeeping with the ``DEBUG:`` prefix that ``spherecal.logs`` maps to the DEBUG
level (shown only with ``[server] log_level = "debug"`` or ``--log-level debug``).

What stays at INFO: anything that names a problem — a stage closing with a dropout,
an aggregation with dropouts or exclusions, a round trained without a participant
that is not connected — and every line this module does not recognise. So a quiet
run prints one INFO line per round (:func:`round_line`, with the ETA) plus the
federation's start, joins, calibration and end.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from spherecal.coordinator.driver.stages import Say
from spherecal.coordinator.summary_schema import RoundMetrics

__all__ = ["DEBUG_PREFIX", "eta_text", "is_routine", "leveled", "round_line"]

DEBUG_PREFIX = "DEBUG: "

_ROUTINE = (
    # a secure-aggregation stage closing with everyone's message (no "; dropped")
    re.compile(r"^[\w ]+ job [0-9a-f]{8}: stage \w+ closed, (\d+)/\1 sent$"),
    # a secure job created: its parameters
    re.compile(r"^[\w ]+ job [0-9a-f]{8}: \d+ participants, threshold \d+, "),
    # a job aggregated with no dropout and no exclusion
    re.compile(r"^[\w ]+ job [0-9a-f]{8}: aggregated \d+ inputs \(dropouts \[\], excluded \[\]\)$"),
    # a round starting on every selected participant (its end gets the INFO line)
    re.compile(r"^round \d+/\d+: training on \d+ participants$"),
)


def is_routine(message: str) -> bool:
    """Whether ``message`` is bookkeeping of a healthy run (logged at DEBUG)."""
    return any(pattern.match(message) for pattern in _ROUTINE)


def leveled(say: Say) -> Say:
    """``say`` that marks routine bookkeeping lines ``DEBUG:`` (the writer decides
    whether DEBUG lines are shown)."""

    def write(message: str) -> None:
        say(DEBUG_PREFIX + message if is_routine(message) else message)

    return write


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def eta_text(seconds_per_round: Sequence[float], done: int, total: int) -> str:
    """``3/40 rounds, 1.2 s/round, ETA 44s``: the mean time of the completed rounds
    (those before a restart included, as recorded) times the rounds left; training
    only (calibration and evaluation follow)."""
    left = max(0, total - done)
    timed = [s for s in seconds_per_round if s >= 0]
    if not timed:
        return f"{done}/{total} rounds"
    mean = sum(timed) / len(timed)
    eta = "training done" if left == 0 else f"ETA {_duration(mean * left)}"
    return f"{done}/{total} rounds, {mean:.1f} s/round, {eta}"


def round_line(metrics: RoundMetrics, history: Sequence[RoundMetrics], total: int) -> str:
    """The one INFO line of a finished round: contributors, loss, accuracy, dropouts,
    and the progress with its ETA (``history`` includes this round)."""
    contributors = metrics.get("contributors") or ()
    acc = metrics.get("test_accuracy")
    fed = metrics.get("federated_accuracy")
    dropped = metrics.get("dropped") or {}
    seconds = [float(m.get("seconds") or 0.0) for m in history]
    return (
        f"round {metrics['round']}/{total}: {len(contributors)} updates, loss "
        f"{float(metrics.get('train_loss') or 0.0):.4f}"
        + (f", test acc {acc:.4f}" if acc is not None else "")
        + (f", federated acc {fed:.4f}" if fed is not None else "")
        + (f", dropped {dropped}" if dropped else "")
        + f" ({float(metrics.get('seconds') or 0.0):.1f}s) · "
        + eta_text(seconds, int(metrics["round"]), total)
    )
