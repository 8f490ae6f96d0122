"""DP-SGD through Opacus: the fixed classifier is untouched, ε matches the accountant."""

from __future__ import annotations

import pytest
import torch
from opacus.accountants import RDPAccountant

from spherecal.spherefed.network import ModelSpec, build_model
from spherecal.spherefed.privacy.dpsgd import (
    DPSGDConfig,
    UnsupportedModel,
    dp_local_train,
    empty_batch_gradients,
)


def tiny(norm: str = "group") -> torch.nn.Module:
    spec = ModelSpec(
        extractor="digits_cnn",
        head="sphere",
        norm=norm,
        classifier="orthonormal",
        classifier_seed=0,
        init_seed=0,
        num_classes=4,
        in_channels=1,
        image_size=(8, 8),
    )
    return build_model(spec)


def data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_trains_the_extractor_only_and_reports_opacus_epsilon() -> None:
    model = tiny()
    head = model.head
    assert isinstance(head, torch.nn.Module) and isinstance(head.weight, torch.Tensor)
    fixed = head.weight.detach().clone()
    before = [p.detach().clone() for p in model.parameters()]
    x, y = data()
    r = dp_local_train(model, x, y, DPSGDConfig(epochs=1, batch_size=16, noise_multiplier=1.0))
    assert torch.equal(head.weight, fixed)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    acc = RDPAccountant()
    acc.history = [(1.0, r.sample_rate, r.steps)]
    assert r.epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert r.charge.epsilon <= r.epsilon + 1e-9  # same curve, more orders
    assert r.charge.epsilon == pytest.approx(r.epsilon, rel=1e-3)
    assert r.charge.mechanism == "dpsgd" and r.sample_rate == pytest.approx(0.25)


def test_target_epsilon_is_met() -> None:
    model = tiny()
    x, y = data()
    cfg = DPSGDConfig(epochs=1, batch_size=16, noise_multiplier=None, target_epsilon=5.0)
    r = dp_local_train(model, x, y, cfg)
    assert r.epsilon <= 5.0 + 1e-6 and r.noise_multiplier > 0


def test_batchnorm_is_refused() -> None:
    with pytest.raises(UnsupportedModel):
        dp_local_train(tiny("batch"), *data(), DPSGDConfig())
    with pytest.raises(ValueError):
        DPSGDConfig(noise_multiplier=None, target_epsilon=None)


def test_an_empty_poisson_batch_is_a_noised_step() -> None:
    """Batch size 1 on 64 examples samples each example at q = 1/64 a step, so a step
    draws no example with probability (1 − q)^64 ≈ 0.37, and one of the 64 steps of
    the epoch does with probability 1 − 1e-13. Such a step still adds its noise and
    counts for the accountant; it used to end the round with Opacus's "Per sample
    gradient is not initialized" (a ValueError), so any site training with a small
    batch failed its rounds."""
    torch.manual_seed(0)
    model = tiny()
    x, y = data(64)
    r = dp_local_train(model, x, y, DPSGDConfig(epochs=1, batch_size=1, noise_multiplier=1.0))
    assert r.steps == 64 and r.sample_rate == pytest.approx(1 / 64)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    acc = RDPAccountant()
    acc.history = [(1.0, r.sample_rate, r.steps)]
    assert r.epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_an_empty_batch_step_moves_the_model_by_noise_alone() -> None:
    """The step for an empty batch is noise: with σ = 0 it leaves the model as it
    was, with σ > 0 it moves it (Opacus adds N(0, σ²C²) to the zero sum)."""
    from opacus import PrivacyEngine

    for sigma, moves in ((0.0, False), (1.0, True)):
        torch.manual_seed(0)
        model = tiny()
        before = [p.detach().clone() for p in model.parameters()]
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=0.1)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data(4)))
        engine = PrivacyEngine(accountant="rdp")
        _, optimizer, _ = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=1.0,
        )
        optimizer.zero_grad()
        empty_batch_gradients(params)  # what dp_local_train does for an empty batch
        optimizer.step()
        moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert moved is moves
