"""FedAvg / FedProx on sums, state vectors, seeds, and the network wrapper."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spherecal.spherefed.fl import (
    LocalTrainConfig,
    aggregated_keys,
    count_correct,
    derive_seed,
    evaluate,
    load_state_vector,
    local_train,
    server_step,
    state_vector,
)
from spherecal.spherefed.network import ModelSpec, build_model, compute_features


def _spec(**kw: object) -> ModelSpec:
    base = {"extractor": "mlp", "feature_dim": 16, "num_classes": 4, "image_size": 8}
    base.update(kw)
    return ModelSpec(**base)  # type: ignore[arg-type]


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_derive_seed_is_stable_and_label_sensitive() -> None:
    # A fixed value: the service and the reference runner must agree forever.
    assert derive_seed(0, "train", 0, 0) == 9049802857590921173
    assert derive_seed(0, "train", 0, 0) != derive_seed(0, "train", 0, 1)
    assert derive_seed(0, "train", 1, 0) != derive_seed(1, "train", 1, 0)
    assert 0 <= derive_seed(123, "x") < 2**63


def test_build_model_is_deterministic_and_does_not_touch_global_rng() -> None:
    torch.manual_seed(99)
    before = torch.rand(1)
    torch.manual_seed(99)
    a = build_model(_spec(init_seed=5))
    after = torch.rand(1)
    assert torch.equal(before, after)
    b = build_model(_spec(init_seed=5))
    c = build_model(_spec(init_seed=6))
    np.testing.assert_array_equal(state_vector(a), state_vector(b))
    assert not np.array_equal(state_vector(a), state_vector(c))


def test_state_vector_excludes_fixed_classifier_and_roundtrips() -> None:
    model = build_model(_spec(head="sphere"))
    keys = aggregated_keys(model)
    assert not any(k.endswith("fixed_weight") for k in keys)
    vec = state_vector(model)
    assert vec.dtype == np.float64
    assert vec.size == sum(p.numel() for p in model.parameters())
    load_state_vector(model, vec + 1.0)
    np.testing.assert_allclose(state_vector(model), vec + 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="entries"):
        load_state_vector(model, vec[:-1])
    bad = vec.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        load_state_vector(model, bad)
    learnable = build_model(_spec(head="learnable"))
    assert "head.linear.weight" in aggregated_keys(learnable)


def test_batchnorm_running_stats_are_aggregated_but_not_counters() -> None:
    model = build_model(_spec(extractor="digits_cnn", norm="batch", feature_dim=None))
    keys = aggregated_keys(model)
    assert any(k.endswith("running_mean") for k in keys)
    assert not any(k.endswith("num_batches_tracked") for k in keys)


def test_local_train_is_seeded() -> None:
    x, y = _data(40, 0)
    cfg = LocalTrainConfig(epochs=1, batch_size=8, lr=0.05)
    outs = []
    for seed in (1, 1, 2):
        model = build_model(_spec())
        outs.append(local_train(model, x, y, cfg, seed=seed))
    np.testing.assert_array_equal(outs[0].weighted_delta, outs[1].weighted_delta)
    assert not np.array_equal(outs[0].weighted_delta, outs[2].weighted_delta)
    assert outs[0].num_samples == 40 and outs[0].num_steps == 5


def test_server_step_on_sums_equals_weighted_average_of_client_models() -> None:
    cfg = LocalTrainConfig(epochs=1, batch_size=4, lr=0.05)
    model = build_model(_spec())
    start = state_vector(model)
    finals, sizes, delta_sum, weight_sum = [], [], np.zeros_like(start), 0
    for k, n in enumerate((10, 30, 3)):
        load_state_vector(model, start)
        x, y = _data(n, k)
        upd = local_train(model, x, y, cfg, seed=k)
        finals.append(state_vector(model))
        sizes.append(n)
        delta_sum += upd.weighted_delta
        weight_sum += upd.num_samples
    expected = sum(n * f for n, f in zip(sizes, finals, strict=True)) / sum(sizes)
    np.testing.assert_allclose(server_step(start, delta_sum, weight_sum), expected, atol=1e-6)
    with pytest.raises(ValueError, match="weight sum is 0"):
        server_step(start, delta_sum, 0)
    with pytest.raises(ValueError, match="entries"):
        server_step(start, delta_sum[:-1], 1)


def test_fedprox_term_pulls_towards_global_model() -> None:
    x, y = _data(64, 3)
    norms = {}
    for mu in (0.0, 10.0):
        model = build_model(_spec())
        cfg = LocalTrainConfig(epochs=3, batch_size=8, lr=0.05, prox_mu=mu, momentum=0.0)
        norms[mu] = np.linalg.norm(local_train(model, x, y, cfg, seed=0).weighted_delta)
    assert norms[10.0] < 0.5 * norms[0.0]


def test_empty_participant_and_bad_config() -> None:
    model = build_model(_spec())
    upd = local_train(
        model, torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long), LocalTrainConfig(), seed=0
    )
    assert upd.num_samples == 0 and not upd.weighted_delta.any()
    with pytest.raises(ValueError, match="lr"):
        LocalTrainConfig(lr=0.0)
    with pytest.raises(ValueError, match="unknown loss"):
        LocalTrainConfig(loss="hinge")


def test_divergence_is_reported() -> None:
    x, y = _data(16, 0)
    model = build_model(_spec(head="learnable"))
    cfg = LocalTrainConfig(epochs=3, batch_size=4, lr=1e12, loss="ce")
    with pytest.raises(FloatingPointError, match="diverged"):
        local_train(model, x * 1e6, y, cfg, seed=0)


def test_evaluate_and_features() -> None:
    model = build_model(_spec(head="sphere"))
    x, y = _data(20, 1)
    pred = model(x).argmax(1)
    assert evaluate(model, x, pred) == 1.0
    assert evaluate(model, x, (pred + 1) % 4) == 0.0
    assert count_correct(model, x, pred, batch_size=3) == 20
    assert count_correct(model, x[:0], pred[:0]) == 0
    z_np = compute_features(model, x, batch_size=7)
    assert z_np.dtype == np.float64 and z_np.shape == (20, 16)
    np.testing.assert_allclose(z_np, model.features(x).detach().double().numpy(), atol=1e-6)
    assert compute_features(model, x[:0]).shape == (0, 16)
    z = model.features(x)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(20))
    assert model.feature_dim == 16 and model.num_classes == 4


def test_classifier_swapped_restores_even_on_error() -> None:
    from spherecal.spherefed.network import classifier_swapped

    model = build_model(_spec(head="sphere"))
    before = model.head.weight.detach().clone()
    with classifier_swapped(model, np.zeros((4, 16))):
        assert not model.head.weight.any()
    torch.testing.assert_close(model.head.weight, before)
    with pytest.raises(RuntimeError), classifier_swapped(model, np.ones((4, 16))):
        raise RuntimeError("boom")
    torch.testing.assert_close(model.head.weight, before)
    with classifier_swapped(model, None):
        torch.testing.assert_close(model.head.weight, before)


def test_model_seeds_are_the_documented_derivation() -> None:
    from spherecal.spherefed.fl import model_seeds

    assert model_seeds(3) == (derive_seed(3, "classifier") % 2**32, derive_seed(3, "init"))
    assert model_seeds(3) != model_seeds(4)
