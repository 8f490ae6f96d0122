"""Participant logic over the in-process transport."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    ModelSettings,
    SecAggSettings,
    ServerSettings,
    Timeouts,
    TrainingSettings,
)
from participant.settings import DataSettings, ParticipantSettings
from spherecal.inprocess import InProcessFederation


def _federation(tmp: Path, *, allow_plaintext: bool) -> InProcessFederation:
    torch.set_num_threads(1)
    ids = ("p0", "p1")
    cs = CoordinatorSettings(
        participants=ids,
        model=ModelSettings(extractor="mlp"),
        training=TrainingSettings(rounds=1, max_round_attempts=1),
        calibration=CalibrationSettings(methods=("ffc",)),
        secagg=SecAggSettings(updates=False, statistics=False),
        server=ServerSettings(insecure=True),
        timeouts=Timeouts(
            heartbeat_interval_s=0.2, heartbeat_timeout_s=5, long_poll_s=0.3, linger_s=3
        ),
        state_dir=tmp / "state",
        out_dir=tmp / "out",
    )
    ps = [
        ParticipantSettings(
            participant_id=p,
            insecure=True,
            allow_plaintext=allow_plaintext,
            long_poll_ms=300,
            data=DataSettings(slice_index=k, slice_of=2),
        )
        for k, p in enumerate(ids)
    ]
    if allow_plaintext is False:
        ps[1] = replace(ps[1], allow_plaintext=True)
    return InProcessFederation(cs, ps)


def test_participant_refuses_plaintext_uploads_by_default(tmp_path: Path) -> None:
    fed = _federation(tmp_path, allow_plaintext=False).start()
    summary = fed.join(timeout=120)
    # p0 withdrew with its reason; a round needs two updates, so the federation fails
    # cleanly and every participant is told so.
    assert summary["status"] == "failed"
    assert any("allow_plaintext" in m for m in fed.messages)
    assert fed.exit_codes == {"p0": 1, "p1": 1}
    events = fed.store.path
    assert events.exists()


def test_participant_rejoins_when_its_session_expires(tmp_path: Path) -> None:
    fed = _federation(tmp_path, allow_plaintext=True)
    runner = fed.runners["p0"]
    original = runner._join  # noqa: SLF001 - observe rejoining
    joins: list[int] = []

    def counting_join() -> None:
        joins.append(1)
        original()
        if len(joins) == 1:
            runner.session = "expired"  # as if the coordinator restarted

    runner._join = counting_join  # type: ignore[method-assign]  # noqa: SLF001
    fed.start()
    summary = fed.join(timeout=120)
    assert summary["status"] == "completed"
    assert len(joins) >= 2
    assert fed.exit_codes == {"p0": 0, "p1": 0}


@pytest.mark.parametrize("value", [0, 3])
def test_data_settings_validate_slices(value: int) -> None:
    with pytest.raises(ValueError):
        DataSettings(slice_index=value, slice_of=None if value == 0 else 3)
