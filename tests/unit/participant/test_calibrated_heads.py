"""Heads with a bias and QDA's quadratic term on the participant side: the checks
on an evaluation task, the download into a CalibratedHead, the validation split,
and the counts against an independent computation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spherecal.participant.data import load_local_data
from spherecal.participant.evaluation_checks import (
    check_evaluation,
    download_heads,
    evaluation_content,
)
from spherecal.participant.policy import EvaluationRefused, PolicySettings
from spherecal.participant.settings import DataSettings
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for
from spherecal.spherefed.discriminant import WIRE_NEVER, CalibratedHead
from spherecal.spherefed.reference import ReferenceConfig, prepare_data

C, L = 10, 4


def _ref(name: str, array: np.ndarray) -> pb.TensorRef:
    return pb.TensorRef(name=name, header=header_for(np.ascontiguousarray(array)))


def _head(name: str, kind: int, *, bias: bool, quadratic: bool, c: int = C) -> pb.NamedTensorRef:
    return pb.NamedTensorRef(
        name=name,
        kind=kind,  # type: ignore[arg-type]
        tensor=_ref(name, np.zeros((c, L))),
        bias=_ref(name + "-b", np.zeros(c)) if bias else None,
        quadratic=_ref(name + "-q", np.zeros((c, L, L))) if quadratic else None,
    )


def _task(heads: list[pb.NamedTensorRef], split: int = pb.SPLIT_TEST) -> pb.EvaluateTask:
    model = pb.TensorRef(name="m", header=header_for(np.zeros(7)))
    return pb.EvaluateTask(model=model, heads=heads, round=-1, split=split)  # type: ignore[arg-type]


def test_each_kind_needs_exactly_its_tensors() -> None:
    ok = _task(
        [
            _head("ffc", pb.HEAD_LINEAR, bias=False, quadratic=False),
            _head("lda", pb.HEAD_AFFINE, bias=True, quadratic=False),
            _head("qda", pb.HEAD_QUADRATIC, bias=True, quadratic=True),
        ]
    )
    check_evaluation(ok, num_classes=C, feature_dim=L, max_heads=3)
    bad = {
        "lacks a bias": _head("x", pb.HEAD_AFFINE, bias=False, quadratic=False),
        "carries a bias": _head("x", pb.HEAD_LINEAR, bias=True, quadratic=False),
        "lacks a quadratic": _head("x", pb.HEAD_QUADRATIC, bias=True, quadratic=False),
        "carries a quadratic": _head("x", pb.HEAD_AFFINE, bias=True, quadratic=True),
        "unknown kind": _head("x", 7, bias=False, quadratic=False),
        "shape": _head("x", pb.HEAD_AFFINE, bias=True, quadratic=False, c=C + 1),
    }
    for why, head in bad.items():
        with pytest.raises(EvaluationRefused, match=why):
            check_evaluation(_task([head]), num_classes=C, feature_dim=L, max_heads=3)


def test_validation_grid_has_its_own_head_limit_and_never_widens_test() -> None:
    grid = [_head(f"lda@{k}", pb.HEAD_AFFINE, bias=True, quadratic=False) for k in range(15)]
    policy = PolicySettings()
    check_evaluation(
        _task(grid, pb.SPLIT_VALIDATION),
        num_classes=C,
        feature_dim=L,
        max_heads=policy.max_evaluation_heads,
        max_validation_heads=policy.max_validation_heads,
    )
    with pytest.raises(EvaluationRefused, match="max_evaluation_heads"):
        check_evaluation(
            _task(grid, pb.SPLIT_TEST),
            num_classes=C,
            feature_dim=L,
            max_heads=policy.max_evaluation_heads,
            max_validation_heads=policy.max_validation_heads,
        )
    with pytest.raises(EvaluationRefused, match="max_validation_heads"):
        check_evaluation(
            _task(grid * 2, pb.SPLIT_VALIDATION),
            num_classes=C,
            feature_dim=L,
            max_heads=2,
            max_validation_heads=16,
        )
    assert any(
        "max_validation_heads" in r for r in PolicySettings(max_validation_heads=40).relaxations()
    )
    with pytest.raises(ValueError, match="max_validation_heads"):
        PolicySettings(max_validation_heads=-1)


def test_digest_separates_split_kind_and_bias() -> None:
    lda = _head("lda", pb.HEAD_AFFINE, bias=True, quadratic=False)
    base = evaluation_content(_task([lda]))
    assert base != evaluation_content(_task([lda], pb.SPLIT_VALIDATION))
    other_bias = pb.NamedTensorRef()
    other_bias.CopyFrom(lda)
    other_bias.bias.CopyFrom(_ref("b", np.ones(C)))
    assert base != evaluation_content(_task([other_bias]))
    assert base == evaluation_content(
        _task([_head("lda", pb.HEAD_AFFINE, bias=True, quadratic=False)])
    )


def test_download_builds_calibrated_heads_at_their_shapes() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "q": rng.normal(size=(C, L)),
        "q-b": np.where(np.arange(C) == 3, WIRE_NEVER, rng.normal(size=C)),
        "q-q": rng.normal(size=(C, L, L)),
        "f": rng.normal(size=(C, L)),
    }
    task = _task(
        [
            pb.NamedTensorRef(
                name="qda",
                kind=pb.HEAD_QUADRATIC,
                tensor=_ref("q", arrays["q"]),
                bias=_ref("q-b", arrays["q-b"]),
                quadratic=_ref("q-q", arrays["q-q"]),
            ),
            pb.NamedTensorRef(name="ffc", tensor=_ref("f", arrays["f"])),
        ]
    )
    asked: list[tuple[str, tuple[int, ...]]] = []

    def fetch(ref: pb.TensorRef, shape: tuple[int, ...]) -> np.ndarray:
        asked.append((ref.name, shape))
        return arrays[ref.name]

    heads = download_heads(fetch, task, num_classes=C, feature_dim=L)
    assert asked == [("q", (C, L)), ("q-b", (C,)), ("q-q", (C, L, L)), ("f", (C, L))]
    qda = heads["qda"]
    assert isinstance(qda, CalibratedHead) and qda.quadratic is not None
    z = rng.normal(size=(50, L))
    expected = (
        z @ arrays["q"].T + arrays["q-b"] - 0.5 * np.einsum("ni,cij,nj->nc", z, arrays["q-q"], z)
    )
    np.testing.assert_allclose(qda.logits(z), expected, rtol=1e-12)
    assert not (qda.predict(z) == 3).any()  # WIRE_NEVER: never predicted
    assert isinstance(heads["ffc"], np.ndarray)


def test_local_validation_slices_cover_the_reference_validation_split_once() -> None:
    config = ReferenceConfig(participants=3, seed=1)
    reference = prepare_data(config)
    base = DataSettings(slice_of=3, slice_index=0, seed=1)
    sizes = 0
    labels = []
    for k in range(3):
        local = load_local_data(replace(base, slice_index=k))
        assert local.val_x is not None and local.val_y is not None
        sizes += int(local.val_y.shape[0])
        labels.append(local.val_y.numpy())
    assert sizes == len(reference.validation)
    np.testing.assert_array_equal(np.sort(np.concatenate(labels)), np.sort(reference.validation.y))


def test_whole_mode_holds_out_validation_and_zero_holds_out_nothing() -> None:
    none = load_local_data(DataSettings(validation_fraction=0.0))
    assert none.val_y is None and none.val_x is None
    held = load_local_data(DataSettings(validation_fraction=0.2))
    assert held.val_y is not None
    assert held.train_size + int(held.val_y.shape[0]) == none.train_size
