"""The reference runner: determinism, result schema, exactness of its calibration."""

from __future__ import annotations

import numpy as np
import pytest

from spherecal.spherefed.reference import (
    ReferenceConfig,
    prepare_data,
    run_reference,
    run_reference_sweep,
    select_participants,
)

TINY = ReferenceConfig(
    participants=3, rounds=2, local_epochs=1, model="mlp", alpha=0.5, oracle_epochs=2
)


def test_same_config_same_result_and_schema() -> None:
    messages: list[str] = []
    a = run_reference(TINY, progress=messages.append)
    b = run_reference(TINY)
    for key in ("none", "ffc", "ccvr", "oracle"):
        assert 0.0 <= a["accuracy"][key] <= 1.0
        assert a["accuracy"][key] == b["accuracy"][key]
    assert [r["test_accuracy"] for r in a["per_round"]] == [
        r["test_accuracy"] for r in b["per_round"]
    ]
    assert a["settings"]["participants"] == 3 and a["settings"]["alpha"] == 0.5
    assert len(a["per_round"]) == 2
    assert any(m.startswith("round 2/2") for m in messages)
    assert sum(a["partition"]["sizes"]) == len(prepare_data(TINY).train)


def test_different_seed_changes_the_run() -> None:
    a = run_reference(TINY)
    b = run_reference(ReferenceConfig(**{**TINY.to_json(), "ccvr": TINY.ccvr, "seed": 1}))
    assert a["partition"]["sizes"] != b["partition"]["sizes"]


def test_data_is_split_once_and_partitioned_exactly() -> None:
    data = prepare_data(TINY)
    everything = np.concatenate(data.parts)
    assert np.array_equal(np.sort(everything), np.arange(len(data.train)))
    assert len(data.validation) > 0 and len(data.test) > 0


def test_participant_sampling() -> None:
    cfg = ReferenceConfig(participants=10, sample_fraction=0.3)
    picks = [select_participants(cfg, r) for r in range(5)]
    assert all(len(p) == 3 and p == sorted(set(p)) for p in picks)
    assert picks == [select_participants(cfg, r) for r in range(5)]
    assert len({tuple(p) for p in picks}) > 1
    assert select_participants(TINY, 0) == [0, 1, 2]


def test_sweep_selects_on_validation_and_reports_every_lr() -> None:
    res = run_reference_sweep(TINY, [0.01, 0.1], select_by="ffc")
    assert [s["lr"] for s in res["lr_sweep"]] == [0.01, 0.1]
    best = max(res["lr_sweep"], key=lambda s: s["validation_accuracy"]["ffc"])
    assert res["selected"] == {"lr": best["lr"], "by": "validation_accuracy.ffc"}
    with pytest.raises(ValueError, match="select_by"):
        run_reference_sweep(TINY, [0.1], select_by="test")


def test_invalid_config_is_refused() -> None:
    with pytest.raises(ValueError, match="algorithm"):
        ReferenceConfig(algorithm="sgd")
    with pytest.raises(ValueError, match="participants"):
        ReferenceConfig(participants=0)


def test_closed_form_calibrators_are_chosen_on_validation() -> None:
    cfg = ReferenceConfig(
        participants=3,
        rounds=2,
        local_epochs=1,
        model="mlp",
        alpha=0.5,
        calibrations=("ffc", "ffc_bias", "lda", "qda"),
        ridge_grid=(0.0, 1.0),
        shrinkage_grid=(0.0, 0.1, 0.5),
    )
    res = run_reference(cfg)
    assert "ccvr" not in res["accuracy"]  # not asked for: not run, not reported
    for name, grid in (
        ("ffc_bias", [0.0, 1.0]),
        ("lda", [0.0, 0.1, 0.5]),
        ("qda", [0.0, 0.1, 0.5]),
    ):
        info = res["calibration"][name]
        assert [g["value"] for g in info["grid"]] == grid
        scores = [g["validation"] for g in info["grid"]]
        # the chosen value is the first best *validation* score: test never decides
        assert info["chosen"] == grid[scores.index(max(scores))]
        assert res["validation_accuracy"][name] == max(scores)
        assert 0.0 <= res["accuracy"][name] <= 1.0
    assert res["settings"]["calibrations"] == ["ffc", "ffc_bias", "lda", "qda"]


def test_bad_calibration_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="calibrations"):
        ReferenceConfig(calibrations=("ffc", "svm"))
    with pytest.raises(ValueError, match="shrinkage_grid"):
        ReferenceConfig(shrinkage_grid=(0.0, 2.0))
    with pytest.raises(ValueError, match="ridge_grid"):
        ReferenceConfig(ridge_grid=())
    with pytest.raises(ValueError, match="samples"):
        ReferenceConfig(samples=100)  # digits has a fixed size


def test_secure_sum_gives_the_float_sums_calibrations() -> None:
    """Every calibrator from the statistics summed by the real in-process secure-
    aggregation protocol (service fixed-point scale) = the float64 sum's, to the
    fixed-point precision: the same predictions, hence the same accuracies."""
    cfg = ReferenceConfig(
        participants=3,
        rounds=1,
        local_epochs=1,
        model="mlp",
        alpha=0.5,
        ridge_grid=(0.0, 1.0),
        shrinkage_grid=(0.0, 0.1),
        oracle_lrs=(0.1,),
        oracle_epochs=1,
    )
    plain = run_reference(cfg)
    secure = run_reference(ReferenceConfig(**{**cfg.__dict__, "secure_sum": True}))
    assert secure["settings"]["secure_sum"] is True and "secure_sum" not in plain["settings"]
    for name in ("ffc", "ccvr", "ffc_bias", "lda", "qda"):
        assert secure["accuracy"][name] == plain["accuracy"][name], name
        assert secure["validation_accuracy"][name] == plain["validation_accuracy"][name], name
    for name in ("ffc_bias", "lda", "qda"):
        assert secure["calibration"][name]["chosen"] == plain["calibration"][name]["chosen"]
