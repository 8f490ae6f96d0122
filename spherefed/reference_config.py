"""``ReferenceConfig``: every setting of a reference run, validated at construction.

Its own module because everything that reproduces the reference — the runner, the
participant's data slicing, the coordinator's rounds, the experiment harness — needs
the settings without the pipeline; :mod:`spherecal.spherefed.reference` re-exports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from spherecal.spherefed.algorithms.registry import ALGORITHM_NAMES
from spherecal.spherefed.calibrate import CCVRConfig
from spherecal.spherefed.calibration_suite import (
    CALIBRATION_NAMES,
    DEFAULT_RIDGE_GRID,
    DEFAULT_SHRINKAGE_GRID,
)
from spherecal.spherefed.data import (
    SyntheticConfig,
)
from spherecal.spherefed.fl import (
    LocalTrainConfig,
    local_train,  # noqa: F401  (re-exported: the service imports it from here too)
    server_step,  # noqa: F401  (re-exported: the service imports it from here too)
)

SELECT_BY: tuple[str, ...] = ("none", "ffc", "ccvr")


@dataclass(frozen=True)
class ReferenceConfig:
    """Every setting of a reference run. Defaults: SphereFed on digits, 10 participants."""

    dataset: str = "digits"
    data_root: str | None = None
    samples: int | None = None
    """Dataset size for ``mnist1d`` (default ``spherecal.spherefed.data.MNIST1D_SAMPLES``); unused
    otherwise (and then absent from ``to_json``)."""
    participants: int = 10
    partition: str = "dirichlet"
    alpha: float = 0.1
    shards_per_client: int = 2
    model: str = "digits_cnn"
    norm: str = "group"
    head: str = "sphere"
    classifier: str = "orthonormal"
    loss: str = "mse"
    algorithm: str = "fedavg"
    prox_mu: float = 0.01
    fedopt_lr: float = 0.01
    """Server learning rate η of FedAdam / FedYogi (read only for those algorithms)."""
    rounds: int = 30
    local_epochs: int = 2
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    sample_fraction: float = 1.0
    validation_fraction: float = 0.1
    seed: int = 0
    ffc_ridge: float = 0.0
    ccvr: CCVRConfig = field(default_factory=CCVRConfig)
    calibrations: tuple[str, ...] = CALIBRATION_NAMES
    """Which calibrators to run (``spherecal.spherefed.calibration_suite.CALIBRATION_NAMES``)."""
    ridge_grid: tuple[float, ...] = DEFAULT_RIDGE_GRID
    """FFC+bias ridge candidates, chosen on the validation split."""
    shrinkage_grid: tuple[float, ...] = DEFAULT_SHRINKAGE_GRID
    """LDA/QDA shrinkage candidates, chosen on the validation split."""
    secure_sum: bool = False
    """Sum the calibration statistics with the in-process secure-aggregation protocol at
    the service's fixed-point scale (``spherecal.spherefed.privacy.secure_sum``) instead of in
    float64."""
    oracle_lrs: tuple[float, ...] = (0.01, 0.1, 1.0)
    oracle_epochs: int = 30
    #: Only read when ``dataset == "synthetic"`` (and only then written by ``to_json``).
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def __post_init__(self) -> None:
        if isinstance(self.synthetic, Mapping):  # e.g. from to_json() output
            object.__setattr__(self, "synthetic", SyntheticConfig(**self.synthetic))
        if self.participants < 1:
            raise ValueError(f"participants must be >= 1, got {self.participants}")
        if self.rounds < 0:
            raise ValueError(f"rounds must be >= 0, got {self.rounds}")
        if self.algorithm not in ALGORITHM_NAMES:
            raise ValueError(
                f"unknown algorithm {self.algorithm!r}; expected one of {ALGORITHM_NAMES}"
            )
        if not 0 < self.sample_fraction <= 1:
            raise ValueError(f"sample_fraction must be in (0, 1], got {self.sample_fraction}")
        if not self.fedopt_lr > 0:
            raise ValueError(f"fedopt_lr must be > 0, got {self.fedopt_lr}")
        unknown = [c for c in self.calibrations if c not in CALIBRATION_NAMES]
        if unknown or not self.calibrations:
            raise ValueError(
                f"calibrations must be a non-empty subset of {CALIBRATION_NAMES}, "
                f"got {list(self.calibrations)}"
            )
        if not self.ridge_grid or any(not (r >= 0 and np.isfinite(r)) for r in self.ridge_grid):
            raise ValueError(f"ridge_grid needs finite values >= 0, got {self.ridge_grid}")
        if not self.shrinkage_grid or any(not 0 <= g <= 1 for g in self.shrinkage_grid):
            raise ValueError(f"shrinkage_grid needs values in [0, 1], got {self.shrinkage_grid}")
        if self.samples is not None and self.dataset != "mnist1d":
            raise ValueError(f"samples is only read for dataset 'mnist1d', not {self.dataset!r}")

    def local_config(self) -> LocalTrainConfig:
        return LocalTrainConfig(
            epochs=self.local_epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            loss=self.loss,
            prox_mu=self.prox_mu if self.algorithm == "fedprox" else 0.0,
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["oracle_lrs"] = list(self.oracle_lrs)
        for key in ("calibrations", "ridge_grid", "shrinkage_grid"):
            out[key] = list(out[key])
        if self.samples is None:
            del out["samples"]
        if not self.secure_sum:
            del out["secure_sum"]  # keeps the float-sum runs' JSON (and cell keys) unchanged
        if self.dataset != "synthetic":
            del out["synthetic"]  # keeps the other datasets' settings JSON unchanged
        return out
