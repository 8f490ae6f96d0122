"""The coordinator's copy of the network: layout of the global vector, the fixed
classifier, checkpoints and the saved final models.

The coordinator never trains; it builds the network from the same
``spherecal.spherefed.network.ModelSpec`` as every participant only to know the vector layout,
to read the fixed classifier (CCVR starts from it), to evaluate centrally when it
has test data, and to save state dicts.

Checkpoints and saved models use ``torch.save`` of plain tensors and are read back
with ``torch.load(weights_only=True)`` (no arbitrary unpickling), after checking the
file's SHA-256 recorded in SQLite.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from spherecal.spherefed.fl import aggregated_keys, load_state_vector, state_vector
from spherecal.spherefed.network import ModelSpec, Net, build_model, classifier_swapped
from spherecal.spherefed.saved import save_state_dict

__all__ = ["Checkpoints", "GlobalModel", "file_sha256"]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class GlobalModel:
    """The network's structure plus helpers; the global *values* live in a vector."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.net: Net = build_model(spec)
        self.keys = aggregated_keys(self.net)
        self.initial_vector: npt.NDArray[np.float64] = state_vector(self.net, self.keys)
        self.fixed_head: npt.NDArray[np.float64] = (
            self.net.head.weight.detach().double().numpy().copy()
        )

    @property
    def length(self) -> int:
        return int(self.initial_vector.shape[0])

    @property
    def feature_dim(self) -> int:
        return self.net.feature_dim

    @property
    def num_classes(self) -> int:
        return self.net.num_classes

    def load(self, vector: npt.NDArray[np.float64]) -> Net:
        load_state_vector(self.net, vector, self.keys)
        return self.net

    def head_weight(self, vector: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The classifier (C×l) of the model at ``vector`` (the fixed one for sphere heads)."""
        self.load(vector)
        return self.net.head.weight.detach().double().numpy().copy()

    def save(
        self,
        vector: npt.NDArray[np.float64],
        path: Path,
        head: npt.NDArray[np.float64] | None = None,
    ) -> str:
        """Save the state dict at ``vector`` (optionally with classifier ``head``)."""
        net = self.load(vector)
        with classifier_swapped(net, head):
            state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        save_state_dict(state, path)
        return file_sha256(path)


class Checkpoints:
    """The global vector after each completed round (latest ``keep`` kept), with the
    strategy's server state (FedAdam/FedYogi moments) as ``strategy.*`` tensors in
    the same file, so model and optimiser can never be resumed from different rounds."""

    _STATE_PREFIX = "strategy."

    def __init__(self, root: Path, keep: int = 2) -> None:
        self.root = root
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)

    def save(
        self,
        round_index: int,
        vector: npt.NDArray[np.float64],
        strategy_state: Mapping[str, npt.NDArray[np.float64]] | None = None,
    ) -> tuple[str, str]:
        path = self.root / f"round-{round_index + 1:05d}.pt"
        payload = {"vector": torch.from_numpy(np.ascontiguousarray(vector))}
        for key, value in (strategy_state or {}).items():
            array = np.ascontiguousarray(value, dtype=np.float64)
            payload[self._STATE_PREFIX + key] = torch.from_numpy(array)
        save_state_dict(payload, path)
        old = sorted(self.root.glob("round-*.pt"))[: -self.keep]
        for stale in old:
            stale.unlink(missing_ok=True)
        return str(path), file_sha256(path)

    @staticmethod
    def load_with_state(
        path: str | Path, sha256: str, length: int
    ) -> tuple[npt.NDArray[np.float64], dict[str, npt.NDArray[np.float64]]]:
        """The global vector and the strategy state, after checking the file against
        the SHA-256 the store recorded (``weights_only=True``: tensors only)."""
        target = Path(path)
        if not target.exists():
            raise FileNotFoundError(f"checkpoint {target} is missing")
        if file_sha256(target) != sha256:
            raise ValueError(f"checkpoint {target} does not match its recorded SHA-256")
        data = torch.load(target, map_location="cpu", weights_only=True)
        if not isinstance(data, dict):
            raise ValueError(f"checkpoint {target} is not a dict of tensors")
        vector = data.get("vector")
        if not isinstance(vector, torch.Tensor) or vector.dtype != torch.float64:
            raise ValueError(f"checkpoint {target} does not hold a float64 vector")
        array = vector.numpy()
        if array.shape != (length,):
            raise ValueError(f"checkpoint {target} has {array.shape}, expected ({length},)")
        state: dict[str, npt.NDArray[np.float64]] = {}
        for key, value in data.items():
            if key == "vector":
                continue
            if not key.startswith(Checkpoints._STATE_PREFIX):
                raise ValueError(f"checkpoint {target} has an unknown entry {key!r}")
            if not isinstance(value, torch.Tensor) or value.dtype != torch.float64:
                raise ValueError(f"checkpoint {target}: {key} is not a float64 tensor")
            state[key.removeprefix(Checkpoints._STATE_PREFIX)] = value.numpy()
        return array, state
