"""Closed-form heads saved next to the model (``head_<name>.pt``) and loaded by
``spherefed.load_model`` / ``spherecal predict`` (``weights_only=True``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from spherecal import spherefed
from spherecal.cli.app import main
from spherecal.spherefed.discriminant import WIRE_NEVER, CalibratedHead, lda_solve, qda_solve
from spherecal.spherefed.network import ModelSpec, build_model, compute_features
from spherecal.spherefed.saved import (
    CalibratedNet,
    SavedModelError,
    available_calibrations,
    head_document,
    load_head,
    model_spec_document,
    save_head,
)
from spherecal.spherefed.stats import CCVRStatistics

SPEC = ModelSpec(extractor="mlp", in_channels=1, image_size=(8, 8), feature_dim=12, init_seed=2)
C, L = 10, 12


def _stats(z: np.ndarray, y: np.ndarray) -> CCVRStatistics:
    onehot = np.eye(C)[y]
    return CCVRStatistics(
        counts=onehot.sum(axis=0),
        sums=onehot.T @ z,
        second_moments=np.einsum("nc,ni,nj->cij", onehot, z, z),
    )


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, torch.nn.Module, dict[str, CalibratedHead], torch.Tensor]:
    net = build_model(SPEC)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.01)
    net.eval()
    x = torch.randn(300, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    z = compute_features(net, x)
    y = np.arange(300) % C
    y[y == 9] = 8  # class 9 has no sample: never predicted (bias -inf, saved as WIRE_NEVER)
    heads = {"lda": lda_solve(_stats(z, y), 0.1), "qda": qda_solve(_stats(z, y), 0.1)}
    (tmp_path / "model_spec.json").write_text(
        json.dumps(
            {
                **model_spec_document(SPEC, net.feature_dim),
                "heads": {n: head_document(h, f"head_{n}.pt") for n, h in heads.items()},
            }
        )
    )
    torch.save(net.state_dict(), tmp_path / "model_none.pt")
    for name, head in heads.items():
        save_head(head, tmp_path / f"head_{name}.pt")
    return tmp_path, net, heads, x


def test_load_model_with_a_closed_form_head_predicts_as_the_head(saved) -> None:  # type: ignore[no-untyped-def]
    directory, net, heads, x = saved
    assert available_calibrations(directory) == ["none", "lda", "qda"]
    z = compute_features(net, x)
    for name, head in heads.items():
        loaded = spherefed.load_model(directory, name)
        assert isinstance(loaded, CalibratedNet) and not loaded.training
        with torch.no_grad():
            logits = loaded(x)
        np.testing.assert_array_equal(logits.argmax(dim=1).numpy(), head.predict(z))
        expected = head.logits(z)  # -inf for class 9; saved (and so loaded) as WIRE_NEVER
        np.testing.assert_allclose(logits.numpy()[:, :9], expected[:, :9], rtol=1e-12, atol=1e-9)
        assert np.isneginf(expected[:, 9]).all() and (logits[:, 9] == WIRE_NEVER).all()
        assert not np.any(logits.argmax(dim=1).numpy() == 9)
    raw = torch.load(directory / "head_qda.pt", weights_only=True)
    assert set(raw) == {"weight", "bias", "quadratic"} and raw["bias"][9] == WIRE_NEVER
    assert set(torch.load(directory / "head_lda.pt", weights_only=True)) == {"weight", "bias"}
    # the default stays FFC → CCVR → none: a closed form is loaded by name only
    assert not isinstance(spherefed.load_model(directory), CalibratedNet)


def test_predict_command_uses_a_closed_form_head(saved, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    directory, net, heads, x = saved
    y = heads["qda"].predict(compute_features(net, x))
    y[:7] = (y[:7] + 1) % C  # seven wrong labels: accuracy must say so
    data = tmp_path / "data.npz"
    np.savez(data, x=x.numpy(), y=y)
    assert (
        main(
            ["predict", "--model-dir", str(directory), "--data", str(data), "--calibration", "qda"]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["calibration"] == "qda" and summary["correct"] == 300 - 7


def test_bad_head_files_are_refused(saved) -> None:  # type: ignore[no-untyped-def]
    directory, _, heads, _ = saved
    good = torch.load(directory / "head_lda.pt", weights_only=True)
    cases = {
        "shape": ({"weight": good["weight"][:, :3], "bias": good["bias"]}, "shape"),
        "keys": ({"weight": good["weight"]}, "expected weight, bias"),
        "nan": ({"weight": good["weight"] * float("nan"), "bias": good["bias"]}, "NaN"),
    }
    for state, match in cases.values():
        torch.save(state, directory / "head_lda.pt")
        with pytest.raises(SavedModelError, match=match):
            spherefed.load_model(directory, "lda")
    torch.save({"w": torch.zeros(1)}, directory / "head_lda.pt")
    with pytest.raises(SavedModelError):
        load_head(directory / "head_lda.pt", num_classes=C, feature_dim=L)
    with pytest.raises(SavedModelError, match="no head_ffc_bias.pt"):
        spherefed.load_model(directory, "ffc_bias")
    with pytest.raises(SavedModelError, match="calibration must be one of"):
        spherefed.load_model(directory, "svm")


def test_a_head_file_that_would_unpickle_code_is_refused(saved) -> None:  # type: ignore[no-untyped-def]
    directory, *_ = saved

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("pwned",))

    torch.save({"weight": Evil()}, directory / "head_qda.pt")
    with pytest.raises(SavedModelError, match="not a loadable head"):
        spherefed.load_model(directory, "qda")
