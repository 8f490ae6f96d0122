"""Base algorithms on sums: FedNova, FedOpt (Adam/Yogi), SCAFFOLD against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spherecal.spherefed.algorithms import (
    FedAdam,
    FedAvg,
    FedNova,
    FedOpt,
    FedProx,
    FedYogi,
    Scaffold,
    add_payloads,
    as_payload,
    fedavg_local_step,
    fednova_local_step,
    fednova_norm,
    fednova_server_step,
    fedopt_update,
    make_strategy,
    parameter_mask,
    scaffold_control_update,
    scaffold_local_step,
    scaffold_server_step,
    sum_payloads,
)
from spherecal.spherefed.fl import (
    LocalTrainConfig,
    aggregated_keys,
    load_state_vector,
    local_train,
    server_step,
    state_vector,
)
from spherecal.spherefed.network import ModelSpec, build_model


def _spec(**kw: object) -> ModelSpec:
    base = {"extractor": "mlp", "feature_dim": 8, "num_classes": 3, "image_size": 4}
    base.update(kw)
    return ModelSpec(**base)  # type: ignore[arg-type]


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 4, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


# ----------------------------------------------------------------------------- payloads


def test_payload_sums_are_entrywise_and_strict() -> None:
    a = as_payload(delta=np.array([1.0, 2.0]), weight=3)
    b = as_payload(delta=np.array([0.5, -2.0]), weight=1)
    total = sum_payloads([a, b])
    np.testing.assert_array_equal(total["delta"], [1.5, 0.0])
    assert float(total["weight"]) == 4.0
    assert a["delta"][0] == 1.0  # inputs untouched
    with pytest.raises(ValueError, match="keys"):
        add_payloads(a, as_payload(delta=np.zeros(2)))
    with pytest.raises(ValueError, match="shape"):
        add_payloads(a, as_payload(delta=np.zeros(3), weight=1))


def test_fedavg_strategy_is_the_reference_server_step() -> None:
    x = np.array([1.0, -1.0, 0.5])
    sums = as_payload(delta=np.array([3.0, 0.0, -6.0]), weight=3)
    out = FedAvg().server_step(x, sums, num_selected=2)
    np.testing.assert_array_equal(out, server_step(x, sums["delta"], 3))
    np.testing.assert_allclose(out, [2.0, -1.0, -1.5])
    with pytest.raises(ValueError, match="weight sum is 0"):
        FedAvg().server_step(x, as_payload(delta=np.zeros(3), weight=0), num_selected=1)
    with pytest.raises(ValueError, match="missing"):
        FedAvg().server_step(x, as_payload(delta=np.zeros(3)), num_selected=1)


def test_fedavg_local_step_payload_matches_local_train() -> None:
    x, y = _data(20, 0)
    cfg = LocalTrainConfig(epochs=1, batch_size=4, lr=0.05, loss="ce")
    m1, m2 = build_model(_spec()), build_model(_spec())
    res = fedavg_local_step(m1, x, y, cfg, seed=3)
    upd = local_train(m2, x, y, cfg, seed=3)
    np.testing.assert_array_equal(res.payload["delta"], upd.weighted_delta)
    assert float(res.payload["weight"]) == 20 and res.num_steps == upd.num_steps == 5


def test_fedprox_strategy_uses_its_mu() -> None:
    x, y = _data(32, 1)
    cfg = LocalTrainConfig(epochs=2, batch_size=8, lr=0.1, loss="ce", momentum=0.0)
    plain = FedAvg().local_step(build_model(_spec()), x, y, cfg, seed=0, broadcast={})
    prox = FedProx(mu=5.0).local_step(build_model(_spec()), x, y, cfg, seed=0, broadcast={})
    assert np.linalg.norm(prox.payload["delta"]) < 0.5 * np.linalg.norm(plain.payload["delta"])
    with pytest.raises(ValueError):
        FedProx(mu=-1.0)


# ----------------------------------------------------------------------------- FedNova


def test_fednova_norm_by_hand() -> None:
    assert fednova_norm(7) == 7.0  # plain SGD: ‖a‖₁ = τ
    # momentum 0.5, 3 steps: Σ_t (1 − 0.5^t)/(1 − 0.5) = (0.5 + 0.75 + 0.875)/0.5
    assert fednova_norm(3, momentum=0.5) == pytest.approx(4.25)
    # proximal, ημ = 0.1, 3 steps: (1 − 0.9³)/0.1
    assert fednova_norm(3, lr=0.1, prox_mu=1.0) == pytest.approx(2.71)
    assert fednova_norm(0, momentum=0.9) == 0.0
    with pytest.raises(ValueError):
        fednova_norm(-1)


def test_fednova_server_step_with_unequal_local_steps_by_hand() -> None:
    x = np.zeros(2)
    # client 1: 1 local step moved it by (2, 0); client 2: 3 steps moved it by (0, 6).
    c1 = as_payload(delta=np.array([2.0, 0.0]) / 1, tau=1 * 1, weight=1)
    c2 = as_payload(delta=np.array([0.0, 6.0]) / 3, tau=1 * 3, weight=1)
    new = FedNova().server_step(x, sum_payloads([c1, c2]), num_selected=2)
    # normalised updates (2,0) and (0,2), average (1,1), τ_eff = (1+3)/2 = 2  ->  (2, 2);
    # FedAvg would have given (1, 3): client 2 dominates only because it ran longer.
    np.testing.assert_allclose(new, [2.0, 2.0])
    # sample weights n = (1, 3): p = (1/4, 3/4); Σ p d = (0.5, 1.5); τ_eff = 1/4 + 9/4 = 2.5
    c2w = as_payload(delta=3 * np.array([0.0, 6.0]) / 3, tau=3 * 3, weight=3)
    new_w = fednova_server_step(x, sum_payloads([c1, c2w]))
    np.testing.assert_allclose(new_w, [1.25, 3.75])


def test_fednova_local_payload_and_equal_steps_reduce_to_fedavg() -> None:
    cfg = LocalTrainConfig(epochs=1, batch_size=4, lr=0.05, loss="ce", momentum=0.0)
    start_model = build_model(_spec())
    start = state_vector(start_model)
    payloads, avg_payloads = [], []
    for k, n in enumerate((8, 20)):  # 2 and 5 local steps
        model = build_model(_spec())
        x, y = _data(n, k)
        res = fednova_local_step(model, x, y, cfg, seed=k)
        delta = state_vector(model) - start
        assert res.num_steps == n // 4
        np.testing.assert_allclose(res.payload["delta"], n * delta / res.num_steps, atol=1e-6)
        assert float(res.payload["tau"]) == n * res.num_steps
        payloads.append(res.payload)
        avg_payloads.append(as_payload(delta=n * delta, weight=n))
    nova = FedNova().server_step(start, sum_payloads(payloads), num_selected=2)
    avg = FedAvg().server_step(start, sum_payloads(avg_payloads), num_selected=2)
    assert not np.allclose(nova, avg)  # unequal τ: FedNova differs from FedAvg
    # equal local steps: identical to FedAvg
    eq = [
        as_payload(delta=p["delta"], tau=float(p["weight"]) * 3, weight=p["weight"])
        for p in (
            as_payload(delta=np.array([3.0, 0.0]), weight=1),
            as_payload(delta=np.array([0.0, 9.0]), weight=2),
        )
    ]
    fedavg_eq = np.zeros(2) + np.array([3.0 * 3, 9.0 * 3]) / 3
    np.testing.assert_allclose(
        FedNova().server_step(np.zeros(2), sum_payloads(eq), num_selected=2), fedavg_eq
    )


# ----------------------------------------------------------------------------- FedOpt


def test_fedopt_adam_and_yogi_two_steps_by_hand() -> None:
    x0 = np.array([1.0])
    d = np.array([0.1])
    tau, lr = 1e-3, 0.01
    m0, v0 = np.zeros(1), np.full(1, tau**2)
    # step 1: m = 0.1·0.1 = 0.01; Adam v = 0.99·1e-6 + 0.01·0.01; Yogi v = 1e-6 + 0.01·0.01
    xa, ma, va = fedopt_update(x0, d, m0, v0, variant="adam", lr=lr, tau=tau)
    xy, my, vy = fedopt_update(x0, d, m0, v0, variant="yogi", lr=lr, tau=tau)
    assert ma[0] == pytest.approx(0.01) and my[0] == pytest.approx(0.01)
    assert va[0] == pytest.approx(0.99e-6 + 1e-4, rel=1e-12)
    assert vy[0] == pytest.approx(1e-6 + 1e-4, rel=1e-12)
    assert xa[0] == pytest.approx(1.0 + 0.01 * 0.01 / (math.sqrt(0.99e-6 + 1e-4) + 1e-3))
    assert xy[0] == pytest.approx(1.0 + 0.01 * 0.01 / (math.sqrt(1.01e-4) + 1e-3))
    # step 2 (same Δ): m = 0.9·0.01 + 0.1·0.1 = 0.019
    # Adam v = 0.99·v1 + 1e-4; Yogi v1 < Δ² so v = v1 + 0.01·Δ² = 2.01e-4
    xa2, ma2, va2 = fedopt_update(xa, d, ma, va, variant="adam", lr=lr, tau=tau)
    xy2, _, vy2 = fedopt_update(xy, d, my, vy, variant="yogi", lr=lr, tau=tau)
    assert ma2[0] == pytest.approx(0.019)
    assert va2[0] == pytest.approx(0.99 * (0.99e-6 + 1e-4) + 1e-4, rel=1e-12)
    assert vy2[0] == pytest.approx(2.01e-4, rel=1e-12)
    assert xy2[0] == pytest.approx(xy[0] + 0.01 * 0.019 / (math.sqrt(2.01e-4) + 1e-3))
    # Yogi shrinks v additively when v > Δ²: v = 1 − 0.01·0.01
    _, _, v_big = fedopt_update(x0, d, m0, np.ones(1), variant="yogi", lr=lr, tau=tau)
    assert v_big[0] == pytest.approx(0.9999)
    # Adagrad accumulates
    _, _, v_ada = fedopt_update(x0, d, m0, v0, variant="adagrad", lr=lr, tau=tau)
    assert v_ada[0] == pytest.approx(1e-6 + 0.01)
    with pytest.raises(ValueError, match="variant"):
        fedopt_update(x0, d, m0, v0, variant="sgd")


def test_fedopt_strategy_uses_the_fedavg_average_and_resumes_from_state() -> None:
    x = np.array([1.0, 0.0])
    sums = as_payload(delta=np.array([0.3, -0.6]), weight=3)  # average Δ = (0.1, -0.2)
    adam = FedAdam()
    x1 = adam.server_step(x, sums, num_selected=2)
    ref, _, _ = fedopt_update(x, np.array([0.1, -0.2]), np.zeros(2), np.full(2, 1e-6))
    np.testing.assert_allclose(x1, ref)
    x2 = adam.server_step(x1, sums, num_selected=2)
    # resume: a fresh object with the state after step 1 makes the same step 2
    fresh = FedAdam()
    fresh_first = FedAdam()
    fresh_first.server_step(x, sums, num_selected=2)
    fresh.load_state_dict(fresh_first.state_dict())
    np.testing.assert_array_equal(fresh.server_step(x1, sums, num_selected=2), x2)
    assert fresh.steps == 2
    yogi = FedYogi(lr=0.1)
    assert yogi.hyperparameters()["variant"] == "yogi"
    assert not np.allclose(yogi.server_step(x, sums, num_selected=2), x1)
    with pytest.raises(ValueError):
        FedOpt(variant="nope")
    with pytest.raises(ValueError, match="keys"):
        FedAdam().load_state_dict({"m": None})


# ----------------------------------------------------------------------------- SCAFFOLD


def test_scaffold_control_update_and_server_step_by_hand() -> None:
    ck = np.array([1.0, 0.0])
    c = np.array([0.5, 0.5])
    delta = np.array([-0.2, 0.2])  # y − x after K = 2 steps of lr 0.1
    # c_k⁺ = c_k − c + (x − y)/(Kη) = (1, 0) − (0.5, 0.5) + (0.2, −0.2)/0.2 = (1.5, −1.5)
    new_ck = scaffold_control_update(ck, c, delta, lr=0.1, effective_steps=2)
    np.testing.assert_allclose(new_ck, [1.5, -1.5])
    sums = as_payload(delta=np.array([2.0, 4.0]), weight=2, control_delta=np.array([1.0, -1.0]))
    x, c_new = scaffold_server_step(np.zeros(2), np.zeros(2), sums, num_participants=4)
    np.testing.assert_allclose(x, [1.0, 2.0])
    np.testing.assert_allclose(c_new, [0.25, -0.25])  # Σ Δc / N with N = 4


def test_scaffold_local_step_applies_correction_and_recovers_the_raw_gradient() -> None:
    """With a loss whose gradient is zero, local SGD moves only by −ηK(c − c_k), and the
    new control variate is the average raw gradient: exactly 0."""

    def zero_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return sum(p.sum() for p in model.parameters()) * 0.0  # type: ignore[return-value]

    model = build_model(_spec())
    keys = aggregated_keys(model)
    start = state_vector(model, keys)
    rng = np.random.default_rng(0)
    c = rng.standard_normal(start.size) * 0.1
    ck = rng.standard_normal(start.size) * 0.1
    x, y = _data(12, 0)
    cfg = LocalTrainConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.0, loss="ce")
    res = scaffold_local_step(
        model, x, y, cfg, seed=0, server_control=c, client_control=ck, objective=zero_loss
    )
    assert res.num_steps == 3
    np.testing.assert_allclose(state_vector(model, keys) - start, -0.1 * 3 * (c - ck), atol=1e-6)
    assert res.client_state is not None
    np.testing.assert_allclose(res.client_state["control"], 0.0, atol=1e-5)
    np.testing.assert_allclose(res.payload["control_delta"], -ck, atol=1e-5)
    np.testing.assert_allclose(res.payload["delta"], 12 * (-0.3) * (c - ck), atol=1e-5)


def test_scaffold_strategy_round_trip_and_state() -> None:
    model = build_model(_spec())
    keys = aggregated_keys(model)
    x0 = state_vector(model, keys)
    strat = Scaffold()
    cfg = LocalTrainConfig(epochs=1, batch_size=4, lr=0.05, loss="ce")
    bcast = strat.broadcast(x0)
    assert not bcast["control"].any()
    states, payloads = {}, []
    for k, n in enumerate((8, 12)):
        load_state_vector(model, x0, keys)
        xk, yk = _data(n, k)
        res = strat.local_step(model, xk, yk, cfg, seed=k, broadcast=bcast)
        assert res.client_state is not None
        states[k] = res.client_state
        payloads.append(res.payload)
    sums = sum_payloads(payloads)
    x1 = strat.server_step(x0, sums, num_selected=2)
    np.testing.assert_allclose(x1, x0 + sums["delta"] / 20)
    np.testing.assert_allclose(strat.broadcast(x1)["control"], sums["control_delta"] / 2)
    restored = Scaffold()
    restored.load_state_dict(strat.state_dict())
    np.testing.assert_array_equal(restored.broadcast(x1)["control"], strat.broadcast(x1)["control"])
    with pytest.raises(ValueError, match="control"):
        strat.local_step(model, xk, yk, cfg, seed=0, broadcast={})


def test_control_variates_skip_buffers() -> None:
    model = build_model(_spec(extractor="digits_cnn", norm="batch", image_size=4))
    keys = aggregated_keys(model)
    mask = parameter_mask(model, keys)
    state = model.state_dict()
    offset = 0
    for k in keys:
        size = state[k].numel()
        expected = 0.0 if "running" in k else 1.0
        assert (mask[offset : offset + size] == expected).all(), k
        offset += size
    assert 0 < mask.sum() < mask.size


def test_make_strategy() -> None:
    assert make_strategy("fednova").name == "fednova"
    assert make_strategy("fedadam", lr=0.1).hyperparameters()["lr"] == 0.1
    with pytest.raises(ValueError, match="unknown algorithm"):
        make_strategy("fedsgd")
    with pytest.raises(TypeError):
        make_strategy("fedavg", 1)  # type: ignore[call-arg]
