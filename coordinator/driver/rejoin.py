"""Between two attempts at a stage: back off, then wait for the federation to come back.

Why: a round or a statistics job fails when too many of its participants vanish —
typically because their processes were restarted, which takes seconds (import torch,
load the data, join again). Retrying at once only fails again, and
``max_round_attempts`` back-to-back attempts burn through in about a second, failing
a federation that a short outage should not have failed (issue #10). So before every
retry the driver

1. backs off ``retry_backoff_s · 2^(attempt−2)`` seconds (capped at
   :data:`MAX_BACKOFF_S`), half of it fixed and half random, so restarted participants
   are not met by a burst of attempts;
2. waits up to ``rejoin_grace_s`` for the participants the stage wants to be alive
   again, and goes on *as soon as* every one of them is back — or, at the end of the
   grace, with whoever is there (the attempt itself then decides whether that is
   enough).

A participant that reconnects while a stage is running is not pulled into it (its
task and secure job were fixed when the stage started): it rejoins at the next stage
boundary, which is exactly what the next attempt is.

Every wait is logged (say + store event) and recorded in :class:`RetryRecord`s, which
the summary reports under ``retries``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from typing import Any

from spherecal.coordinator.driver.stages import StageContext

__all__ = ["MAX_BACKOFF_S", "RetryRecord", "backoff_delay", "wait_before_retry"]

#: The longest back-off before one retry, whatever the attempt number.
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class RetryRecord:
    """One wait between two attempts: what failed, how long we waited, who came back."""

    stage: str
    next_attempt: int
    reason: str
    backoff_s: float
    waited_s: float
    present: list[str]
    missing: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def backoff_delay(attempt: int, base_s: float, rng: random.Random | None = None) -> float:
    """The back-off before attempt ``attempt`` (2, 3, …): ``base · 2^(attempt−2)``
    capped at :data:`MAX_BACKOFF_S`, then jittered to ``[d/2, d]``."""
    if attempt < 2 or base_s <= 0:
        return 0.0
    full = min(MAX_BACKOFF_S, base_s * 2.0 ** (attempt - 2))
    draw = (rng or random).random()
    return full / 2 + draw * full / 2


def wait_before_retry(
    ctx: StageContext,
    *,
    stage: str,
    next_attempt: int,
    reason: str,
    wanted: Collection[str],
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RetryRecord:
    """Back off, then wait up to ``rejoin_grace_s`` until all of ``wanted`` are alive.

    A member that *left* the federation — it refused the plan, or its certificate is
    revoked (``Registry.leave``) — is not waited for: it cannot come back as it was
    (until 2026-11-27 each retry of a round waited the whole grace for a revoked
    site). It is named as missing, and the line says why; should it join again (a
    new certificate, a plan accepted), it is alive and counted as any other.

    Returns (and records in ``ctx.progress.retries``) what happened; raises
    ``FederationFailed`` only if the federation is being stopped. ``clock`` measures
    the back-off and the grace (tests inject one, so what ends a wait is never a
    matter of timing).
    """
    t = ctx.settings.timeouts
    t0 = clock()
    delay = backoff_delay(next_attempt, t.retry_backoff_s, rng)
    _sleep(ctx, delay, clock)
    grace_end = clock() + t.rejoin_grace_s
    want = frozenset(wanted)
    while True:
        ctx.board.check_stop()
        _, left = ctx.registry.joined_and_left()
        missing = want - ctx.registry.alive() - left.keys()
        if not missing or clock() >= grace_end:
            break
        ctx.board.wait(0.2)
    _, left = ctx.registry.joined_and_left()
    alive = ctx.registry.alive()
    order = ctx.registry.index_of
    record = RetryRecord(
        stage=stage,
        next_attempt=next_attempt,
        reason=reason,
        backoff_s=round(delay, 3),
        waited_s=round(clock() - t0, 3),
        present=sorted(want & alive, key=order),
        missing=sorted(want - alive, key=order),
    )
    line = (
        f"{stage}: attempt {next_attempt} after {record.waited_s:.1f}s "
        f"(back-off {record.backoff_s:.1f}s, grace {t.rejoin_grace_s:.0f}s): "
        f"{len(record.present)}/{len(want)} wanted participants connected"
        + (f", still missing {record.missing}" if record.missing else "")
        + (
            f" (not waited for: {sorted(gone, key=order)}, which left the federation)"
            if (gone := (want - alive) & left.keys())
            else ""
        )
    )
    ctx.say(line)
    ctx.store.event("warning" if record.missing else "info", line)
    ctx.progress.retries.append(record.to_json())
    return record


def _sleep(ctx: StageContext, seconds: float, clock: Callable[[], float]) -> None:
    """Sleep ``seconds`` but wake for a stop request."""
    end = clock() + seconds
    while True:
        ctx.board.check_stop()
        left = end - clock()
        if left <= 0:
            return
        ctx.board.wait(min(left, 0.2))
