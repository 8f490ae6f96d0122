"""``allow_plaintext = true`` is a weakening: the site says so at start, as it does for
every weakened ``[policy]`` key, and not when it is off (the default)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from spherecal.crypto.replay import MemoryJobLedger
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.trust import DirectoryTrust
from tests.security.test_replan_oracle import IDENTITY, Replanning, _plan, _site_data


@pytest.mark.parametrize("allow", [True, False])
def test_allow_plaintext_is_logged_as_a_weakening(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, allow: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="spherecal.participant")
    lines: list[str] = []
    runner = ParticipantRunner(
        ParticipantSettings(
            participant_id="p0",
            coordinator="127.0.0.1:1",
            insecure=True,
            allow_plaintext=allow,
            state_dir=tmp_path / "st",
        ),
        Replanning([_plan(10)]),  # type: ignore[arg-type]
        _site_data(tmp_path, 9),
        IDENTITY,
        MemoryJobLedger(),
        DirectoryTrust(None),
        log=lines.append,
    )
    assert runner.run() == 0
    weakened = [line for line in lines if line.startswith("WARNING: policy weakened: allow_")]
    records = [r.getMessage() for r in caplog.records if "allow_plaintext" in r.getMessage()]
    if allow:
        assert len(weakened) == 1 and "plaintext" in weakened[0]
        assert len(records) == 1
    else:
        assert weakened == [] and records == []
