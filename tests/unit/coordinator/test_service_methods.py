"""Every method of the baselines harness that needs no more than the service carries
(``MethodSpec.service_options``) runs through the service core and reproduces the
in-process harness run exactly: same head, classifier, loss, local step, named sums
and server step — FedNova's ``Σ n_k‖a_k‖₁`` and SCAFFOLD's broadcast control variate
and control-variate sums included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from spherecal.coordinator.settings import ModelSettings, TrainingSettings
from spherecal.coordinator.summary_schema import CoordinatorSummary
from spherecal.inprocess_transport import InProcessFederation
from spherecal.spherefed.algorithms.methods import BASES, METHODS, MethodSpec, sphere_variant
from spherecal.spherefed.reference import ReferenceConfig, run_federation
from tests.unit.coordinator.helpers import plaintext_federation

N = 3
BASE = ReferenceConfig(participants=N, model="mlp", rounds=2)


def _service_methods() -> list[MethodSpec]:
    """One method per distinct service configuration (many ablation rows coincide)."""
    seen: dict[str, MethodSpec] = {}
    for method in (*METHODS.values(), *(sphere_variant(b) for b in BASES)):
        options = method.service_options()
        if options is not None:
            seen.setdefault(json.dumps(options, sort_keys=True), method)
    return list(seen.values())


def test_service_options_say_which_methods_need_more_than_sums() -> None:
    for algorithm in ("fednova", "scaffold"):  # extra sums / a broadcast: carried now
        assert METHODS[algorithm].service_options() == {
            "algorithm": algorithm,
            "head": "learnable",
            "classifier": "orthonormal",
            "loss": "ce",
        }
    assert METHODS["feduv"].service_options() is None  # local objective terms
    assert METHODS["spherefed_ce"].service_options() is None  # temperature τ
    assert METHODS["babu"].service_options() == {
        "algorithm": "fedavg",
        "head": "fixed",
        "classifier": "random",
        "loss": "ce",
    }
    assert {m.key for m in _service_methods()} >= {
        "fedavg",
        "fednova",
        "fedyogi",
        "scaffold",
        "babu",
        "fedfn",
        "scaffold_spherefed",
    }


def _service_run(tmp: Path, options: dict[str, Any]) -> tuple[CoordinatorSummary, Any]:
    model = ModelSettings(extractor="mlp", head=options["head"], classifier=options["classifier"])
    training = TrainingSettings(
        rounds=BASE.rounds,
        loss=options["loss"],
        algorithm=options["algorithm"],
        fedopt_lr=options.get("fedopt_lr", 0.01),
    )
    cs, ps = plaintext_federation(tmp, model, training, n=N)
    fed = InProcessFederation(cs, ps).start()
    summary = fed.join(timeout=240)
    assert summary["status"] == "completed", fed.messages[-20:]
    return summary, ps


@pytest.mark.parametrize("method", _service_methods(), ids=lambda m: m.key)
def test_method_through_the_service_equals_the_harness(method: MethodSpec, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    options = method.service_options()
    assert options is not None
    summary, participants = _service_run(tmp_path, options)
    harness = run_federation(
        method.reference_config(BASE, lr=BASE.lr),
        strategy=method.strategy(BASE),
        objective=method.objective(),
        oracle=False,
    )
    assert summary["accuracy"]["none"] == harness["accuracy"]["none"]
    central = summary["central_accuracy"]
    assert central is not None and central["ffc"] == harness["accuracy"]["ffc"]
    for ours, theirs in zip(summary["per_round"], harness["per_round"], strict=True):
        assert ours["train_loss"] == theirs["train_loss"]
        assert ours["test_accuracy"] == theirs["test_accuracy"]
    # SCAFFOLD's c_k stays with each participant, on disk (survives a restart).
    stored = [sorted((p.state_dir / "algorithm").glob("*.npz")) for p in participants]
    if options["algorithm"] == "scaffold":
        for files in stored:
            assert len(files) == 1
            with np.load(files[0], allow_pickle=False) as data:
                assert int(data["round"][0]) == BASE.rounds - 1
                assert np.abs(data["after.control"]).max() > 0
    else:
        assert stored == [[] for _ in participants]
