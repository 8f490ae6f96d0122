"""DP-SGD local training in the participant, charged to its local ledger."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
import torch

from spherecal.inprocess_transport import InProcessFederation
from spherecal.spherefed.privacy.settings import PrivacySettings
from tests.unit.coordinator.helpers import secure_federation

pytestmark = pytest.mark.slow


def _federation(tmp: Path, privacy: PrivacySettings) -> InProcessFederation:
    torch.set_num_threads(1)
    ids = ("p0", "p1", "p2")  # participants' default policy refuses 2-party secure jobs
    cs, ps = secure_federation(tmp, ids, privacy=privacy)
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
