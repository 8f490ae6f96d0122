"""``spherefed.load_model`` and user extractors (``package.module:factory``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from spherecal import spherefed
from spherecal.participant.results import refuse_extractor
from spherecal.spherefed.custom import CustomExtractorError
from spherecal.spherefed.network import ModelSpec, build_model, classifier_swapped
from spherecal.spherefed.saved import SavedModelError, load_model, model_spec_document

CUSTOM = "tests.custom_extractor:tiny_cnn"


def _save(directory: Path, spec: ModelSpec, head: np.ndarray | None = None) -> torch.nn.Module:
    net = build_model(spec)
    with torch.no_grad():  # not the initial weights, so loading must really load
        for p in net.parameters():
            p.add_(0.01)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model_spec.json").write_text(
        json.dumps(model_spec_document(spec, net.feature_dim))
    )
    torch.save(net.state_dict(), directory / "model_none.pt")
    if head is not None:
        with classifier_swapped(net, head):
            torch.save(
                {k: v.clone() for k, v in net.state_dict().items()}, directory / "model_ffc.pt"
            )
    return net


@pytest.mark.parametrize(
    "spec",
    [
        ModelSpec(extractor="mlp", in_channels=1, image_size=(8, 8), feature_dim=16, init_seed=3),
        ModelSpec(extractor="convnet", in_channels=3, image_size=(32, 32), init_seed=1),
        ModelSpec(extractor=CUSTOM, in_channels=1, image_size=(8, 8), feature_dim=12),
    ],
    ids=["mlp", "convnet-fixed-dim", "custom"],
)
def test_load_model_reproduces_the_saved_network(tmp_path: Path, spec: ModelSpec) -> None:
    net = _save(tmp_path, spec)
    loaded = spherefed.load_model(tmp_path)  # the package-level name
    size = spec.image_size if isinstance(spec.image_size, tuple) else (spec.image_size,) * 2
    x = torch.randn(5, spec.in_channels, *size)
    net.eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), net(x))
    assert not loaded.training


def test_load_model_picks_ffc_first_and_swaps_the_classifier(tmp_path: Path) -> None:
    spec = ModelSpec(extractor="mlp", in_channels=1, image_size=(8, 8), feature_dim=10)
    head = np.random.default_rng(0).standard_normal((10, 10))
    _save(tmp_path, spec, head)
    ffc = load_model(tmp_path)
    none = load_model(tmp_path, "none")
    np.testing.assert_allclose(ffc.head.weight.detach().double().numpy(), head, rtol=1e-6)
    assert not torch.equal(ffc.head.weight, none.head.weight)


def test_load_model_refuses_what_does_not_fit(tmp_path: Path) -> None:
    with pytest.raises(SavedModelError, match="no model_spec.json"):
        load_model(tmp_path)
    spec = ModelSpec(extractor="mlp", in_channels=1, image_size=(8, 8), feature_dim=16)
    _save(tmp_path, spec)
    with pytest.raises(SavedModelError, match="no model_ccvr.pt"):
        load_model(tmp_path, "ccvr")
    with pytest.raises(SavedModelError, match="calibration must be one of"):
        load_model(tmp_path, "oracle")
    document = json.loads((tmp_path / "model_spec.json").read_text())
    (tmp_path / "model_spec.json").write_text(json.dumps({**document, "feature_dim": 32}))
    with pytest.raises(SavedModelError, match="does not fit"):
        load_model(tmp_path)
    (tmp_path / "model_spec.json").write_text(json.dumps(document))
    (tmp_path / "model_none.pt").write_text("not a state dict")
    with pytest.raises(SavedModelError, match="not a loadable state dict"):
        load_model(tmp_path)


def test_load_model_never_unpickles_code(tmp_path: Path) -> None:
    spec = ModelSpec(extractor="mlp", in_channels=1, image_size=(8, 8), feature_dim=16)
    _save(tmp_path, spec)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            import os

            return (os.system, (f"touch {marker}",))

    torch.save({"x": Evil()}, tmp_path / "model_none.pt")
    with pytest.raises(SavedModelError):
        load_model(tmp_path)
    assert not marker.exists()


def test_custom_extractor_is_deterministic_under_the_spec_seed() -> None:
    spec = ModelSpec(extractor=CUSTOM, in_channels=3, image_size=(6, 6), init_seed=7)
    a, b = build_model(spec), build_model(spec)
    assert a.feature_dim == 24  # the factory's default when none is asked
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    assert any(k.startswith("extractor.net.conv") for k in a.state_dict())


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("tests.custom_extractor:no_feature_dim", "must declare an integer feature_dim"),
        ("tests.custom_extractor:wrong_width", r"must map \(N, C, H, W\) to \(N, 7\)"),
        ("tests.custom_extractor:not_a_module", "not a torch.nn.Module"),
        ("tests.custom_extractor:missing", "has no attribute"),
        ("tests.no_such_module:f", "cannot import"),
        ("not a name:x", "must look like"),
    ],
)
def test_custom_extractor_contract_breaches_are_refused(name: str, match: str) -> None:
    with pytest.raises(CustomExtractorError, match=match):
        build_model(ModelSpec(extractor=name, in_channels=1, image_size=(8, 8)))


def test_custom_extractor_must_honour_an_asked_feature_dim() -> None:
    with pytest.raises(CustomExtractorError, match="declares feature_dim 7"):
        build_model(
            ModelSpec(
                extractor="tests.custom_extractor:wrong_width",
                in_channels=1,
                image_size=(8, 8),
                feature_dim=5,
            )
        )


def test_a_site_builds_only_the_custom_extractors_it_allowed() -> None:
    assert refuse_extractor("digits_cnn", ()) is None
    assert refuse_extractor(CUSTOM, (CUSTOM,)) is None
    reason = refuse_extractor(CUSTOM, ())
    assert reason is not None and "[participant] extractors" in reason
    assert refuse_extractor("os:system", (CUSTOM,)) is not None
