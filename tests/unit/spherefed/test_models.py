"""Feature extractors: shapes, feature_dim, norm layers, batch independence, seeding."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from spherecal.spherefed.models import (
    EXTRACTOR_NAMES,
    NORM_NAMES,
    FeatureExtractor,
    build_extractor,
    group_count,
)

# The paper's fixed feature dimensions l (SphereFed appendix F.1, Tables 11-15, the
# width of each table's final FC) and our defaults for the digits models.
EXPECTED_DIM = {
    "mlp": 128,
    "digits_cnn": 128,
    "convnet": 1024,
    "resnet18": 512,
    "mobilenetv2": 1280,
    "vgg13": 512,
    "senet18": 512,
}
DIGITS_MODELS = ("mlp", "digits_cnn")


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    """Tiny batches gain nothing from intra-op threads, and the CI box's 2 cores are
    shared: one thread avoids oversubscription. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _build(name: str, norm: str, seed: int = 0) -> FeatureExtractor:
    torch.manual_seed(seed)
    if name in DIGITS_MODELS:
        return build_extractor(name, in_channels=1, image_size=8, norm=norm)
    return build_extractor(name, norm=norm)


def _input(name: str, batch: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    shape = (batch, 1, 8, 8) if name in DIGITS_MODELS else (batch, 3, 32, 32)
    return torch.randn(shape, generator=g)


def _param_bytes(model: nn.Module) -> bytes:
    return b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values())


def test_names_cover_expected() -> None:
    assert set(EXTRACTOR_NAMES) == set(EXPECTED_DIM)
    assert set(NORM_NAMES) == {"batch", "group"}


@pytest.mark.parametrize("norm", NORM_NAMES)
@pytest.mark.parametrize("name", EXTRACTOR_NAMES)
def test_forward_shape_and_batch_independence(name: str, norm: str) -> None:
    model = _build(name, norm)
    assert isinstance(model, FeatureExtractor)
    assert model.feature_dim == EXPECTED_DIM[name]
    x = _input(name)

    # Training-mode forward (the one local training uses): shape and finiteness.
    model.train()
    out_train = model(x)
    assert out_train.shape == (2, EXPECTED_DIM[name])
    assert torch.isfinite(out_train).all()

    # Eval mode: a sample's features must not depend on its batch-mates, for both
    # norms (BatchNorm uses its running statistics in eval mode).
    model.eval()
    with torch.no_grad():
        batch_out = model(x)
        alone = model(x[1:2])
    assert batch_out.shape == (2, EXPECTED_DIM[name])
    torch.testing.assert_close(alone[0], batch_out[1], rtol=1e-4, atol=1e-5)

    if norm == "group":
        # GroupNorm uses no batch statistics: batch-independent in training mode too.
        model.train()
        with torch.no_grad():
            alone_train = model(x[1:2])
        torch.testing.assert_close(alone_train[0], out_train[1].detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in EXTRACTOR_NAMES if n != "mlp"])
def test_every_conv_has_the_selected_norm(name: str) -> None:
    for norm, wanted, unwanted in (
        ("group", nn.GroupNorm, nn.BatchNorm2d),
        ("batch", nn.BatchNorm2d, nn.GroupNorm),
    ):
        model = _build(name, norm)
        modules = list(model.modules())
        assert not any(isinstance(m, unwanted) for m in modules)
        norms = [m for m in modules if isinstance(m, wanted)]
        # The SE module's 1x1 convs are fully connected layers (with bias, no norm).
        se_convs = {
            id(c)
            for m in modules
            if type(m).__name__ == "_SqueezeExcitation"
            for c in m.modules()
            if isinstance(c, nn.Conv2d)
        }
        convs = [m for m in modules if isinstance(m, nn.Conv2d) and id(m) not in se_convs]
        assert len(convs) == len(norms) > 0
        # Each conv is immediately followed by a norm of its output width.
        for parent in modules:
            children = list(parent.children())
            for a, b in zip(children, children[1:], strict=False):
                if isinstance(a, nn.Conv2d) and id(a) not in se_convs:
                    assert isinstance(b, wanted)
                    width = b.num_channels if isinstance(b, nn.GroupNorm) else b.num_features
                    assert width == a.out_channels
        if norm == "group":
            for g in norms:
                assert isinstance(g, nn.GroupNorm)
                assert g.num_channels % g.num_groups == 0


def test_group_count() -> None:
    assert group_count(64) == 32
    assert group_count(1280) == 32
    assert group_count(16) == 16
    assert group_count(24) == 24
    assert group_count(144) == 24  # 32 does not divide 144: largest divisor below
    assert group_count(1) == 1
    with pytest.raises(ValueError):
        group_count(0)


def test_parameter_counts_match_standard_architectures() -> None:
    # ResNet18 (CIFAR) has 11,173,962 parameters with its 512x10 FC (5,130); the
    # extractor alone (bias-free convs) is the rest.
    torch.manual_seed(0)
    resnet = build_extractor("resnet18")
    assert sum(p.numel() for p in resnet.parameters()) == 11_173_962 - 5_130
    # ConvNet (Table 11): conv weights 3*32*9 + 32*64*9 + 2*64*64*9 + 64*128*9
    # + 128*128*9 + 128*256*9 = 609,120, plus norm affine 2*(32+3*64+2*128+256).
    convnet = build_extractor("convnet")
    assert sum(p.numel() for p in convnet.parameters()) == 609_120 + 2 * 736


@pytest.mark.parametrize("name", ["mlp", "digits_cnn", "convnet", "mobilenetv2"])
def test_same_seed_identical_parameters(name: str) -> None:
    a = _build(name, "group", seed=7)
    b = _build(name, "group", seed=7)
    c = _build(name, "group", seed=8)
    assert _param_bytes(a) == _param_bytes(b)
    assert _param_bytes(a) != _param_bytes(c)


def test_image_size_sets_flatten_dimension() -> None:
    torch.manual_seed(0)
    conv64 = build_extractor("convnet", image_size=64)
    assert conv64.feature_dim == 256 * 4 * 4
    assert conv64(torch.randn(2, 3, 64, 64)).shape == (2, 4096)
    mlp = build_extractor("mlp", in_channels=5, image_size=1, feature_dim=16)
    assert mlp(torch.randn(2, 5, 1, 1)).shape == (2, 16)
    cnn = build_extractor("digits_cnn", in_channels=1, image_size=(8, 12), feature_dim=32)
    assert cnn(torch.randn(2, 1, 8, 12)).shape == (2, 32)
    # Pooled models keep their feature dim at other sizes (grayscale, 16x16).
    res = build_extractor("resnet18", in_channels=1)
    assert res(torch.randn(2, 1, 16, 16)).shape == (2, 512)
    vgg = build_extractor("vgg13", image_size=16)
    assert vgg(torch.randn(2, 3, 16, 16)).shape == (2, 512)


def test_gradients_reach_first_layer() -> None:
    torch.manual_seed(0)
    model = build_extractor("digits_cnn", in_channels=1, image_size=8)
    model(_input("digits_cnn")).pow(2).sum().backward()
    first = next(model.parameters())
    assert first.grad is not None and first.grad.abs().sum() > 0


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="valid names: mlp, digits_cnn"):
        build_extractor("resnet50")
    with pytest.raises(ValueError, match="valid norms: batch, group"):
        build_extractor("convnet", norm="layer")
    with pytest.raises(ValueError, match="feature_dim"):
        build_extractor("resnet18", feature_dim=64)
    with pytest.raises(ValueError, match="feature_dim"):
        build_extractor("mlp", in_channels=1, image_size=8, feature_dim=0)
    with pytest.raises(ValueError, match="16"):
        build_extractor("vgg13", image_size=8)
    with pytest.raises(ValueError, match="in_channels"):
        build_extractor("convnet", in_channels=0)
    with pytest.raises(ValueError, match="image_size"):
        build_extractor("convnet", image_size=0)


def test_build_model_is_the_same_in_concurrent_threads() -> None:
    """Virtual participants build their models in threads of one process at once;
    each must get exactly the weights a lone build gets (torch's RNG is global)."""
    import threading

    from spherecal.spherefed.network import ModelSpec, build_model

    spec = ModelSpec(extractor="digits_cnn", init_seed=7)
    expected = {k: v.clone() for k, v in build_model(spec).state_dict().items()}
    torch.manual_seed(1234)
    outside = torch.rand(3)  # the caller's RNG stream is left where it was, too
    workers = 8
    barrier = threading.Barrier(workers)
    built: list[dict[str, torch.Tensor]] = []
    lock = threading.Lock()

    def build() -> None:
        barrier.wait()
        for _ in range(3):
            state = build_model(spec).state_dict()
            with lock:
                built.append(state)

    threads = [threading.Thread(target=build) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.manual_seed(1234)
    assert torch.equal(torch.rand(3), outside)
    assert len(built) == 3 * workers
    for state in built:
        assert state.keys() == expected.keys()
        for name, value in expected.items():
            assert torch.equal(state[name], value), name
