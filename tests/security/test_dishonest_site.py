"""One dishonest site cannot silently wreck the model (issue #22, done-when).

Each row of the issue's attack table, re-run as ``spherecal simulate --participants 5
--rounds 2 --adversary p4:ATTACK``: five real participant processes over real gRPC
and secure aggregation, p4's local computation replaced by the attack
(``spherecal.participant.adversary``; everything it sends stays inside the job's
bound and passes the aggregate invariants). Each run must end ``degraded`` with a
stated reason — refused by the per-site bound, by a cross-check between independent
sums, or by the validation gate — and ``spherecal audit`` must not print PASS; no
run may end ``completed`` with a calibrated head worse than none on validation.

The mutation check: the attack the cross-checks cannot see (``replace``: fake
statistics carrying p4's honest example count), with ``[federation]
validation_gate = false``, ends ``completed`` with a CCVR head below the
uncalibrated model on validation — the gate is what stops it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from spherecal.audit import run_audit
from spherecal.audit_report import format_report
from spherecal.cli.app import main as cli_main

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]


def _simulate(out: Path, attack: str) -> dict[str, Any]:
    code = cli_main(
        [
            "simulate",
            "--participants", "5",
            "--rounds", "2",
            "--adversary", f"p4:{attack}",
            "--timeout", "600",
            "--out", str(out),
            "--quiet",
        ]
    )  # fmt: skip
    assert code in (0, 1)  # 1: the run did not complete as asked
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def _failed(results: dict[str, Any]) -> list[str]:
    return [c["check"] for c in results["integrity"]["checks"] if not c["passed"]]


def _audit_verdict(out: Path) -> str:
    report = run_audit(out, out=out / "audit.json")
    text = format_report(report)
    assert report["checks"]["integrity"]["ok"] is False
    return text.splitlines()[1]


@pytest.mark.parametrize(
    ("attack", "check", "reason"),
    [
        # 10³ fake examples per class: every entry inside the job's bound (a unit-norm
        # head's statistics bound follows max_examples_per_site, 1,348 here; 10⁵ per
        # class would not fit it), the count 11,213 exceeds 5 sites × 1,348
        ("directions:1000", "ccvr count bound", "exceeds 5 contributors"),
        # 200 per class plus its own features relabelled: within the bound (5 sites ×
        # the dataset's largest split, 1,348), but the statistics count 5,327 examples
        # where the rounds trained on 1,213 (their weights are within noise of it; at
        # 300 per class the count, 7,233, is already refused by the bound)
        ("relabel:200", "training weights vs ccvr count", "trained on Σ n_k = "),
        # an update of ±0.9·bound per entry claiming weight 10⁵
        ("blast:100000", "training weights vs ccvr count", "the ccvr statistics count 1213"),
        # the same update claiming p4's honest weight: every count agrees, the trained
        # model scores at chance on validation
        ("blast:302", "trained model above chance", "chance"),
    ],
)
def test_each_attack_is_refused_with_a_reason(
    tmp_path: Path, attack: str, check: str, reason: str
) -> None:
    results = _simulate(tmp_path, attack)
    assert results["settings"]["adversary"] == [f"p4:{attack}"]
    assert results["status"] == "degraded"
    assert check in _failed(results)
    assert any(reason in r for r in results["status_reasons"]), results["status_reasons"]
    assert _audit_verdict(tmp_path).startswith("FAIL")
    heads = results["integrity"]["gate"]["heads"]
    validation = results.get("validation_accuracy") or {}
    for name, decision in heads.items():  # nothing shipped that validation rejected
        if decision["shipped"] and validation.get(name) is not None:
            assert check == "trained model above chance" or validation[name] >= validation["none"]
    if check != "trained model above chance":  # the refused statistics built no head
        assert results["accuracy"]["ffc"] is None and results["accuracy"]["ccvr"] is None
        models = results["models"]
        assert not any("ccvr" in str(k) for k in models), models


def test_fake_statistics_with_an_honest_count_are_caught_by_the_validation_gate(
    tmp_path: Path,
) -> None:
    results = _simulate(tmp_path, "replace")
    assert results["status"] == "degraded"
    assert results["integrity"]["checks"], "the cross-checks ran"
    assert "training weights vs ccvr count" not in _failed(results)  # the count is honest
    validation = results["validation_accuracy"]
    heads = results["integrity"]["gate"]["heads"]
    worse = [n for n in heads if (validation.get(n) or 1.0) < validation["none"]]
    assert worse, (validation, heads)  # the attack does make a head worse than none
    for name in worse:  # ... which is either not shipped, or flagged
        assert not heads[name]["shipped"] or f"{name} no worse than uncalibrated" in _failed(
            results
        )
    assert _audit_verdict(tmp_path).startswith("FAIL")


def test_mutation_without_the_gate_the_wrecked_head_ships_as_completed(tmp_path: Path) -> None:
    from spherecal.cli.simulate import simulate_defaults, simulation_settings_from
    from spherecal.simulate import run_simulation

    settings = simulation_settings_from(
        {
            **simulate_defaults(),
            "participants": 5,
            "rounds": 2,
            "adversary": "p4:replace",
            "out": str(tmp_path),
        }
    )
    settings = replace(settings, extra_coordinator={"federation": {"validation_gate": False}})
    results = dict[str, Any](run_simulation(settings, progress=lambda _line: None))
    assert results["status"] == "completed"
    assert any("validation gate off" in w for w in results["warnings"])  # logged weakening
    test = results["accuracy"]
    assert test["ccvr"] < test["none"]  # the wrecked head shipped


def test_a_round_after_a_rollback_trains_from_the_same_model_and_is_admitted(
    tmp_path: Path,
) -> None:
    """``round_gate = "rollback"`` undoes round 3, so round 4 trains from the model
    round 3 did. Each round carries its own seed (``derive_seed(seed, "train", r, k)``),
    so every site's round-4 update is another update, not round 3's again: no site
    refuses it (the ledger refuses one exact update twice, ``RULE_RELEASE_REPEATED``)
    and the run completes its four rounds."""
    import sqlite3

    results = _run_with(tmp_path, "blast:302@3", {"round_gate": "rollback"}, rounds=4)
    rounds = results["integrity"]["gate"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert rounds[2]["rolled_back"]
    assert rounds[3]["before"] == rounds[2]["before"]  # round 4 from round 3's model
    every = ["p0", "p1", "p2", "p3", "p4"]
    assert [r["contributors"] for r in results["per_round"]] == [every] * 4
    for site in every:
        with sqlite3.connect(tmp_path / "state" / site / "privacy.db") as db:
            assert db.execute("SELECT rule FROM site_refusals").fetchall() == []
            executed, trained = zip(
                *db.execute(
                    "SELECT executed, trained FROM site_releases WHERE kind = 'update' "
                    "AND state = 'released' ORDER BY round"
                ).fetchall(),
                strict=True,
            )
        assert len(executed) == 4 and executed[2] == executed[3]  # one executed model
        assert len(set(trained)) == 4  # four updates


def _run_with(
    out: Path, attack: str, federation: dict[str, Any], *, rounds: int = 2
) -> dict[str, Any]:
    from spherecal.cli.simulate import simulate_defaults, simulation_settings_from
    from spherecal.simulate import run_simulation

    settings = simulation_settings_from(
        {
            **simulate_defaults(),
            "participants": 5,
            "rounds": rounds,
            "adversary": f"p4:{attack}",
            "out": str(out),
        }
    )
    settings = replace(settings, extra_coordinator={"federation": federation})
    return dict[str, Any](run_simulation(settings, progress=lambda _line: None))


@pytest.mark.parametrize("mode", ["rollback", "flag"])
def test_the_round_gate_flags_a_round_that_wrecks_the_model_and_can_undo_it(
    tmp_path: Path, mode: str
) -> None:
    """p4 trains honestly in rounds 1 and 2 and blasts its update in round 3 (claiming
    its true weight, so no count disagrees). ``round_gate = "rollback"`` undoes round 3;
    the mutation ``"flag"`` only reports it, and the model stays wrecked. Round 3, not
    2: after one round validation accuracy is ~0.3, so the blast's drop (~0.2) cleared
    the gate's limit (~0.175, widened by the counts' fresh DP noise) by too little to
    be flagged in every run; after two rounds it is ~0.74 and the drop ~0.63."""
    results = _run_with(tmp_path, "blast:302@3", {"round_gate": mode}, rounds=3)
    rounds = results["integrity"]["gate"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert not rounds[0]["flagged"] and not rounds[1]["flagged"]
    assert rounds[2]["flagged"] and rounds[2]["rolled_back"] is (mode == "rollback")
    assert rounds[2]["before"] - rounds[2]["after"] > rounds[2]["limit"]
    assert results["status"] == "degraded"
    assert any(r.startswith("round 3: federated validation accuracy dropped") for r in
               results["status_reasons"])  # fmt: skip
    none = results["accuracy"]["none"]
    if mode == "rollback":  # the round-2 model, which validation scored well above chance
        # the final model *is* round 2's: the coordinator's own test accuracy of it is
        # round 2's to the last bit (the federated validation counts carry fresh DP
        # noise in every evaluation, issue #19, so they only agree within it)
        central = results["central_accuracy"]
        assert central is not None
        assert central["none"] == results["per_round"][1]["test_accuracy"]
        assert abs(results["validation_accuracy"]["none"] - rounds[1]["after"]) < 0.05
        assert none > 0.5
    else:
        assert none < 0.2
