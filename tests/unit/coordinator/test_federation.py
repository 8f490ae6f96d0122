"""The federation driver in-process (participant logic + service core, no sockets):
it reproduces the reference runner, and secure aggregation changes nothing but the
last bits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from spherecal.coordinator.driver.federation import Federation, FederationFailed
from spherecal.coordinator.driver.ffc_ccvr_heads import ffc_classifier
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.driver.outputs import write_json
from spherecal.coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    EvaluationSettings,
    ModelSettings,
    SecAggSettings,
    ServerSettings,
    Timeouts,
    TrainingSettings,
)
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.store import Store
from spherecal.coordinator.summary_schema import CoordinatorSummary
from spherecal.inprocess_transport import InProcessFederation
from spherecal.participant.data import load_local_data
from spherecal.participant.policy import PolicySettings
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.reference import ReferenceConfig, run_reference
from spherecal.spherefed.stats import FFCStatistics, ffc_statistics
from tests.evaluation_noise import SDS, assert_accuracy_within_noise, within_noise
from tests.json_shape import shape_errors

N, ROUNDS = 3, 2


def _settings(tmp: Path, *, secure: bool) -> tuple[CoordinatorSettings, list[ParticipantSettings]]:
    ids = tuple(f"p{k}" for k in range(N))
    cs = CoordinatorSettings(
        participants=ids,
        model=ModelSettings(extractor="mlp"),
        training=TrainingSettings(rounds=ROUNDS),
        calibration=CalibrationSettings(methods=("ffc", "ccvr")),
        # update jobs opt in to the 32-bit ring: the service path of issue #24
        secagg=SecAggSettings(
            updates=secure, statistics=secure, chunk_entries=8192, update_resolution=2.0**-10
        ),
        server=ServerSettings(insecure=True),
        timeouts=Timeouts(
            heartbeat_interval_s=0.2, heartbeat_timeout_s=10, long_poll_s=0.3, linger_s=5
        ),
        evaluation=EvaluationSettings(test_dataset="digits", federated_every=1 if secure else 0),
        state_dir=tmp / "state",
        out_dir=tmp / "out",
        example_count_noise_sd=0,  # the reference weights by the exact counts
    )
    ps = [
        ParticipantSettings(
            participant_id=p,
            insecure=True,
            allow_plaintext=not secure,
            long_poll_ms=300,
            data=DataSettings(slice_index=k, slice_of=N),
            policy=PolicySettings(example_count_noise_sd=0),
        )
        for k, p in enumerate(ids)
    ]
    return cs, ps


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    torch.set_num_threads(1)
    return run_reference(ReferenceConfig(participants=N, model="mlp", rounds=ROUNDS))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[CoordinatorSummary, Path]]:
    torch.set_num_threads(1)
    out = {}
    for mode in ("plain", "secure"):
        tmp = tmp_path_factory.mktemp(mode)
        cs, ps = _settings(tmp, secure=mode == "secure")
        fed = InProcessFederation(cs, ps).start()
        out[mode] = (fed.join(timeout=240), tmp)
        assert set(fed.exit_codes.values()) == {0}, fed.messages[-20:]
    return out


def test_plaintext_federation_reproduces_the_reference_exactly(
    runs: dict[str, tuple[CoordinatorSummary, Path]], reference: dict[str, Any]
) -> None:
    summary, _ = runs["plain"]
    assert summary["status"] == "completed"
    # the counts carry the sites' DP noise (issue #19): exact up to it
    assert_accuracy_within_noise(summary, reference["accuracy"])
    central = summary["central_accuracy"]
    assert central is not None
    for name in ("none", "ffc", "ccvr"):
        assert central[name] == reference["accuracy"][name]
    for ours, theirs in zip(summary["per_round"], reference["per_round"], strict=True):
        assert ours["train_loss"] == theirs["train_loss"]
        assert ours["test_accuracy"] == theirs["test_accuracy"]
        assert ours["contributors"] == [f"p{k}" for k in theirs["participants"]]


def test_secure_federation_matches_within_fixed_point_rounding(
    runs: dict[str, tuple[CoordinatorSummary, Path]], reference: dict[str, Any]
) -> None:
    summary, _ = runs["secure"]
    assert summary["status"] == "completed"
    central = summary["central_accuracy"]
    assert_accuracy_within_noise(summary, central)
    assert central is not None
    for name in ("none", "ffc", "ccvr"):
        got = central[name]
        assert got is not None and abs(got - reference["accuracy"][name]) <= 0.01
    # Update jobs ran on the 32-bit ring (3 sites, bound 1e5, step 2^-12 <= 2^-10): the
    # round's mean loss is the sum of the contributors' losses / their count, so it may
    # move by at most half a fixed-point step (plus float rounding).
    updates = [j for j in summary["jobs"] if j["purpose"] == "update"]
    assert [j["ring_bits"] for j in updates] == [32] * ROUNDS
    for ours, theirs, job in zip(
        summary["per_round"], reference["per_round"], updates, strict=True
    ):
        step = 2.0 ** -job["scale_bits"]
        assert abs(ours["train_loss"] - theirs["train_loss"]) <= step / 2 + 1e-9
    # federated evaluation (each round, the validation gate's, final) is a secure job
    assert [j["purpose"] for j in summary["jobs"]] == [
        "update",
        "evaluate",
        "update",
        "evaluate",
        "ccvr",
        "evaluate",
        "evaluate",
    ]
    for row in summary["per_round"]:  # per-round federated evaluation covers the test split
        assert within_noise(
            row["federated_accuracy"], row["test_accuracy"], row["federated_accuracy_sd"]
        )
    assert all(j["status"] == "done" for j in summary["jobs"])


def test_secure_ffc_classifier_equals_plaintext_ffc_on_the_same_features(
    runs: dict[str, tuple[CoordinatorSummary, Path]],
) -> None:
    summary, tmp = runs["secure"]
    heads = torch.load(tmp / "out" / "classifiers.pt", weights_only=True)
    secure_ffc = heads["ffc"].numpy()
    cs, _ = _settings(tmp, secure=True)
    model = GlobalModel(cs.model.spec(cs.seed))
    state = torch.load(tmp / "out" / "model_none.pt", weights_only=True)
    model.net.load_state_dict(state)
    model.net.eval()
    total: FFCStatistics | None = None
    for k in range(N):
        data = load_local_data(DataSettings(slice_index=k, slice_of=N))
        with torch.no_grad():
            z = model.net.features(data.train_x).double().numpy()
        stats = ffc_statistics(z, data.train_y.numpy(), 10)
        total = stats if total is None else total + stats
    assert total is not None
    plain_ffc, _ = ffc_classifier(total, 0.0)
    relative = np.linalg.norm(secure_ffc - plain_ffc) / np.linalg.norm(plain_ffc)
    assert relative < 1e-6, relative


def test_resume_loads_the_last_checkpoint_and_refuses_other_settings(
    runs: dict[str, tuple[CoordinatorSummary, Path]],
) -> None:
    summary, tmp = runs["plain"]
    cs, _ = _settings(tmp, secure=False)
    store = Store(cs.state_dir / "state.db")
    try:
        registry = Registry(
            cs.participants,
            store,
            require_certificates=False,
            heartbeat_timeout_s=5,
            clock_skew_s=60,
        )
        fed = Federation(cs, store, registry, say=lambda m: None)
        fed.prepare()
        assert fed.completed_rounds == ROUNDS and fed.resumed_from == ROUNDS
        assert len(fed.round_metrics) == ROUNDS
        state = torch.load(tmp / "out" / "model_none.pt", weights_only=True)
        fed.model.net.load_state_dict(state)
        from spherecal.spherefed.fl import state_vector

        assert np.array_equal(
            state_vector(fed.model.net, fed.model.keys).astype(np.float32),
            fed.global_vector.astype(np.float32),
        )
        other = replace(cs, training=replace(cs.training, lr=0.5))
        fed2 = Federation(other, store, registry, say=lambda m: None)
        with pytest.raises(Exception, match="different settings"):
            fed2.prepare()
        # Settings outside the fingerprint that change the plan the sites fixed (the
        # calibration methods, the example-count noise) refuse the resume too, naming
        # the plan's fields; pacing (the heartbeat) does not.
        methods = ("ccvr",) if cs.calibration.methods != ("ccvr",) else ("ffc",)
        for changed, field in (
            (replace(cs, calibration=replace(cs.calibration, methods=methods)), "calibration"),
            (replace(cs, example_count_noise_sd=6), "example_count_noise_sd"),
        ):
            fed3 = Federation(changed, store, registry, say=lambda m: None)
            with pytest.raises(FederationFailed, match=rf"another plan \({field} differ"):
                fed3.prepare()
        paced = replace(cs, timeouts=replace(cs.timeouts, heartbeat_interval_s=2.5))
        Federation(paced, store, registry, say=lambda m: None).prepare()
    finally:
        store.close()


def test_summary_schema(runs: dict[str, tuple[CoordinatorSummary, Path]]) -> None:
    summary, _ = runs["secure"]
    for key in (
        "accuracy",
        "central_accuracy",
        "per_round",
        "jobs",
        "timings",
        "bytes",
        "audit_log",
        "models",
        "federated_evaluation",
    ):
        assert key in summary
    assert set(summary["timings"]["secagg_stages_s"]) == {
        "advertise",
        "share",
        "masked",
        "consistency",  # on by default: participants' policy requires it
        "unmask",
    }
    p0 = summary["bytes"]["p0"]
    assert p0["masked"]["received"] > 0 and p0["download"]["sent"] > 0
    fed = summary["federated_evaluation"]  # noisy counts (DP, issue #19): within the noise
    assert fed is not None and fed["noise"] is not None
    assert abs(fed["samples"] - 449) <= SDS * fed["noise"]["sum_sd"] + 0.5
    assert pb.FFC  # the proto module is importable alongside


def test_summary_json_matches_its_declared_shape(
    runs: dict[str, tuple[CoordinatorSummary, Path]], tmp_path: Path
) -> None:
    """What the coordinator writes as ``summary.json`` (through its own writer) holds
    every key ``CoordinatorSummary`` requires, no key it lacks, each of its type."""
    for mode, (summary, _) in runs.items():
        path = tmp_path / f"{mode}.json"
        write_json(path, summary)
        assert shape_errors(json.loads(path.read_text()), CoordinatorSummary) == [], mode
