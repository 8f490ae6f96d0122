"""Between attempts: the back-off's range and growth, and the wait for participants to
reconnect — it ends as soon as all wanted participants are back, at the end of the
grace otherwise, and on a stop request at once. Real Registry (real Ed25519 joins),
Store (SQLite) and Board; a thread plays the participant coming back."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from spherecal.coordinator.driver.evaluation_stage import federated_evaluation
from spherecal.coordinator.driver.rejoin import MAX_BACKOFF_S, backoff_delay, wait_before_retry
from spherecal.coordinator.driver.stages import StageContext
from spherecal.coordinator.errors import FederationFailed
from spherecal.coordinator.settings import CoordinatorSettings, Timeouts
from spherecal.coordinator.state.registry import Member, Peer, Registry
from tests.joins import signed_join
from tests.unit.coordinator.helpers import stage_context

ROSTER = ("p0", "p1", "p2", "p3")


class FakeClock:
    """An injected clock: each reading advances it by ``step`` seconds (0: frozen, so
    a grace period can never end and only a rejoin or a stop ends a wait)."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _join(registry: Registry, pid: str) -> Member:
    member = registry.join(signed_join(pid, data=None), Peer())
    registry.presence_opened(member)
    return member


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[StageContext]:
    settings = CoordinatorSettings(
        participants=ROSTER,
        state_dir=tmp_path,
        timeouts=Timeouts(rejoin_grace_s=2.0, retry_backoff_s=0.05),
    )
    lines: list[str] = []
    with stage_context(settings, tmp_path, lines.append) as ctx:
        yield ctx


def test_backoff_doubles_is_jittered_into_its_upper_half_and_is_capped() -> None:
    rng = random.Random(7)
    assert backoff_delay(1, 1.0, rng) == 0.0  # the first attempt does not wait
    assert backoff_delay(3, 0.0, rng) == 0.0  # 0 disables the back-off
    for attempt, full in ((2, 1.0), (3, 2.0), (4, 4.0), (12, MAX_BACKOFF_S)):
        draws = [backoff_delay(attempt, 1.0, rng) for _ in range(200)]
        assert min(draws) >= full / 2 and max(draws) <= full
        assert max(draws) - min(draws) > full / 4  # jitter, not a constant


def test_wait_ends_as_soon_as_every_wanted_participant_is_back(ctx: StageContext) -> None:
    ctx.settings = replace(
        ctx.settings, timeouts=Timeouts(rejoin_grace_s=60.0, retry_backoff_s=0.0)
    )
    for pid in ("p0", "p1"):
        _join(ctx.registry, pid)
    timer = threading.Timer(0.4, lambda: [_join(ctx.registry, p) for p in ("p2", "p3")])
    timer.start()
    frozen = FakeClock(step=0.0)  # the grace never ends: only the rejoin can end the wait
    record = wait_before_retry(
        ctx, stage="round 2", next_attempt=2, reason="too few", wanted=ROSTER, clock=frozen
    )
    timer.join()
    assert record.missing == [] and record.present == list(ROSTER)
    assert record.waited_s == 0.0  # by the frozen clock: no grace period elapsed
    assert ctx.progress.retries == [record.to_json()]
    events = ctx.store.query("SELECT message FROM events")
    assert any("round 2: attempt 2" in m for (m,) in events)


def test_wait_gives_up_at_the_end_of_the_grace_and_names_who_is_missing(
    ctx: StageContext,
) -> None:
    for pid in ("p0", "p1", "p3"):
        _join(ctx.registry, pid)
    record = wait_before_retry(
        ctx,
        stage="statistics ccvr",
        next_attempt=3,
        reason="x",
        wanted=ROSTER,
        clock=FakeClock(step=0.5),
    )
    assert record.waited_s >= ctx.settings.timeouts.rejoin_grace_s  # by the injected clock
    assert record.missing == ["p2"] and record.present == ["p0", "p1", "p3"]
    assert record.next_attempt == 3 and record.stage == "statistics ccvr"
    assert 0.05 <= record.backoff_s <= 0.1


def test_a_member_that_left_is_not_waited_for(ctx: StageContext) -> None:
    """A site that refused the plan, or whose certificate is revoked, has left: the
    retry does not wait the grace for it (by the injected clock: each reading is
    0.1 s later, so waiting the grace would take 20 readings)."""
    for pid in ("p0", "p1", "p2"):
        _join(ctx.registry, pid)
    ctx.registry.leave(_join(ctx.registry, "p3"), "it has a revoked certificate")
    record = wait_before_retry(
        ctx, stage="round 4", next_attempt=2, reason="x", wanted=ROSTER, clock=FakeClock(0.1)
    )
    assert record.waited_s < ctx.settings.timeouts.rejoin_grace_s
    assert record.missing == ["p3"] and record.present == ["p0", "p1", "p2"]
    (line,) = [m for (m,) in ctx.store.query("SELECT message FROM events") if "round 4" in m]
    assert line.endswith("(not waited for: ['p3'], which left the federation)")


def test_a_stop_request_ends_the_wait_at_once(ctx: StageContext) -> None:
    ctx.settings = replace(ctx.settings, timeouts=Timeouts(rejoin_grace_s=2.0, retry_backoff_s=0.0))
    threading.Timer(0.3, lambda: ctx.board.stop("SIGTERM")).start()
    frozen = FakeClock(step=0.0)  # the grace never ends: only the stop can end the wait
    with pytest.raises(FederationFailed, match="SIGTERM"):
        wait_before_retry(
            ctx, stage="round 1", next_attempt=2, reason="x", wanted=ROSTER, clock=frozen
        )
    assert ctx.progress.retries == []


@pytest.mark.parametrize("field", ["rejoin_grace_s", "retry_backoff_s"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_bad_grace_or_backoff_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Timeouts(**{field: value})


def test_an_evaluation_with_too_few_connected_waits_for_them_and_tries_again(
    ctx: StageContext,
) -> None:
    """Sites restarting as the validation evaluation starts (seen in the soak: three of
    four killed and back within a second): one connected site is too few for a secure
    job; the evaluation waits for the others (the rejoin grace) and makes its job over
    all four — instead of failing, which left the calibration unvalidated."""
    ctx.settings = replace(
        ctx.settings,
        timeouts=Timeouts(rejoin_grace_s=60.0, retry_backoff_s=0.0, evaluation_s=0.2),
    )
    _join(ctx.registry, "p0")
    timer = threading.Timer(0.3, lambda: [_join(ctx.registry, p) for p in ROSTER[1:]])
    timer.start()
    fed = federated_evaluation(ctx, np.zeros(8), {}, None, split="validation")
    timer.join()
    (retry,) = ctx.progress.retries
    assert retry["stage"] == "validation evaluation" and retry["missing"] == []
    assert "cannot create the evaluation job" in retry["reason"]
    jobs = ctx.store.query("SELECT purpose, participants FROM jobs")
    assert jobs == [("evaluate", '["p0", "p1", "p2", "p3"]')]
    # nobody answers this job here: it ends for lack of advertisements, not of sites
    assert fed["error"] is not None and "cannot create" not in fed["error"]
