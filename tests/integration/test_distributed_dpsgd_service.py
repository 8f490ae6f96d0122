"""Distributed DP-SGD through the real service (issue #25): a coordinator and 4
participant processes on digits (mlp, secure aggregation, 3 rounds = 3 steps, the
round gate on), with the two faults a deployment meets:

* the coordinator is SIGKILLed after recording round 1's step in its ledger and
  before its checkpoint (the test-only halt point ``recorded@r1``) and restarted on
  the same state: it replays the journaled sum onto the checkpointed model and must
  not charge the step again;
* restarted, it is SIGKILLed again once a round-gate evaluation job has its result
  journaled (``aggregated@evaluate``), before the driver used it and before the
  round's checkpoint, and restarted: the evaluation must be read back, not asked of
  the sites again (no second evaluation release at any site);
* site p3 is SIGKILLed in the middle of round 2's step (its masked upload cut after
  the first chunk) and never comes back: with ``t`` = 3 of 4 guaranteed
  contributors the step still goes ahead on the other three, whose noise shares
  alone reach the planned variance, and round 3 runs without p3.

Checked against the plan, from the outputs alone: every site's own ledger holds one
charge per step it took part in, each the planned worst case (``t`` contributors)
and each before its update left (the release ledger's row is noised and carries
that ε); the coordinator's ledger holds one row per step and subject and records the
federation's charge at the real contributor count; the noise each step carried (the
sites' noise plans, read back from their ledgers, times the contributors) is at
least the planned ``(σΔ)²`` in the ring, also in the step p3 dropped out of; the
round gate scored every step; the whole training's ε equals the accountant's for the
same ``(σ, q, steps)``; both audits show it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from spherecal.audit import run_audit
from spherecal.participant.faults import HaltPoint
from spherecal.simulate import Drop, Simulation, SimulationSettings
from spherecal.site_audit import read_site_audit
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.reference import ReferenceConfig
from tests.coordinator_lines import Lines

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

SITES, ROUNDS, T = 4, 3, 3  # t: a majority of 4 (the complete graph's threshold)
SIGMA, RATE, CLIP, DELTA = 1.1, 0.05, 1.0, 1e-5
DROPPED, DROP_ROUND = "p3", 2
WAIT_S = 300.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("distributed-dpsgd")
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=SITES, model="mlp", rounds=ROUNDS, alpha=0.1),
        out=out,
        calibration=(),
        drops=(Drop(DROPPED, HaltPoint("masked", f"r{DROP_ROUND}")),),
        rejoin_grace_s=2.0,  # p3 is not restarted
        dpsgd=True,
        dpsgd_noise_multiplier=SIGMA,
        dpsgd_sample_rate=RATE,
        dpsgd_max_grad_norm=CLIP,
        delta=DELTA,
        chunk_entries=8192,
        timeout_s=WAIT_S,
        # the gate scores every step; no drop is "sharp" here, so the status does not
        # hang on how much one noisy step of a young model moves its accuracy
        extra_coordinator={"federation": {"round_gate": "flag", "round_max_drop": 1.0}},
    )
    lines = Lines()
    t0 = time.monotonic()
    with Simulation(settings, lines) as sim:
        port = sim.start_coordinator(halt="recorded@r1")
        sim.start_participants()
        lines.wait_for("SPHERECAL-HALT recorded ", 0, sim, WAIT_S)
        sim.kill_coordinator()
        # back up, and killed again once an evaluation job of the round gate has its
        # result journaled, before the driver used it and before the round's checkpoint
        sim.start_coordinator(listen=f"127.0.0.1:{port}", halt="aggregated@evaluate")
        lines.wait_for("SPHERECAL-HALT aggregated ", 0, sim, WAIT_S)
        sim.kill_coordinator()
        sim.start_coordinator(listen=f"127.0.0.1:{port}")
        sim.wait_coordinator(WAIT_S)
        results = dict[str, Any](
            sim.results(sim.wait_participants(timeout=60), time.monotonic() - t0)
        )
    results["lines"] = lines.lines
    return results, out


def _plan() -> DistributedDpsgdPlan:
    return DistributedDpsgdPlan(SIGMA, RATE, max_grad_norm=CLIP, min_contributors=T)


def _steps_taken(pid: str) -> int:
    """Steps whose update the site charged: all but p3's after its death."""
    return DROP_ROUND if pid == DROPPED else ROUNDS


def test_the_run_goes_on_through_both_faults(run: tuple[dict[str, Any], Path]) -> None:
    results, _ = run
    assert results["status"] == "completed", results.get("status_reasons")
    assert len(results["per_round"]) == ROUNDS
    lines = results["lines"]
    # the kill landed between the record and the checkpoint, and the replay saw it
    assert any("SPHERECAL-HALT recorded" in line for line in lines)
    assert any("recorded before a restart: not charged again" in line for line in lines)
    assert any("SPHERECAL-HALT aggregated" in line for line in lines)
    assert [d["participant"] for d in results["dropped"]] == [DROPPED]
    contributors = [m["contributors"] for m in results["per_round"]]
    everyone = [f"p{k}" for k in range(SITES)]
    assert contributors[0] == everyone
    assert all(c == everyone[:T] for c in contributors[DROP_ROUND - 1 :])


def test_every_step_is_charged_once_at_every_site_as_planned(
    run: tuple[dict[str, Any], Path],
) -> None:
    _, out = run
    planned = _plan().charge(1, DELTA).epsilon
    for k in range(SITES):
        pid = f"p{k}"
        db = out / "state" / pid / "privacy.db"
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT release_id, charge_json, epsilon_total FROM privacy_ledger "
                "WHERE subject = ? ORDER BY rowid",
                (pid,),
            ).fetchall()
            updates = conn.execute(
                "SELECT round, noised, epsilon, noise FROM site_releases WHERE kind = 'update' "
                "ORDER BY round"
            ).fetchall()
        taken = _steps_taken(pid)
        assert len(rows) == taken  # one charge per step, none twice after the restart
        assert len({r[0] for r in rows}) == taken
        for release_id, charge_json, _ in rows:
            charge = json.loads(charge_json)
            assert release_id.startswith("dpsgd/") and "/round-" in release_id
            assert charge["kind"] == "distributed-dpsgd" and charge["mechanism"] == "dpsgd"
            assert charge["epsilon"] == pytest.approx(planned, rel=1e-9)
            assert charge["noise"]["noise_multiplier"] == pytest.approx(SIGMA)
            assert charge["noise"]["sample_rate"] == pytest.approx(RATE)
        # composed over the steps: the accountant's ε of the steps it took part in
        assert rows[-1][2] == pytest.approx(_plan().charge(taken, DELTA).epsilon, rel=1e-6)
        # the release ledger: one noised update per round, with the step's ε and plan
        assert [r[0] for r in updates] == list(range(taken))
        for _, noised, epsilon, noise_json in updates:
            assert noised == 1 and epsilon == pytest.approx(planned, rel=1e-9)
            noise = json.loads(noise_json)
            length = noise["plan"]["length"]
            sensitivity = noise["distributed_dpsgd"]["sensitivity"]
            assert sensitivity == pytest.approx(_plan().sensitivity(length))
            # each share is sized so that any t contributors reach (σΔ·2^f)²
            variance = noise["plan"]["parameter"] * 2 * T  # Skellam: 2μ per site
            target = (SIGMA * sensitivity * 2.0**16) ** 2
            assert variance >= target
            assert noise["plan"]["target_variance"] == pytest.approx(target)


def test_the_coordinator_records_each_step_once_with_at_least_the_planned_noise(
    run: tuple[dict[str, Any], Path],
) -> None:
    results, out = run
    privacy = results["privacy"]
    assert privacy["updates"] == "distributed"
    steps = privacy["dpsgd_steps"]
    # round 1's summary was written before the kill and restored after it
    assert [s["round"] for s in steps] == list(range(1, ROUNDS + 1))
    with sqlite3.connect(out / "state" / "p0" / "privacy.db") as conn:
        site_plans = [
            json.loads(r[0])["plan"]
            for r in conn.execute(
                "SELECT noise FROM site_releases WHERE kind = 'update' ORDER BY round"
            )
        ]
    length = site_plans[0]["length"]
    target = (SIGMA * _plan().sensitivity(length) * 2.0**16) ** 2
    expected_contributors = [SITES] + [T] * (ROUNDS - 1)
    for s, site_plan, n in zip(steps, site_plans, expected_contributors, strict=True):
        # the coordinator's plan and the site's own re-plan agree on each share
        assert s["participant_variance_ring"] == 2 * site_plan["parameter"]
        assert s["contributors"] == n and s["min_contributors"] == T
        # the noise the step carried: its contributors' shares, at least the plan's
        assert s["participant_variance_ring"] * s["contributors"] >= target
        assert s["realised_noise_multiplier"] >= SIGMA * (1 - 1e-12)
        assert s["epsilon"] <= s["planned_epsilon"] * (1 + 1e-12)
        assert s["planned_epsilon"] == pytest.approx(_plan().charge(1, DELTA).epsilon)
    # the step p3 dropped out of: exactly t contributors, exactly the planned noise
    assert steps[DROP_ROUND - 1]["realised_noise_multiplier"] == pytest.approx(SIGMA)
    with sqlite3.connect(out / "coordinator" / "state" / "state.db") as conn:
        rows = conn.execute("SELECT subject, release_id FROM privacy_ledger").fetchall()
    per_subject: dict[str, list[str]] = {}
    for subject, release in rows:
        per_subject.setdefault(subject, []).append(release)
    assert len(per_subject["federation"]) == ROUNDS
    for k in range(SITES):
        # mirrored for the contributors of each step: p3 charged round 2 itself
        # (before its upload) but its input is not in that step's sum
        contributed = DROP_ROUND - 1 if f"p{k}" == DROPPED else ROUNDS
        assert len(per_subject[f"p{k}"]) == contributed
    for releases in per_subject.values():
        assert len(releases) == len(set(releases))  # nothing charged twice
    # the round gate scored every step (an evaluation job after each)
    gate = results["integrity"]["gate"]
    assert [g["round"] for g in gate["rounds"]] == list(range(1, ROUNDS + 1))
    assert all(g["after"] is not None and g["flagged"] is False for g in gate["rounds"])
    # the rounds carried no plaintext statistic of the sites
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
    # the site's audit counts rounds 1-based, as the coordinator's summary does
    assert [r.round for r in updates_listed] == list(range(1, ROUNDS + 1))
    assert all(r.noised and r.state == "released" for r in updates_listed)
    planned = _plan().charge(1, DELTA).epsilon
    assert [r.epsilon for r in updates_listed] == pytest.approx([planned] * ROUNDS)


def test_no_evaluation_is_released_twice_across_the_restarts(
    run: tuple[dict[str, Any], Path],
) -> None:
    """Each evaluation job of the round gate — including the one the coordinator was
    killed in after its result was journaled — is one release per site: the restarted
    driver reads the journaled result back instead of asking again, and no site
    refused a repeated release."""
    results, out = run
    gate = results["integrity"]["gate"]["rounds"]
    for k in range(SITES):
        pid = f"p{k}"
        with sqlite3.connect(out / "state" / pid / "privacy.db") as conn:
            evaluations = conn.execute(
                "SELECT model, content, state FROM site_releases WHERE kind = 'evaluate'"
            ).fetchall()
            refusals = conn.execute("SELECT rule, reason FROM site_refusals").fetchall()
        assert evaluations, pid
        assert all(state == "released" for _, _, state in evaluations), (pid, evaluations)
        # one release per (model, split and heads): none asked again under a new job
        asked = [(bytes(m), bytes(c)) for m, c, _ in evaluations]
        assert len(asked) == len(set(asked)), pid
        assert refusals == [], (pid, refusals)
    # p0 took part in every evaluation: the gate's (the model before round 1 and after
    # each round) and the final one on the test split, each once
    with sqlite3.connect(out / "state" / "p0" / "privacy.db") as conn:
        (n_p0,) = conn.execute(
            "SELECT COUNT(*) FROM site_releases WHERE kind = 'evaluate'"
        ).fetchone()
    assert n_p0 == (len(gate) + 1) + 1
