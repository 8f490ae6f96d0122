"""Fixed classifier: orthonormality, reproducibility across processes, clear errors."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spherecal.spherefed.classifier import (
    fixed_classifier,
    orthonormal_classifier,
    tammes_classifier,
)
from spherecal.spherefed.heads import FNHead, LearnableHead, SphereHead, make_head
from spherecal.spherefed.losses import ce_loss, make_loss, mse_onehot_loss

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("C", "l"), [(1, 1), (10, 10), (10, 128), (100, 1280), (3, 7)])
def test_orthonormal_rows(C: int, l: int) -> None:
    W = orthonormal_classifier(C, l, seed=3)
    assert W.shape == (C, l) and W.dtype == np.float64
    np.testing.assert_allclose(W @ W.T, np.eye(C), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(W, axis=1), 1.0, atol=1e-6)


def test_orthonormal_refuses_more_classes_than_dims_and_names_alternative() -> None:
    with pytest.raises(ValueError, match="tammes"):
        orthonormal_classifier(11, 10)


def test_seed_changes_classifier_and_same_seed_is_identical() -> None:
    a = fixed_classifier(10, 64, seed=1)
    assert a.tobytes() == fixed_classifier(10, 64, seed=1).tobytes()
    assert not np.allclose(a, fixed_classifier(10, 64, seed=2))


def _digest_in_subprocess(kind: str) -> str:
    code = (
        "import hashlib; from spherecal.spherefed.classifier import fixed_classifier; "
        f"print(hashlib.sha256(fixed_classifier(10, 32, kind={kind!r}, seed=7).tobytes())"
        ".hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.parametrize("kind", ["orthonormal", "random", "tammes"])
def test_identical_bytes_in_two_processes(kind: str) -> None:
    here = hashlib.sha256(fixed_classifier(10, 32, kind=kind, seed=7).tobytes()).hexdigest()
    assert _digest_in_subprocess(kind) == here
    assert _digest_in_subprocess(kind) == here


def test_tammes_spreads_more_classes_than_dims() -> None:
    C, l = 20, 3
    W = tammes_classifier(C, l, seed=0)
    np.testing.assert_allclose(np.linalg.norm(W, axis=1), 1.0, atol=1e-9)
    cos = W @ W.T - 2 * np.eye(C)
    rng = np.random.default_rng(0)
    R = rng.standard_normal((C, l))
    R /= np.linalg.norm(R, axis=1, keepdims=True)
    cos_random = R @ R.T - 2 * np.eye(C)
    # The optimised configuration's worst pair is far better than a random one's.
    assert cos.max() < cos_random.max() - 0.05


def test_tammes_reaches_the_regular_simplex_when_it_can() -> None:
    # For C <= l + 1 the Tammes optimum is the regular simplex (every pairwise cosine
    # -1/(C-1)). Mettes et al.'s subgradient descent with a fixed step gets close:
    # its worst pair is better separated than orthogonal and near the optimum.
    C = 5
    W = tammes_classifier(C, 16, seed=0)
    off = (W @ W.T)[~np.eye(C, dtype=bool)]
    assert off.max() < -0.15
    assert off.max() >= -1.0 / (C - 1) - 1e-9


def test_random_classifier_is_he_scaled() -> None:
    W = fixed_classifier(50, 400, kind="random", seed=0)
    assert abs(W.var() - 2.0 / 400) < 0.1 * (2.0 / 400)


def test_unknown_kind_and_bad_dims() -> None:
    with pytest.raises(ValueError, match="unknown classifier kind"):
        fixed_classifier(3, 4, kind="nope")
    with pytest.raises(ValueError, match="positive"):
        fixed_classifier(0, 4)


def test_sphere_head_is_fixed_normalised_and_bias_free() -> None:
    head = make_head("sphere", feature_dim=16, num_classes=4, classifier_seed=1)
    assert isinstance(head, SphereHead)
    assert list(head.parameters()) == []  # nothing to train
    h = torch.randn(5, 16) * 10
    z = head.features(h)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(5))
    W = torch.as_tensor(fixed_classifier(4, 16, seed=1), dtype=torch.float32)
    torch.testing.assert_close(head(h), z @ W.t())
    head.set_weight(np.zeros((4, 16)))
    assert torch.count_nonzero(head(h)) == 0
    with pytest.raises(ValueError, match=r"\(4, 16\)"):
        head.set_weight(np.zeros((16, 4)))
    with pytest.raises(ValueError, match="NaN"):
        head.set_weight(np.full((4, 16), np.nan))


def test_learnable_and_fn_heads() -> None:
    lh = make_head("learnable", feature_dim=8, num_classes=3)
    fh = make_head("fn", feature_dim=8, num_classes=3)
    assert isinstance(lh, LearnableHead) and isinstance(fh, FNHead)
    h = torch.randn(4, 8) * 5
    torch.testing.assert_close(lh.features(h), h)
    torch.testing.assert_close(fh.features(h).norm(dim=1), torch.ones(4))
    assert lh.linear.bias is None
    with pytest.raises(ValueError, match="unknown head"):
        make_head("other", feature_dim=8, num_classes=3)


def test_losses_match_hand_computation() -> None:
    logits = torch.tensor([[0.5, -0.2, 0.1], [0.0, 0.3, 0.9]])
    y = torch.tensor([0, 2])
    expected_mse = ((0.5 - 1) ** 2 + 0.04 + 0.01 + 0.0 + 0.09 + (0.9 - 1) ** 2) / 2
    assert mse_onehot_loss(logits, y).item() == pytest.approx(expected_mse)
    lse = torch.logsumexp(logits, dim=1)
    expected_ce = ((lse[0] - 0.5) + (lse[1] - 0.9)).item() / 2
    assert ce_loss(logits, y).item() == pytest.approx(expected_ce, rel=1e-6)
    assert make_loss("mse") is mse_onehot_loss
    with pytest.raises(ValueError):
        make_loss("hinge")
