"""The grid of ``spherecal experiment``: tables, columns, settings, one run per cell.

A *table* names a set of training methods (:mod:`spherecal.spherefed.algorithms.methods`); each
is trained for every *column* (a data partition), seed and point of its learning-rate
grid (× temperature grid). One such training run is a :class:`RunSpec` (a *cell*),
identified by a hash of everything that defines its numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from spherecal.results_schema import CellIdentity, ReferenceSettings
from spherecal.spherefed.algorithms.methods import (
    ABLATION,
    BASES,
    RIVALS,
    MethodSpec,
    sphere_variant,
)
from spherecal.spherefed.data import DATASET_NAMES, SyntheticConfig
from spherecal.spherefed.privacy.secure_sum import BOUND_RULE as SECURE_SUM_BOUND_RULE
from spherecal.spherefed.reference import ReferenceConfig

__all__ = [
    "CALIBRATIONS",
    "CELL_FORMAT",
    "ENGINES",
    "HOSTINGS",
    "QUICK_LR_GRID",
    "QUICK_OVERRIDES",
    "SCHEMA",
    "TABLES",
    "Column",
    "ExperimentSettings",
    "Progress",
    "RunSpec",
    "grid_runs",
    "make_columns",
]

TABLES: tuple[str, ...] = ("methods", "ablation", "calibration")
ENGINES: tuple[str, ...] = ("inprocess", "service")
"""How a cell is trained: ``inprocess`` (:func:`spherecal.spherefed.reference.run_federation`, one
process) or ``service`` (a real federation: a coordinator process and the
participants on loopback, secure aggregation on — :mod:`spherecal.simulate`; where
the participants run: :data:`HOSTINGS`)."""
HOSTINGS: tuple[str, ...] = ("threads", "processes")
"""Where ``--engine service`` runs a cell's participants: ``threads`` (virtual
participants in the cell's process, :mod:`spherecal.engines.threads`) or
``processes`` (one OS process each). The coordinator is its own process either way,
and the numbers are the same (tested), so the hosting is not part of a cell's
identity: cells made either way are reused by both."""
CALIBRATIONS: tuple[str, ...] = ("none", "ccvr", "ffc")
SCHEMA = "spherecal.experiment/1"
CELL_FORMAT = 2
"""Part of every cell's identity: bump it when a code change alters what a cell
computes, so that old cells are not silently reused."""
QUICK_LR_GRID: tuple[float, ...] = (0.01, 0.1, 1.0)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Column:
    """One data partition of the table (a column)."""

    key: str
    label: str
    partition: str
    alpha: float | None = None
    shards: int | None = None

    def apply(self, config: ReferenceConfig) -> ReferenceConfig:
        if self.partition == "dirichlet":
            assert self.alpha is not None
            return replace(config, partition="dirichlet", alpha=self.alpha)
        if self.partition == "shards":
            assert self.shards is not None
            return replace(config, partition="shards", shards_per_client=self.shards)
        return replace(config, partition="iid")


def make_columns(alphas: Sequence[float | str], shards: Sequence[int] = ()) -> list[Column]:
    """Columns for Dirichlet ``α`` values, ``"iid"`` and shard counts, in that order."""
    cols: list[Column] = []
    for a in alphas:
        if isinstance(a, str):
            if a.lower() != "iid":
                raise ValueError(f"alpha must be a number or 'iid', got {a!r}")
            cols.append(Column("iid", "IID", "iid"))
        else:
            if not a > 0:
                raise ValueError(f"alpha must be > 0, got {a}")
            cols.append(Column(f"a{a:g}", f"α={a:g}", "dirichlet", alpha=float(a)))
    for s in shards:
        if s < 1:
            raise ValueError(f"shards must be >= 1, got {s}")
        cols.append(Column(f"s{s}", f"s={s}", "shards", shards=int(s)))
    if not cols:
        raise ValueError("no columns: give at least one --alpha or --shards value")
    if len({c.key for c in cols}) != len(cols):
        raise ValueError("duplicate columns")
    return cols


@dataclass(frozen=True)
class ExperimentSettings:
    """Everything ``spherecal experiment`` needs; defaults are the full digits run."""

    table: str = "methods"
    dataset: str = "digits"
    data_root: str | None = None
    samples: int | None = None
    """``mnist1d``: samples generated (train + test); ``None`` = the default 12,000."""
    alphas: tuple[float | str, ...] = (0.1, 0.5, "iid")
    shards: tuple[int, ...] = ()
    seeds: int = 3
    participants: int = 10
    rounds: int = 30
    local_epochs: int = 2
    batch_size: int = 32
    model: str = "mlp"
    lr_grid: tuple[float, ...] | None = None
    methods: tuple[str, ...] | None = None
    fedopt_lr: float = 0.01
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    quick: bool = False
    engine: str = "inprocess"
    hosting: str = "threads"
    """``--engine service``: where a cell's participants run (:data:`HOSTINGS`)."""
    secure_sum: bool = False
    """In-process engine: sum the calibration statistics through the real
    secure-aggregation protocol at the service's fixed-point scale
    (``ReferenceConfig.secure_sum``, ``spherecal.spherefed.privacy.secure_sum``) instead of in
    float64 — the calibrators then see exactly the numbers the service delivers."""

    def __post_init__(self) -> None:
        if self.table not in TABLES:
            raise ValueError(f"unknown table {self.table!r}; expected one of {TABLES}")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; expected one of {ENGINES}")
        if self.hosting not in HOSTINGS:
            raise ValueError(f"unknown hosting {self.hosting!r}; expected one of {HOSTINGS}")
        if (
            self.engine == "service"
            and self.dataset == "synthetic"
            and self.synthetic != SyntheticConfig()
        ):
            raise ValueError(
                "--engine service loads data in each participant process, which knows only "
                "the default synthetic dataset; drop the --synthetic-*/--feature-shift options"
            )
        if self.secure_sum and self.engine != "inprocess":
            raise ValueError("--secure-sum is for the inprocess engine (the service is secure)")
        if self.secure_sum and self.participants < 3:
            raise ValueError(
                "--secure-sum needs at least 3 participants (the participants' default "
                "[policy] min_participants: smaller jobs give inputs away by differencing)"
            )
        if self.engine == "service" and self.participants < 2:
            raise ValueError("--engine service needs at least 2 participants (secure aggregation)")
        if self.dataset not in DATASET_NAMES:
            raise ValueError(f"unknown dataset {self.dataset!r}")
        if self.seeds < 1 or self.participants < 1 or self.rounds < 1 or self.local_epochs < 1:
            raise ValueError("seeds, participants, rounds and local epochs must be >= 1")
        if self.lr_grid is not None and (
            not self.lr_grid or any(not lr > 0 for lr in self.lr_grid)
        ):
            raise ValueError(f"--lr-grid needs positive learning rates, got {self.lr_grid}")
        make_columns(self.alphas, self.shards)
        self.table_methods()  # validates --methods

    @property
    def columns(self) -> list[Column]:
        return make_columns(self.alphas, self.shards)

    def base_config(self) -> ReferenceConfig:
        """The reference config every cell starts from (partition/seed/lr set per cell)."""
        return ReferenceConfig(
            dataset=self.dataset,
            data_root=self.data_root,
            samples=self.samples,
            participants=self.participants,
            model=self.model,
            rounds=self.rounds,
            local_epochs=self.local_epochs,
            batch_size=self.batch_size,
            synthetic=self.synthetic,
            secure_sum=self.secure_sum,
        )

    def table_methods(self) -> list[MethodSpec]:
        """The training methods of this table (optionally restricted by ``methods``)."""
        if self.table == "methods":
            ms = [*BASES, *RIVALS]
        elif self.table == "ablation":
            ms = list(ABLATION)
        else:
            ms = [*BASES, *(sphere_variant(b) for b in BASES)]
        ms = [replace(m, fedopt_lr=self.fedopt_lr) for m in ms]
        if self.methods is not None:
            known = {m.key for m in ms}
            unknown = [k for k in self.methods if k not in known]
            if unknown:
                raise ValueError(
                    f"--methods {unknown} not in the {self.table} table; choose from "
                    f"{sorted(known)}"
                )
            ms = [m for m in ms if m.key in self.methods]
        return ms

    def runnable_methods(self) -> list[MethodSpec]:
        """The table's methods this engine can train (all of them in-process)."""
        skipped = self.skipped_methods()
        return [m for m in self.table_methods() if m.key not in skipped]

    def skipped_methods(self) -> dict[str, str]:
        """Method key → why this engine cannot train it (empty in-process)."""
        if self.engine == "inprocess":
            return {}
        return {
            m.key: SERVICE_SKIP_DEFAULT for m in self.table_methods() if m.service_options() is None
        }

    def grid_for(self, method: MethodSpec) -> tuple[float, ...]:
        return self.lr_grid if self.lr_grid is not None else method.lr_grid

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["alphas"] = list(self.alphas)
        out["shards"] = list(self.shards)
        out["lr_grid"] = None if self.lr_grid is None else list(self.lr_grid)
        out["methods"] = None if self.methods is None else list(self.methods)
        if self.dataset != "synthetic":
            del out["synthetic"]
        if self.engine == "inprocess":
            del out["hosting"]
        if not self.secure_sum:
            del out["secure_sum"]  # keeps the float-sum tables' JSON unchanged
        return out


SERVICE_SKIP_DEFAULT = (
    "a custom local objective (FedUV terms or a CE temperature τ ≠ 1) the service's "
    "local training does not carry"
)

QUICK_OVERRIDES: dict[str, Any] = {"seeds": 1, "rounds": 15, "lr_grid": QUICK_LR_GRID}
"""``--quick``: one seed, 15 rounds, lr grid {0.01, 0.1, 1} (each only if not given)."""


@dataclass(frozen=True)
class RunSpec:
    """One training run (a cell)."""

    method: MethodSpec
    column: Column
    seed: int
    lr: float
    temperature: float
    oracle: bool = False
    engine: str = "inprocess"
    hosting: str = "threads"
    """``engine="service"``: where the participants run; not part of :meth:`identity`
    (see :data:`HOSTINGS`)."""

    def config(self, base: ReferenceConfig) -> ReferenceConfig:
        cfg = self.column.apply(replace(base, seed=self.seed))
        return self.method.reference_config(cfg, lr=self.lr)

    def identity(self, base: ReferenceConfig) -> CellIdentity:
        """Everything that determines the run's numbers (and nothing else). The
        engine joins the identity only when it is not the in-process one, so cells
        made before engines existed keep their keys."""
        out: CellIdentity = {
            "format": CELL_FORMAT,
            "config": cast(ReferenceSettings, self.config(base).to_json()),
            "method": self.method.describe(self.temperature),
            "oracle": self.oracle,
        }
        if self.engine != "inprocess":
            out["engine"] = self.engine
        if out["config"].get("secure_sum"):  # its scale follows the bound's rule
            out["secure_sum_bound"] = SECURE_SUM_BOUND_RULE
        return out

    def key(self, base: ReferenceConfig) -> str:
        text = json.dumps(self.identity(base), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def label(self) -> str:
        t = f" τ={self.temperature:g}" if self.temperature != 1.0 else ""
        o = " +oracle" if self.oracle else ""
        return f"{self.method.key} {self.column.label} seed {self.seed} lr={self.lr:g}{t}{o}"


def grid_runs(settings: ExperimentSettings) -> list[RunSpec]:
    """Every cell of the table's learning-rate grid (duplicates kept; keys dedupe)."""
    runs = []
    for column in settings.columns:
        for seed in range(settings.seeds):
            for method in settings.runnable_methods():
                for tau in method.temperatures():
                    for lr in settings.grid_for(method):
                        runs.append(
                            RunSpec(
                                method,
                                column,
                                seed,
                                float(lr),
                                float(tau),
                                engine=settings.engine,
                                hosting=settings.hosting,
                            )
                        )
    return runs
