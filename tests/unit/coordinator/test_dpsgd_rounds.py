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
from spherecal.spherefed.privacy.ledger import DuplicateRelease
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


def _ledger_rows(privacy: CoordinatorPrivacy) -> dict[str, list[str]]:
    store = privacy.ledger.store
    return {s: [e.release_id for e in store.entries(s)] for s in store.subjects()}


def test_a_step_replayed_after_a_restart_is_charged_once(tmp_path: Path) -> None:
    """A coordinator killed after recording a step and before its checkpoint replays
    the journaled sum on restart: the record returns the stored summary, charges
    nothing, and the results still list the step (restored from the database)."""
    settings = _settings(tmp_path)
    model = GlobalModel(ModelSpec(extractor="mlp"))
    first = CoordinatorPrivacy(settings.privacy, tmp_path / "state.db")
    dpsgd = DistributedDpsgd(settings, model, first)
    plan = dpsgd.plan(5)
    job = "cd" * 16
    summary = dpsgd.record(job, 0, plan, ["p0", "p1", "p2"])
    once = _ledger_rows(first)
    total = first.summary()["totals"]["federation"]
    first.close()  # SIGKILL here: no checkpoint, the round's sum stays journaled

    again = CoordinatorPrivacy(settings.privacy, tmp_path / "state.db")
    assert again.dpsgd_steps == [summary]  # restored, not lost with the process
    replayed = DistributedDpsgd(settings, model, again).record(job, 0, plan, ["p0", "p1", "p2"])
    assert replayed == {**summary, "replayed": True}
    assert _ledger_rows(again) == once  # one charge per subject, as before the restart
    report = again.summary()
    assert report["totals"]["federation"] == pytest.approx(total)
    assert report["dpsgd_steps"] == [summary]
    # the next step is charged normally
    nxt = DistributedDpsgd(settings, model, again).record("ef" * 16, 1, plan, ["p0", "p1", "p2"])
    assert [s["round"] for s in again.summary()["dpsgd_steps"]] == [1, 2]
    assert nxt["federation_epsilon_total"] > total
    assert {s: len(r) for s, r in _ledger_rows(again).items()} == {
        FEDERATION: 2,
        "p0": 2,
        "p1": 2,
        "p2": 2,
    }
    again.close()


def _half_recorded(tmp_path: Path) -> tuple[CoordinatorSettings, GlobalModel, Any, str]:
    """A database as a coordinator killed between a step's ledger rows (each its own
    commit) leaves it: the federation's and p0's rows, not p1's, p2's or the summary."""
    settings = _settings(tmp_path)
    model = GlobalModel(ModelSpec(extractor="mlp"))
    privacy = CoordinatorPrivacy(settings.privacy, tmp_path / "state.db")
    plan = DistributedDpsgd(settings, model, privacy).plan(5)
    release = "dpsgd-" + "12" * 16
    privacy.ledger.record(FEDERATION, plan.charge(1, 1e-5, contributors=3), release_id=release)
    privacy.ledger.record("p0", plan.charge(1, 1e-5), release_id=release)
    privacy.close()
    return settings, model, plan, release


def test_a_half_recorded_step_is_completed_once(tmp_path: Path) -> None:
    """The replay adds only the missing rows and the summary."""
    settings, model, plan, release = _half_recorded(tmp_path)
    again = CoordinatorPrivacy(settings.privacy, tmp_path / "state.db")
    assert again.dpsgd_steps == []
    summary = DistributedDpsgd(settings, model, again).record(
        "12" * 16, 0, plan, ["p0", "p1", "p2"]
    )
    assert "replayed" not in summary and again.dpsgd_steps == [summary]
    assert _ledger_rows(again) == {s: [release] for s in (FEDERATION, "p0", "p1", "p2")}
    assert summary["federation_epsilon_total"] == pytest.approx(
        plan.charge(1, 1e-5, contributors=3).epsilon
    )
    again.close()


def test_mutation_recording_without_the_replay_check_fails_the_replayed_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weaken the rule (record every subject unconditionally, as before): the same
    replay raises instead of completing the step."""
    settings, model, plan, _ = _half_recorded(tmp_path)

    def unconditional(self: CoordinatorPrivacy, subject: str, charge: Any, release_id: str) -> Any:
        return self.ledger.record(subject, charge, release_id=release_id)

    monkeypatch.setattr(CoordinatorPrivacy, "_record_once", unconditional)
    again = CoordinatorPrivacy(settings.privacy, tmp_path / "state.db")
    with pytest.raises(DuplicateRelease):
        DistributedDpsgd(settings, model, again).record("12" * 16, 0, plan, ["p0", "p1", "p2"])
    again.close()
