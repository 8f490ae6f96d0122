"""Method recipes through the reference pipeline, the synthetic dataset, and the
bit-identity of the default (FedAvg/FedProx) path."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from spherecal.spherefed.algorithms import (
    ABLATION,
    BASES,
    METHODS,
    RIVALS,
    FedAvg,
    FedProx,
    get_method,
    sphere_variant,
)
from spherecal.spherefed.calibrate import CCVRConfig
from spherecal.spherefed.calibration_suite import CALIBRATION_NAMES
from spherecal.spherefed.data import (
    SyntheticConfig,
    apply_feature_shift,
    load_dataset,
    load_synthetic,
)
from spherecal.spherefed.reference import (
    ReferenceConfig,
    prepare_data,
    run_federation,
    run_reference,
)

SYN = SyntheticConfig(num_classes=3, dim=6, train_per_class=24, test_per_class=8)
TINY = ReferenceConfig(
    dataset="synthetic",
    synthetic=SYN,
    participants=2,
    rounds=1,
    local_epochs=1,
    model="mlp",
    alpha=0.5,
    lr=0.05,
    ccvr=CCVRConfig(virtual_per_class=10, epochs=2),
)


def test_default_path_is_bit_identical_to_explicit_fedavg_and_fedprox() -> None:
    cfg = ReferenceConfig(
        participants=3,
        rounds=2,
        local_epochs=1,
        model="mlp",
        alpha=0.5,
        oracle_epochs=1,
        oracle_lrs=(0.1,),
        ccvr=CCVRConfig(virtual_per_class=10, epochs=2),
    )
    for config, strategy in (
        (cfg, FedAvg()),
        (replace(cfg, algorithm="fedprox", prox_mu=0.1), FedProx(mu=0.1)),
    ):
        ref = run_reference(config)
        explicit = run_federation(config, strategy=strategy)
        assert explicit["accuracy"] == ref["accuracy"]
        assert [r["test_accuracy"] for r in explicit["per_round"]] == [
            r["test_accuracy"] for r in ref["per_round"]
        ]
        assert [r["train_loss"] for r in explicit["per_round"]] == [
            r["train_loss"] for r in ref["per_round"]
        ]
        assert "method" not in ref and explicit["method"]["algorithm"] == strategy.name
        assert "synthetic" not in ref["settings"]  # default settings JSON unchanged


def _distinct_training_recipes() -> list[str]:
    """One method key per distinct training run (ablation cells duplicate some methods)."""
    seen, keys = set(), []
    for key, m in METHODS.items():
        ident = json.dumps([m.head, m.classifier, m.loss, m.describe()], sort_keys=True)
        if ident not in seen and key != "ce_fix_ou_norm_tau30":
            seen.add(ident)
            keys.append(key)
    return keys


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("key", _distinct_training_recipes())
def test_every_method_trains_and_calibrates(key: str) -> None:
    m = get_method(key)
    cfg = m.reference_config(TINY, lr=0.05)
    res = run_federation(
        cfg,
        strategy=m.strategy(cfg),
        objective=m.objective(),
        oracle=False,
        robust_calibration=True,
        describe=m.describe(m.temperature),
    )
    assert set(res["accuracy"]) == {"none", *CALIBRATION_NAMES}
    assert 0.0 <= res["accuracy"]["none"] <= 1.0
    assert res["method"]["algorithm"] == m.algorithm
    assert res["settings"]["head"] == m.head and res["settings"]["loss"] == m.loss


def test_method_registry_covers_the_papers() -> None:
    assert [m.key for m in BASES] == [
        "fedavg",
        "fedprox",
        "fednova",
        "fedadam",
        "fedyogi",
        "scaffold",
    ]
    assert {m.key for m in RIVALS} == {"babu", "fedfn", "feduv", "spherefed_ce", "spherefed"}
    assert get_method("babu").head == "fixed" and get_method("babu").classifier == "random"
    assert get_method("fedfn").head == "fn" and get_method("fedfn").loss == "ce"
    sphere = get_method("spherefed")
    assert (sphere.head, sphere.classifier, sphere.loss) == ("sphere", "orthonormal", "mse")
    assert get_method("spherefed_ce").temperature == 15.0
    # SphereFed Tab. 3: {CE, MSE} × {baseline, Fix (R), Fix (OU), Norm, Fix (OU) + Norm}
    grid = {(m.loss, m.head, m.classifier) for m in ABLATION if m.temperature == 1.0}
    assert len(grid) == 10
    assert ("mse", "fixed", "random") in grid and ("ce", "fn", "orthonormal") in grid
    assert sphere_variant(get_method("fednova")).algorithm == "fednova"
    with pytest.raises(ValueError, match="unknown method"):
        get_method("fedsgd")


def test_methods_describe_distinguishes_runs() -> None:
    a, b = get_method("fedavg"), get_method("ce_base")
    assert a.describe() == b.describe()  # same training run: cells are shared
    assert get_method("fedadam").describe() != get_method("fedyogi").describe()
    assert get_method("spherefed_ce").describe()["temperature"] == 15.0
    assert get_method("feduv").describe()["feduv"]["mu"] == 0.5


def test_synthetic_dataset_is_deterministic_on_the_sphere() -> None:
    a = load_synthetic(SYN, seed=3)
    b = load_dataset("synthetic", synthetic=SYN, seed=3)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    assert a.train.x.shape == (3 * 24, 6, 1, 1) and a.test.x.shape == (3 * 8, 6, 1, 1)
    assert np.bincount(a.test.y).tolist() == [8, 8, 8]
    # class means have unit norm: the empirical mean of a class is close to the sphere
    big = load_synthetic(replace(SYN, train_per_class=4000, noise=0.5), seed=0)
    for c in range(3):
        mean = big.train.x[big.train.y == c].reshape(-1, 6).mean(axis=0)
        assert abs(np.linalg.norm(mean) - 1.0) < 0.05
    assert not np.array_equal(load_synthetic(SYN, seed=4).train.x, a.train.x)
    with pytest.raises(ValueError):
        SyntheticConfig(num_classes=0)
    with pytest.raises(ValueError):
        SyntheticConfig(noise=-1.0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_feature_shift_is_per_participant() -> None:
    shifted_cfg = replace(TINY, synthetic=replace(SYN, feature_shift=2.0))
    plain, shifted = prepare_data(TINY), prepare_data(shifted_cfg)
    assert [p.tolist() for p in plain.parts] == [p.tolist() for p in shifted.parts]
    for k in range(2):
        diff = (shifted.participant(k).x - plain.participant(k).x).reshape(-1, 6)
        assert np.allclose(diff, diff[0], atol=1e-5)  # one offset per participant
        assert np.linalg.norm(diff[0]) == pytest.approx(2.0, rel=1e-5)
    d0 = (shifted.participant(0).x - plain.participant(0).x).reshape(-1, 6)[0]
    d1 = (shifted.participant(1).x - plain.participant(1).x).reshape(-1, 6)[0]
    assert not np.allclose(d0, d1)
    test_diff = (shifted.test.x - plain.test.x).reshape(len(plain.test), -1)
    assert np.allclose(np.linalg.norm(test_diff, axis=1), 2.0, rtol=1e-4)
    np.testing.assert_array_equal(shifted.test.y, plain.test.y)
    assert (
        run_reference(replace(shifted_cfg, oracle_epochs=1, oracle_lrs=(0.1,)))["settings"][
            "synthetic"
        ]["feature_shift"]
        == 2.0
    )
    with pytest.raises(ValueError, match="domains"):
        apply_feature_shift(plain.test, np.zeros(3, dtype=np.int64), np.zeros((1, 6)))


def test_reference_config_round_trips_synthetic_settings() -> None:
    data = TINY.to_json()
    assert data["synthetic"]["dim"] == 6
    again = ReferenceConfig(**{**data, "ccvr": TINY.ccvr})
    assert again.synthetic == SYN


def test_diverging_server_step_is_reported() -> None:
    m = get_method("fedadam")
    cfg = m.reference_config(replace(TINY, rounds=2), lr=0.05)
    huge = replace(m, fedopt_lr=1e300)
    with pytest.raises(FloatingPointError):
        run_federation(cfg, strategy=huge.strategy(cfg), oracle=False)
