"""DP-SGD local training in the participant, charged to its local ledger."""

from __future__ import annotations

import re
import sqlite3
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
from spherefed.privacy.settings import PrivacySettings

pytestmark = pytest.mark.slow


def _federation(tmp: Path, privacy: PrivacySettings) -> InProcessFederation:
    torch.set_num_threads(1)
    ids = ("p0", "p1", "p2")  # participants' default policy refuses 2-party secure jobs
    cs = CoordinatorSettings(
        participants=ids,
        model=ModelSettings(extractor="mlp"),
        training=TrainingSettings(rounds=1, max_round_attempts=1, local_epochs=1),
        calibration=CalibrationSettings(methods=("ffc",)),
        secagg=SecAggSettings(updates=True, statistics=True),
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
            long_poll_ms=300,
            state_dir=tmp / p,
            data=DataSettings(slice_index=k, slice_of=len(ids)),
            privacy=privacy,
        )
        for k, p in enumerate(ids)
    ]
    return InProcessFederation(cs, ps)


def _ledger(path: Path) -> list[tuple[str, str, float]]:
    conn = sqlite3.connect(path)
    if not conn.execute("SELECT name FROM sqlite_master WHERE name='privacy_ledger'").fetchall():
        return []  # privacy.db holds only the release ledger: nothing was charged
    rows = conn.execute("SELECT kind, mechanism, epsilon FROM privacy_ledger").fetchall()
    conn.close()
    return [(str(k), str(m), float(e)) for k, m, e in rows]


def test_dpsgd_round_is_charged_to_each_local_ledger(tmp_path: Path) -> None:
    privacy = PrivacySettings(dpsgd=True, dpsgd_noise_multiplier=1.0)
    fed = _federation(tmp_path, privacy).start()
    summary = fed.join(timeout=180)
    assert summary["status"] == "completed", summary.get("errors")
    for pid in ("p0", "p1", "p2"):
        ((kind, mechanism, eps),) = _ledger(tmp_path / pid / "privacy.db")
        assert (kind, mechanism) == ("dpsgd", "dpsgd") and 0 < eps < 100
    lines = [m for m in fed.messages if "DP-SGD: ε =" in m]
    assert len(lines) == 3
    for line in lines:  # the charge computed before training = Opacus's accountant after it
        opacus_eps, ledger_eps = re.search(r"ε = ([\d.]+) \(ledger ([\d.]+)\)", line).groups()  # type: ignore[union-attr]
        assert opacus_eps == ledger_eps


def test_dpsgd_over_budget_is_refused_with_the_numbers(tmp_path: Path) -> None:
    privacy = PrivacySettings(
        enabled=True, epsilon=10.0, total_epsilon=0.01, dpsgd=True, dpsgd_noise_multiplier=1.0
    )
    fed = _federation(tmp_path, privacy).start()
    summary = fed.join(timeout=180)
    assert summary["status"] == "failed"  # nobody trained: the round cannot complete
    assert any("BUDGET_EXCEEDED" in m and "total budget ε = 0.01" in m for m in fed.messages)
    assert (
        not (tmp_path / "p0" / "privacy.db").exists()
        or _ledger(tmp_path / "p0" / "privacy.db") == []
    )
