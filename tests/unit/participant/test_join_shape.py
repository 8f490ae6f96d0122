"""The join carries the images' shape, not the site's label range.

A site's ``num_classes`` was ``max(label) + 1`` of its own data (whole mode, without
``[data] num_classes``), sent in every join: the coordinator learnt whether the site
holds any record of the highest classes — a value of the data, outside every
release — and refused a site that lacked them. A site now sends ``num_classes = 0``
and checks its labels against the plan's model itself: two sites whose label ranges
differ send the same join, the one without the highest classes takes part, and one
whose labels exceed the model refuses the plan at its end, naming both sides.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spherecal import crypto
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.participant.backoff import ParticipantExit
from spherecal.participant.data import LocalData, load_local_data
from spherecal.participant.plan_refusal import PlanRefused
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import model_spec_to_proto
from spherecal.spherefed.network import ModelSpec


def _data(tmp_path: Path, name: str, classes: int) -> LocalData:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 1, 8, 8)).astype(np.float32)  # the digits model's images
    path = tmp_path / f"{name}.npz"
    np.savez(path, x=x, y=np.arange(60) % classes)
    return load_local_data(DataSettings(dataset="npz", root=str(path)))


class _Coordinator:
    """Answers a join with a plan for the digits MLP (10 classes, 1×8×8)."""

    def __init__(self) -> None:
        self.joins: list[pb.JoinRequest] = []

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        self.joins.append(request)
        plan = pb.Plan(
            federation_id="f",
            model=model_spec_to_proto(ModelSpec(extractor="mlp")),
            training=pb.LocalTraining(epochs=1, batch_size=32, lr=0.1, loss="mse"),
            rounds=1,
            example_count_noise_sd=4,
        )
        return pb.JoinReply(session="s", plan=plan)


def _join(tmp_path: Path, data: LocalData, coordinator: _Coordinator) -> ParticipantRunner:
    settings = ParticipantSettings(
        participant_id="p0",
        coordinator="127.0.0.1:1",
        insecure=True,
        state_dir=tmp_path / "state",
    )
    runner = ParticipantRunner(
        settings,
        coordinator,  # type: ignore[arg-type]  # join is the one call made
        data,
        crypto.generate_identity(),
        MemoryJobLedger(),
        DirectoryTrust(None),
        log=lambda _m: None,
    )
    runner._join()
    return runner


def test_the_join_says_nothing_of_the_labels(tmp_path: Path) -> None:
    full, fewer = _data(tmp_path, "full", 10), _data(tmp_path, "fewer", 7)
    assert (full.num_classes, fewer.num_classes) == (10, 7)  # what the join used to send
    coordinator = _Coordinator()
    for data in (full, fewer):
        runner = _join(tmp_path, data, coordinator)
        assert runner.plan is not None and runner.trainer is not None  # both take part
    shapes = [request.data for request in coordinator.joins]
    assert (
        shapes[0]
        == shapes[1]
        == pb.DataShape(num_classes=0, in_channels=1, image_height=8, image_width=8)
    )


def test_labels_beyond_the_model_are_refused_at_the_site(tmp_path: Path) -> None:
    with pytest.raises(ParticipantExit) as caught:
        _join(tmp_path, _data(tmp_path, "more", 12), _Coordinator())
    assert caught.value.code == 2
    assert "local labels reach class 11" in str(caught.value)
    assert "the federation's model has 10 classes" in str(caught.value)
    # what the coordinator is told (tests/integration/test_plan_refusal.py sends it):
    # the plan's class count, nothing of the site's labels
    assert isinstance(caught.value, PlanRefused) and caught.value.kind == pb.BAD_INPUT
    assert caught.value.public == (
        "this site's labels do not fit the plan's model of 10 classes (which labels it "
        "holds stays in the site's own log)"
    )
    report = caught.value.report(pb.Caller(participant_id="p0", session="s"))
    assert report.task_id == "" and "11" not in report.reason and "12" not in report.reason
    assert caught.value.ending.startswith(
        "this site refused the federation's plan: local labels reach class 11"
    )
