"""Distributed DP-SGD through the real service (issue #25): a coordinator and 3
participant processes on digits (mlp, secure aggregation, 2 rounds = 2 steps).

Checked against the plan, from the outputs alone: every site's own ledger holds one
charge per step, each the planned worst case (``t`` contributors) and each before
its update left (the release ledger's row is noised and carries that ε); the
coordinator's ledger mirrors them and records the federation's charge at the real
contributor count; the noise each step carried (the sites' noise plans, read back
from their ledgers) is at least the planned ``(σΔ)²`` in the ring; the whole
training's ε equals the accountant's for the same ``(σ, q, steps)``; both audits
show it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from spherecal.audit import run_audit
from spherecal.simulate import SimulationSettings, run_simulation
from spherecal.site_audit import read_site_audit
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

SITES, ROUNDS = 3, 2
SIGMA, RATE, CLIP, DELTA = 1.1, 0.05, 1.0, 1e-5


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("distributed-dpsgd")
    results = run_simulation(
        SimulationSettings(
            reference=ReferenceConfig(participants=SITES, model="mlp", rounds=ROUNDS, alpha=0.1),
            out=out,
            calibration=(),
            dpsgd=True,
            dpsgd_noise_multiplier=SIGMA,
            dpsgd_sample_rate=RATE,
            dpsgd_max_grad_norm=CLIP,
            delta=DELTA,
            chunk_entries=8192,
            timeout_s=300,
        )
    )
    return dict(results), out  # a plain mapping: the checks below read nested keys


def _plan() -> DistributedDpsgdPlan:
    # 3 sites: the job's guaranteed contributors t = max(majority 2, min_participants 3)
    return DistributedDpsgdPlan(SIGMA, RATE, max_grad_norm=CLIP, min_contributors=SITES)


def test_every_step_is_charged_at_every_site_as_planned(run: tuple[dict[str, Any], Path]) -> None:
    results, out = run
    assert results["status"] == "completed", results.get("status_reasons")
    planned = _plan().charge(1, DELTA).epsilon
    whole = _plan().charge(ROUNDS, DELTA).epsilon
    for k in range(SITES):
        db = out / "state" / f"p{k}" / "privacy.db"
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT release_id, charge_json, epsilon_total FROM privacy_ledger "
                "WHERE subject = ? ORDER BY rowid",
                (f"p{k}",),
            ).fetchall()
            updates = conn.execute(
                "SELECT round, noised, epsilon, noise FROM site_releases WHERE kind = 'update' "
                "ORDER BY round"
            ).fetchall()
        assert len(rows) == ROUNDS  # one charge per step
        for release_id, charge_json, _ in rows:
            charge = json.loads(charge_json)
            assert release_id.startswith("dpsgd-")
            assert charge["kind"] == "distributed-dpsgd" and charge["mechanism"] == "dpsgd"
            assert charge["epsilon"] == pytest.approx(planned, rel=1e-9)
            assert charge["noise"]["noise_multiplier"] == pytest.approx(SIGMA)
            assert charge["noise"]["sample_rate"] == pytest.approx(RATE)
        # composed over the steps: the accountant's ε of the whole training
        assert rows[-1][2] == pytest.approx(whole, rel=1e-6)
        # the release ledger: one noised update per round, with the step's ε and plan
        assert [r[0] for r in updates] == list(range(ROUNDS))
        for _, noised, epsilon, noise_json in updates:
            assert noised == 1 and epsilon == pytest.approx(planned, rel=1e-9)
            noise = json.loads(noise_json)
            length = noise["plan"]["length"]
            sensitivity = noise["distributed_dpsgd"]["sensitivity"]
            assert sensitivity == pytest.approx(_plan().sensitivity(length))
            # the noise each step carried: t contributors' shares reach (σΔ·2^f)²
            variance = noise["plan"]["parameter"] * 2 * SITES  # Skellam: 2μ per site
            target = (SIGMA * sensitivity * 2.0**16) ** 2
            assert variance >= target
            assert noise["plan"]["target_variance"] == pytest.approx(target)


def test_the_coordinator_records_the_steps_and_applies_them(
    run: tuple[dict[str, Any], Path],
) -> None:
    results, out = run
    privacy = results["privacy"]
    assert privacy["updates"] == "distributed"
    steps = privacy["dpsgd_steps"]
    assert [s["round"] for s in steps] == list(range(1, ROUNDS + 1))
    planned = _plan().charge(1, DELTA).epsilon
    with sqlite3.connect(out / "state" / "p0" / "privacy.db") as conn:
        site_plans = [
            json.loads(r[0])["plan"]
            for r in conn.execute(
                "SELECT noise FROM site_releases WHERE kind = 'update' ORDER BY round"
            )
        ]
    for s, site_plan in zip(steps, site_plans, strict=True):
        # the coordinator's plan and the site's own re-plan agree on each share
        assert s["participant_variance_ring"] == 2 * site_plan["parameter"]
        assert s["contributors"] == SITES and s["min_contributors"] == SITES
        assert s["epsilon"] == pytest.approx(planned) and s["planned_epsilon"] == s["epsilon"]
        assert s["realised_noise_multiplier"] == pytest.approx(SIGMA)
    assert privacy["totals"]["federation"] == pytest.approx(
        _plan().charge(ROUNDS, DELTA).epsilon, rel=1e-6
    )
    for k in range(SITES):
        assert privacy["totals"]["participants"][f"p{k}"] == pytest.approx(
            privacy["totals"]["federation"]
        )
    # the rounds completed and carried no plaintext statistic of the sites
    per_round = results["per_round"]
    assert [m["train_loss"] for m in per_round] == [None] * ROUNDS
    assert all(m["secure_job"] for m in per_round)


def test_both_audits_show_the_dp_sgd(run: tuple[dict[str, Any], Path]) -> None:
    _, out = run
    report = run_audit(out)
    updates = report["protection"]["model_updates"]
    assert updates["dpsgd_sites"] == [f"p{k}" for k in range(SITES)]
    assert "distributed DP-SGD" in updates["dp"]
    assert report["protection"]["updates_without_dp"] is False
    site = read_site_audit(out / "state" / "p0")
    updates_listed = [r for r in site.releases if r.kind == "update"]
    assert [r.round for r in updates_listed] == list(range(ROUNDS))
    assert all(r.noised and r.state == "released" for r in updates_listed)
    planned = _plan().charge(1, DELTA).epsilon
    assert [r.epsilon for r in updates_listed] == pytest.approx([planned] * ROUNDS)
