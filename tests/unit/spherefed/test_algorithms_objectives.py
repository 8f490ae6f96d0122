"""FedUV's regularisers (Eq. 1–4) and CE with a temperature, against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spherecal.spherefed.algorithms import (
    FedUVConfig,
    feduv_objective,
    feduv_uniformity_loss,
    feduv_variance_constant,
    feduv_variance_loss,
    temperature_objective,
)
from spherecal.spherefed.fl import LocalTrainConfig, local_train
from spherecal.spherefed.heads import make_head
from spherecal.spherefed.network import ModelSpec, build_model


def test_variance_constant_from_the_identity_matrix() -> None:
    # Column j of I_D is one 1 and D−1 zeros: mean 1/D.
    # Unbiased Var = [(1 − 1/D)² + (D−1)/D²]/(D − 1) = 1/D  ->  c = 1/√D.
    for d in (2, 4, 10, 100):
        assert feduv_variance_constant(d) == pytest.approx(1 / math.sqrt(d), rel=1e-12)
    # Population Var = (D−1)/D²  ->  c = √(D−1)/D  (0.3 for D = 10).
    assert feduv_variance_constant(10, unbiased=False) == pytest.approx(0.3, rel=1e-12)
    assert feduv_variance_constant(4, unbiased=False) == pytest.approx(math.sqrt(3) / 4)
    with pytest.raises(ValueError):
        feduv_variance_constant(1)


def test_variance_hinge_is_zero_for_an_ideal_batch_and_c_for_a_uniform_one() -> None:
    d = 10
    c = feduv_variance_constant(d)
    ideal = 100.0 * torch.eye(d, dtype=torch.float64)  # balanced and confident: P ≈ I
    assert float(feduv_variance_loss(ideal, c, eps=0.0)) == pytest.approx(0.0, abs=1e-12)
    uniform = torch.zeros(d, d, dtype=torch.float64)  # every column constant: std 0
    assert float(feduv_variance_loss(uniform, c, eps=0.0)) == pytest.approx(c)
    # a collapsed batch (everything predicted as class 0) is penalised almost fully
    collapsed = torch.zeros(6, d, dtype=torch.float64)
    collapsed[:, 0] = 50.0
    assert float(feduv_variance_loss(collapsed, c)) > 0.9 * c
    assert float(feduv_variance_loss(torch.zeros(1, d), c)) == 0.0  # one sample: no variance


def test_uniformity_by_hand_and_scale_invariance() -> None:
    # Points 0, 1, 3 on a line: squared distances 1, 9, 4; σ = median = 4.
    pts = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    expected = (math.exp(-1 / 8) + math.exp(-9 / 8) + math.exp(-4 / 8)) / 3
    assert float(feduv_uniformity_loss(pts)) == pytest.approx(expected, rel=1e-12)
    assert float(feduv_uniformity_loss(7.0 * pts)) == pytest.approx(expected, rel=1e-12)
    two = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    assert float(feduv_uniformity_loss(two)) == pytest.approx(math.exp(-0.5))
    # coincident points: finite gradient (no sqrt at 0)
    same = torch.ones(4, 3, requires_grad=True)
    feduv_uniformity_loss(same).backward()
    assert same.grad is not None and torch.isfinite(same.grad).all()


def test_feduv_objective_composes_eq1_with_default_weights() -> None:
    model = build_model(
        ModelSpec(extractor="mlp", head="learnable", feature_dim=8, num_classes=10, image_size=4)
    )
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 4, 4, generator=g), torch.randint(0, 10, (16,), generator=g)
    h = model.extractor(x)
    logits = model.head(h)
    c = 1 / math.sqrt(10)
    expected = (
        F.cross_entropy(logits, y)
        + 0.5 * feduv_uniformity_loss(h)
        + (10 / 4) * feduv_variance_loss(logits, c)
    )
    got = feduv_objective(10)(model, x, y).detach()
    assert float(got) == pytest.approx(float(expected.detach()), rel=1e-6)
    plain = feduv_objective(10, FedUVConfig(mu=0.0, lam=0.0))(model, x, y)
    ce = F.cross_entropy(logits, y).detach()
    assert float(plain.detach()) == pytest.approx(float(ce), rel=1e-6)
    assert FedUVConfig().weight_variance(100) == 25.0
    with pytest.raises(TypeError):
        feduv_objective(10)(torch.nn.Linear(2, 2), x, y)
    with pytest.raises(ValueError):
        FedUVConfig(mu=-1.0)


def test_feduv_trains_through_local_train() -> None:
    model = build_model(
        ModelSpec(extractor="mlp", head="learnable", feature_dim=8, num_classes=3, image_size=4)
    )
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 1, 4, 4, generator=g), torch.randint(0, 3, (24,), generator=g)
    upd = local_train(
        model,
        x,
        y,
        LocalTrainConfig(epochs=1, batch_size=8, lr=0.05),
        seed=0,
        objective=feduv_objective(3),
    )
    assert upd.num_steps == 3 and np.isfinite(upd.weighted_delta).all() and upd.mean_loss > 0


def test_temperature_objective_scales_cosine_logits() -> None:
    model = build_model(ModelSpec(extractor="mlp", feature_dim=8, num_classes=3, image_size=4))
    x, y = torch.randn(5, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1])
    with torch.no_grad():
        logits = model(x)
        assert float(logits.abs().max()) <= 1.0 + 1e-6  # sphere head: cosines
        for tau in (1.0, 15.0):
            got = temperature_objective("ce", tau)(model, x, y)
            assert float(got) == pytest.approx(float(F.cross_entropy(tau * logits, y)), rel=1e-6)
    with pytest.raises(ValueError, match="CE"):
        temperature_objective("mse", 2.0)
    with pytest.raises(ValueError):
        temperature_objective("ce", 0.0)


def test_fixed_head_keeps_raw_features_and_a_frozen_classifier() -> None:
    head = make_head("fixed", feature_dim=6, num_classes=3, classifier="random", classifier_seed=1)
    h = torch.randn(4, 6) * 5
    assert torch.equal(head.features(h), h)
    assert not any(p.requires_grad for p in head.parameters())
    model = build_model(
        ModelSpec(
            extractor="mlp",
            head="fixed",
            classifier="orthonormal",
            feature_dim=8,
            num_classes=3,
            image_size=4,
        )
    )
    assert "head.fixed_weight" in model.state_dict()
    from spherecal.spherefed.fl import aggregated_keys

    assert not any(k.startswith("head") for k in aggregated_keys(model))
