"""Shared set-up for the participant's unit tests."""

from __future__ import annotations

from spherecal.participant.data import load_local_data
from spherecal.participant.settings import DataSettings
from spherecal.participant.trainer import LocalTrainer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import model_spec_to_proto
from spherecal.spherefed.network import ModelSpec


def digits_trainer() -> LocalTrainer:
    """A site's trainer on the digits dataset's local split (1,213 training examples)
    with the small MLP: real data and a real network, seconds to build."""
    plan = pb.Plan(
        federation_id="f",
        model=model_spec_to_proto(ModelSpec(extractor="mlp")),
        training=pb.LocalTraining(epochs=1, batch_size=32, lr=0.1, loss="mse"),
        rounds=1,
    )
    return LocalTrainer(plan, load_local_data(DataSettings(dataset="digits")))
