"""A participant's own algorithm state between rounds (SCAFFOLD's control variate
``c_k``), kept in its state directory so it survives a participant restart.

Why on disk: ``c_k`` never leaves the participant (only ``c_k⁺ − c_k`` is summed), so
a participant that restarts without it would silently fall back to ``c_k = 0`` and
diverge from the algorithm. Why *two* values per file (before and after round r):
a round can be re-issued (a failed secure job, a restarted coordinator) and must
then start from the state *before* that round, not from the one its abandoned
attempt produced. Stored as ``.npz`` (float64 arrays, read with
``allow_pickle=False``), written atomically; one file per (federation, participant),
so participants sharing a directory (in-process simulations) never mix states.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from spherecal.spherefed.durable import replace_durably

__all__ = ["ClientStateStore", "CorruptClientState"]

State = dict[str, npt.NDArray[np.float64]]

_SAFE_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")


class CorruptClientState(ValueError):
    """The stored algorithm state cannot be read (damaged or foreign file)."""


class ClientStateStore:
    """``state_dir/algorithm/<federation_id>-<participant hash>.npz``: the state before
    and after the last round this participant trained."""

    def __init__(self, state_dir: Path, federation_id: str, participant_id: str) -> None:
        if not _SAFE_ID.match(federation_id):
            raise ValueError(f"federation id {federation_id!r} is not a safe file name")
        who = hashlib.sha256(participant_id.encode()).hexdigest()[:16]
        self.path = state_dir / "algorithm" / f"{federation_id}-{who}.npz"

    def for_round(self, round_index: int) -> State | None:
        """The state to train round ``round_index`` from: the state *after* the last
        earlier round, or — when that round is being retried — the state before it."""
        if not self.path.exists():
            return None
        try:
            with np.load(self.path, allow_pickle=False) as data:
                stored_round = int(data["round"][0])
                prefix = "before." if stored_round >= round_index else "after."
                state = {
                    key.removeprefix(prefix): np.array(data[key], dtype=np.float64)
                    for key in data.files
                    if key.startswith(prefix)
                }
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise CorruptClientState(f"{self.path}: {exc}") from None
        return state or None

    def commit(
        self,
        round_index: int,
        before: Mapping[str, npt.NDArray[np.float64]] | None,
        after: Mapping[str, npt.NDArray[np.float64]],
    ) -> None:
        """Record round ``round_index``'s state transition (atomically)."""
        arrays: dict[str, npt.NDArray[np.float64]] = {
            "round": np.array([round_index], dtype=np.float64)
        }
        for key, value in (before or {}).items():
            arrays[f"before.{key}"] = np.asarray(value, dtype=np.float64)
        for key, value in after.items():
            arrays[f"after.{key}"] = np.asarray(value, dtype=np.float64)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp.npz")
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
            fh.flush()
            os.fsync(fh.fileno())
        replace_durably(tmp, self.path)
