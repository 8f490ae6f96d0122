"""Open a federation's state directory, or resume it after the last completed round.

Why resuming is safe: a round's checkpoint (global vector + the strategy's server
state) is committed to the database before the next round starts, so the last
completed round's checkpoint is exactly the state the next round starts from. A
state directory written under different settings is refused (its fingerprint
differs): continuing it would silently mix two federations.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.driver.model import Checkpoints
from spherecal.coordinator.driver.strategy import Strategy
from spherecal.coordinator.errors import FederationFailed
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.store import Store
from spherecal.coordinator.summary_schema import RoundMetrics

__all__ = ["Opened", "open_state"]


@dataclass(frozen=True)
class Opened:
    """Where the driver starts: a fresh federation, or after ``resumed_from`` rounds."""

    federation_id: str
    global_vector: npt.NDArray[np.float64] | None  # None: start from the initial model
    completed_rounds: int
    resumed_from: int | None
    round_metrics: list[RoundMetrics]
    checkpoint_path: str | None = None


def open_state(
    settings: CoordinatorSettings,
    store: Store,
    strategy: Strategy,
    vector_length: int,
) -> Opened:
    """Check the fingerprint, record what ``spherecal audit`` needs, and load the last
    round's checkpoint into ``strategy`` (server state) and the returned vector."""
    fingerprint = settings.fingerprint()
    stored = store.get_meta("fingerprint")
    if stored is not None and stored != fingerprint:
        raise FederationFailed(
            f"state directory {settings.state_dir} belongs to a federation with "
            "different settings (participants, seed, model or training); refusing to "
            "resume it — use a fresh state_dir"
        )
    if stored is None:
        store.set_meta("fingerprint", fingerprint)
        store.set_meta("federation_id", secrets.token_hex(8))
    federation_id = store.get_meta("federation_id") or ""
    # What `spherecal audit` checks against (the audit reads only the database).
    store.set_meta("secagg_min_participants", str(settings.secagg.min_participants))
    store.set_meta("privacy", json.dumps(asdict(settings.privacy), sort_keys=True))
    records = store.completed_rounds()
    if [r.round for r in records] != list(range(len(records))):
        raise FederationFailed("the database's completed rounds are not contiguous")
    if not records:
        return Opened(federation_id, None, 0, None, [])
    last = records[-1]
    if last.checkpoint_path is None or last.checkpoint_sha256 is None:
        raise FederationFailed(f"round {last.round + 1} has no checkpoint recorded")
    try:
        vector, strategy_state = Checkpoints.load_with_state(
            last.checkpoint_path, last.checkpoint_sha256, vector_length
        )
        strategy.load_state_dict(strategy_state)
    except (OSError, ValueError) as exc:
        raise FederationFailed(f"cannot resume: {exc}") from None
    return Opened(
        federation_id,
        vector.copy(),
        len(records),
        len(records),
        [r.metrics for r in records],
        str(last.checkpoint_path),
    )
