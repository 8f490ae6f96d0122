"""The test oracle: a simulation's calibration statistics recomputed *in the clear*.

Simulation only — the harness can read every participant's slice, a real coordinator
cannot. It exists to check a securely aggregated result against the plaintext truth
(tests, ``bench/service.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import torch

from spherecal.participant.data import load_local_data
from spherecal.participant.settings import DataSettings
from spherecal.proto.codec import model_spec_from_json
from spherecal.simulate.settings import SimulationSettings
from spherecal.spherefed.network import ModelSpec, build_model
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics, ccvr_statistics, ffc_statistics

__all__ = ["clear_statistics"]


def clear_statistics(
    settings: SimulationSettings, participants: Sequence[str], kind: str
) -> FFCStatistics | CCVRStatistics:
    """Recompute *in the clear* the statistics ``participants`` contribute under the
    saved final model, summed in roster order.

    Simulation only — the harness can read every participant's slice, a real
    coordinator cannot. It exists to check a securely aggregated result against the
    plaintext truth (tests, ``bench/service.py``).
    """
    out = settings.out / "coordinator" / "out"
    meta = json.loads((out / "model_spec.json").read_text())
    # the harness's own feature_dim (None = the extractor's default) rebuilds the
    # network exactly as the coordinator built it
    spec = replace(ModelSpec(**model_spec_from_json(meta)), feature_dim=settings.feature_dim)
    model = build_model(spec)
    model.load_state_dict(torch.load(out / "model_none.pt", weights_only=True))
    model.eval()
    ref = settings.reference
    ids = settings.participant_ids
    total: FFCStatistics | CCVRStatistics | None = None
    for pid in sorted(participants, key=ids.index):
        data = load_local_data(
            DataSettings(
                dataset=ref.dataset,
                root=ref.data_root,
                slice_index=ids.index(pid),
                slice_of=ref.participants,
                partition=ref.partition,
                alpha=ref.alpha,
                shards_per_client=ref.shards_per_client,
                seed=ref.seed,
                validation_fraction=ref.validation_fraction,
            )
        )
        with torch.no_grad():
            chunks = [
                model.features(data.train_x[lo : lo + 512]) for lo in range(0, data.train_size, 512)
            ]
        z = torch.cat(chunks).double().numpy()
        y = data.train_y.numpy()
        stats: FFCStatistics | CCVRStatistics = (
            ffc_statistics(z, y, spec.num_classes)
            if kind == "ffc"
            else ccvr_statistics(z, y, spec.num_classes)
        )
        total = stats if total is None else total + stats  # type: ignore[operator]
    if total is None:
        raise ValueError("no participants")
    return total
