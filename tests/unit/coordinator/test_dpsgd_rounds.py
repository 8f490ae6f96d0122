"""The coordinator's half of distributed DP-SGD (issue #25): the mode refuses
plaintext updates and a missing expected batch size; the plan uses the job's
guaranteed contributors; the step is ``θ − η·m⊙sum/B`` on trainable entries only;
each step is recorded against the federation (real contributors) and mirrored
against every contributor (worst case ``t``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spherecal.coordinator.driver.dp_releases import FEDERATION, CoordinatorPrivacy
from spherecal.coordinator.driver.dpsgd_rounds import DistributedDpsgd
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.settings import (
    CoordinatorSettings,
    ModelSettings,
    SecAggSettings,
    TrainingSettings,
)
from spherecal.spherefed.network import ModelSpec
from spherecal.spherefed.privacy.settings import PrivacySettings

ROSTER = ("p0", "p1", "p2", "p3", "p4")
DISTRIBUTED = PrivacySettings(
    updates="distributed",
    dpsgd_noise_multiplier=1.2,
    dpsgd_sample_rate=0.02,
    dpsgd_expected_batch_size=40.0,
)


def _settings(tmp_path: Path, **change: object) -> CoordinatorSettings:
    fields: dict[str, object] = {
        "participants": ROSTER,
        "model": ModelSettings(extractor="mlp"),
        "training": TrainingSettings(lr=0.5),
        "privacy": DISTRIBUTED,
        "state_dir": tmp_path,
        **change,
    }
    return CoordinatorSettings(**fields)  # type: ignore[arg-type]


def test_the_mode_needs_secure_updates_and_a_public_batch_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs secure updates"):
        _settings(tmp_path, secagg=SecAggSettings(updates=False))
    with pytest.raises(ValueError, match="dpsgd_expected_batch_size"):
        _settings(tmp_path, privacy=PrivacySettings(updates="distributed"))
    with pytest.raises(ValueError, match="updates must be one of"):
        PrivacySettings(updates="local")


def test_plan_step_and_ledger(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    model = GlobalModel(ModelSpec(extractor="mlp"))
    privacy = CoordinatorPrivacy(settings.privacy, tmp_path / "state.db")
    dpsgd = DistributedDpsgd(settings, model, privacy)
    plan = dpsgd.plan(5)
    assert plan.min_contributors == 3  # majority of 5, min_participants 3
    message = dpsgd.message(plan)
    assert message.noise_multiplier == pytest.approx(1.2) and message.min_contributors == 3
    assert message.max_examples == settings.max_examples_per_site
    before = np.linspace(-1, 1, model.length)
    noisy = np.random.default_rng(0).normal(size=model.length)
    after = dpsgd.step(before, noisy)
    np.testing.assert_allclose(after, before - 0.5 * dpsgd.mask * noisy / 40.0)
    with pytest.raises(ValueError, match="not finite"):
        dpsgd.step(before, np.full(model.length, np.nan))
    summary = dpsgd.record("ab" * 16, 0, plan, ["p0", "p1", "p2", "p4"])
    assert summary["contributors"] == 4
    assert summary["epsilon"] < summary["planned_epsilon"]  # 4 sites' noise: more than t's
    assert summary["planned_epsilon"] == pytest.approx(plan.charge(1, 1e-5).epsilon)
    report = privacy.summary()
    assert report["dpsgd_steps"] == [summary] and report["enabled"] is False
    assert report["totals"]["federation"] == pytest.approx(summary["epsilon"])
    assert set(report["totals"]["participants"]) == {"p0", "p1", "p2", "p4"}
    ledger: dict[str, Any] = dict(report["ledger"])
    assert ledger["subjects"][FEDERATION]["releases"] == 1
    privacy.close()
