"""The sites' evaluation limit and the coordinator's schedule agree, on a real
federation (one coordinator and four participants as processes, gRPC on loopback).

Each site answers at most ``[policy] max_evaluations_per_federation`` evaluations per
federation (default 4). A coordinator evaluating every round of five would spend
them on the first rounds, and its validation gate, closed-form calibrators and final
evaluation — the ones the run needs — would meet the sites' refusals. The
coordinator's ``[evaluation] site_limit`` (default 4, the sites' default) keeps room
for those: here the calibrators' grid, the gate and the final evaluation take three,
so one round is evaluated. Both sides keep their defaults, as real sites and a real
coordinator configured by hand would (``spherecal simulate`` otherwise raises both to
its schedule's count).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import spherecal.simulate.configs as simulate_configs
from spherecal.simulate import run_simulation
from spherecal.simulate.settings import SimulationSettings
from spherecal.spherefed.privacy.evaluation_noise import DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

ROUNDS = 5


def _sites_split_evaluations(out: Path) -> dict[str, list[int]]:
    """Per site, the released evaluations of each split fingerprint (sorted)."""
    import sqlite3

    counts = {}
    for ledger in sorted(out.glob("state/*/privacy.db")):
        conn = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
        try:
            rows = conn.execute(
                "SELECT COUNT(*) FROM site_releases WHERE family = 'evaluation' "
                "AND state = 'released' GROUP BY data"
            ).fetchall()
        finally:
            conn.close()
        counts[ledger.parent.name] = sorted(int(n) for (n,) in rows)
    return counts


def test_every_round_evaluated_leaves_room_for_the_gate_and_the_final_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the simulated sites and coordinator keep their defaults (4), as configured by hand
    monkeypatch.setattr(simulate_configs, "_evaluations_asked", lambda settings: 0)
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=4, model="mlp", rounds=ROUNDS),
        out=tmp_path,
        calibration=("ffc", "ccvr", "lda"),
        federated_every=1,
        timeout_s=300,
    )
    results: dict[str, Any] = dict(run_simulation(settings, progress=lambda _line: None))
    assert results["status"] == "completed", results.get("status_reasons")
    evaluated = [m["round"] for m in results["per_round"] if m["federated_accuracy"] is not None]
    assert evaluated == [1]  # 4 = 1 round + the grid, the gate and the final evaluation
    assert all(v is not None for v in results["accuracy"].values())  # the final evaluation
    assert results["refusals"] == []  # no site had to refuse one
    log = (tmp_path / "logs" / "coordinator.log").read_text()
    assert "per-round federated evaluations (every 1 round(s)) stop after round 1" in log
    counts = {site: sum(n) for site, n in _sites_split_evaluations(tmp_path).items()}
    assert len(counts) == 4
    assert set(counts.values()) == {DEFAULT_MAX_EVALUATIONS_PER_FEDERATION}


def _sites_with_one_evaluation_per_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated sites keep their defaults but ``[policy] max_evaluations_per_split
    = 1`` — as sites whose earlier federations on the same records used all but one of
    a split's evaluations — and the coordinator its own (four per federation)."""
    from spherecal.participant.policy import PolicySettings

    monkeypatch.setattr(simulate_configs, "_evaluations_asked", lambda settings: 0)
    monkeypatch.setattr(
        simulate_configs, "_policy", lambda settings: PolicySettings(max_evaluations_per_split=1)
    )


def test_a_final_evaluation_the_sites_split_limit_refuses_ends_degraded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sites whose test split has one evaluation left for its lifetime (``[policy]
    max_evaluations_per_split = 1``, as after earlier federations on the same records)
    answer round 2's and refuse the final one (of round 3's model: another release, so
    not the repeat rule) with ``RULE_EVALUATIONS_EXHAUSTED``. The
    coordinator, whose own schedule (four per federation) has room for both, does not
    ask again in vain, and the run says what it lost: ``degraded``, the final
    evaluation covering no site — never ``completed`` without its headline."""
    _sites_with_one_evaluation_per_split(monkeypatch)
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=4, model="mlp", rounds=3),
        out=tmp_path,
        calibration=(),
        federated_every=2,
        timeout_s=300,
    )
    results: dict[str, Any] = dict(run_simulation(settings, progress=lambda _line: None))
    assert results["status"] == "degraded", results.get("status_reasons")
    (reason,) = [r for r in results["status_reasons"] if "final evaluation" in r]
    assert "covered 0 participants" in reason
    evaluated = [m["round"] for m in results["per_round"] if m["federated_accuracy"] is not None]
    assert evaluated == [2]  # round 2's was answered
    refused = [r for r in results["refusals"] if r["rule"] == "RULE_EVALUATIONS_EXHAUSTED"]
    assert {r["participant"] for r in refused} == {f"p{k}" for k in range(4)}
    assert all("max_evaluations_per_split = 1" in r["reason"] for r in refused)
    # one test evaluation per site left its ledger; the final one never did
    assert _sites_split_evaluations(tmp_path) == {f"p{k}": [1] for k in range(4)}


def test_a_validation_gate_the_sites_split_limit_refuses_names_the_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sites whose validation split has one evaluation left answer the calibrators'
    grid and refuse the validation gate's: no head is shipped unvalidated, and the
    status says why — the sites' refusal, not only the lost quorum it caused."""
    _sites_with_one_evaluation_per_split(monkeypatch)
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=4, model="mlp", rounds=2),
        out=tmp_path,
        calibration=("ffc", "lda"),
        timeout_s=300,
    )
    results: dict[str, Any] = dict(run_simulation(settings, progress=lambda _line: None))
    assert results["status"] == "degraded"
    assert results["accuracy"]["none"] is not None  # the test split still answered
    assert results["accuracy"]["ffc"] is None and results["accuracy"]["lda"] is None
    for method in ("ffc", "lda"):
        (reason,) = [r for r in results["status_reasons"] if r.startswith(f"{method}:")]
        assert "validation gate" in reason and "max_evaluations_per_split = 1" in reason
    # per site: the grid's validation evaluation and the final test one left, no more
    assert _sites_split_evaluations(tmp_path) == {f"p{k}": [1, 1] for k in range(4)}
