"""``spherecal experiment``: every method of the papers, side by side, on your data.

The grid
--------
A *table* (``methods``, ``ablation`` or ``calibration``) names a set of training
methods (:mod:`spherefed.algorithms.methods`). Each method is trained for every
*column* (a data partition: Dirichlet ``α``, IID, or ``S`` shards per participant),
every seed and every point of its learning-rate grid (× temperature grid, where a
method has one). One such training run is a **cell**: it goes through
:func:`spherefed.runner.run_federation` — the reference runner's data preparation,
statistics and FFC/CCVR code — and its result (test and validation accuracy for no
calibration, +CCVR and +FFC, accuracy per round) is written to
``DIR/cells/<hash>.json`` the moment it finishes. The hash covers everything that
defines the run (the full reference config, algorithm, objective), so a rerun skips
finished cells (resumable), and two tables that need the same run share it.

Selection (as the papers do it)
-------------------------------
For every table row (method × calibration), column and seed, the learning rate is
the one with the best **validation** accuracy for that row's calibration (ties → the
smaller learning rate); the **test** accuracy of that run is reported. Mean ± sample
standard deviation over seeds. The test split is never used to choose anything.
The ``calibration`` table instead fixes the trained model (lr chosen on validation
without calibration) and reports what each calibration adds to *that* model, plus
SphereFed's oracle (classifier fine-tuned on all pooled real features, best on test:
an optimistic upper bound, §5.4).

Outputs: ``DIR/table.md``, ``DIR/results.json`` (schema in ``docs/baselines.md``),
``DIR/accuracy_per_round.png``, ``DIR/calibration_gain.png``; progress on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from spherecal.argtypes import alpha_or_iid, positive_float
from spherefed.algorithms.methods import (
    ABLATION,
    BASES,
    DEFAULT_LR_GRID,
    RIVALS,
    MethodSpec,
    sphere_variant,
)
from spherefed.data import DATASET_NAMES, SyntheticConfig
from spherefed.models import EXTRACTOR_NAMES
from spherefed.runner import ReferenceConfig, run_federation

TABLES: tuple[str, ...] = ("methods", "ablation", "calibration")
CALIBRATIONS: tuple[str, ...] = ("none", "ccvr", "ffc")
SCHEMA = "spherecal.experiment/1"
CELL_FORMAT = 2
"""Part of every cell's identity: bump it when a code change alters what a cell
computes, so that old cells are not silently reused."""
QUICK_LR_GRID: tuple[float, ...] = (0.01, 0.1, 1.0)

Progress = Callable[[str], None]


# ----------------------------------------------------------------------------- settings


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

    def __post_init__(self) -> None:
        if self.table not in TABLES:
            raise ValueError(f"unknown table {self.table!r}; expected one of {TABLES}")
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
        return out


QUICK_OVERRIDES: dict[str, Any] = {"seeds": 1, "rounds": 15, "lr_grid": QUICK_LR_GRID}
"""``--quick``: one seed, 15 rounds, lr grid {0.01, 0.1, 1} (each only if not given)."""


# ----------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class RunSpec:
    """One training run (a cell)."""

    method: MethodSpec
    column: Column
    seed: int
    lr: float
    temperature: float
    oracle: bool = False

    def config(self, base: ReferenceConfig) -> ReferenceConfig:
        cfg = self.column.apply(replace(base, seed=self.seed))
        return self.method.reference_config(cfg, lr=self.lr)

    def identity(self, base: ReferenceConfig) -> dict[str, Any]:
        """Everything that determines the run's numbers (and nothing else)."""
        return {
            "format": CELL_FORMAT,
            "config": self.config(base).to_json(),
            "method": self.method.describe(self.temperature),
            "oracle": self.oracle,
        }

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
            for method in settings.table_methods():
                for tau in method.temperatures():
                    for lr in settings.grid_for(method):
                        runs.append(RunSpec(method, column, seed, float(lr), float(tau)))
    return runs


def execute_run(spec: RunSpec, base: ReferenceConfig) -> dict[str, Any]:
    """Train one cell and return its compact record (never raises on divergence)."""
    cfg = spec.config(base)
    t0 = time.perf_counter()
    record: dict[str, Any] = {
        "key": spec.key(base),
        "run": {
            "method": spec.method.key,
            "column": spec.column.key,
            "seed": spec.seed,
            "lr": spec.lr,
            "temperature": spec.temperature,
            "oracle": spec.oracle,
        },
        "identity": spec.identity(base),
    }
    seen: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = run_federation(
                cfg,
                strategy=spec.method.strategy(cfg),
                objective=spec.method.objective(spec.temperature),
                oracle=spec.oracle,
                robust_calibration=True,
                describe=spec.method.describe(spec.temperature),
            )
        seen = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught})
        record.update(
            {
                "diverged": False,
                "accuracy": res["accuracy"],
                "validation_accuracy": res["validation_accuracy"],
                "per_round": [r["test_accuracy"] for r in res["per_round"]],
                "train_loss": [r["train_loss"] for r in res["per_round"]],
            }
        )
        if "oracle" in res:
            record["oracle"] = res["oracle"]["best"]
        if "calibration" in res:  # the ridge / shrinkage each closed form chose on validation
            record["calibration"] = {k: v["chosen"] for k, v in res["calibration"].items()}
    except FloatingPointError as exc:
        record.update({"diverged": True, "error": str(exc)})
    record["warnings"] = seen
    record["seconds"] = time.perf_counter() - t0
    return record


def write_json(path: Path, data: Any, *, compact: bool = False) -> None:
    """Write JSON atomically (temporary file + rename): a killed run leaves no half cell."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if compact:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    else:
        text = json.dumps(data, indent=1, allow_nan=True)
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)
    _limit_blas(threads)


def _limit_blas(threads: int) -> None:
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - scikit-learn brings it
        return
    threadpool_limits(threads)


def _run_and_store(spec: RunSpec, base: ReferenceConfig, path: str) -> dict[str, Any]:
    record = execute_run(spec, base)
    write_json(Path(path), record)
    return record


class ProgressBar:
    """One progress line per finished cell: bar, count, what ran, result, ETA."""

    def __init__(self, total: int, cached: int, say: Progress) -> None:
        self.total, self.done, self.cached = total, cached, cached
        self.say = say
        self.t0 = time.perf_counter()
        self.ran = 0

    def update(self, label: str, record: dict[str, Any]) -> None:
        self.done += 1
        self.ran += 1
        elapsed = time.perf_counter() - self.t0
        left = self.total - self.done
        eta = elapsed / self.ran * left if self.ran else 0.0
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        if record.get("diverged"):
            outcome = "diverged"
        else:
            acc = record["accuracy"]
            outcome = f"none {acc['none']:.3f} ffc {acc['ffc']:.3f}"
        self.say(
            f"[{bar}] {self.done}/{self.total} ({self.cached} cached) {label}: {outcome} "
            f"({record['seconds']:.1f}s) elapsed {_fmt_time(elapsed)} ETA {_fmt_time(eta)}"
        )


def _fmt_time(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def run_cells(
    specs: Iterable[RunSpec],
    base: ReferenceConfig,
    cells_dir: Path,
    *,
    workers: int = 1,
    threads: int = 1,
    progress: Progress | None = None,
    phase: str = "",
) -> tuple[dict[str, dict[str, Any]], int, int]:
    """Run every cell not yet on disk; return ``(records by key, ran, cached)``.

    Each record is written to ``cells_dir/<key>.json`` as soon as its run ends, so an
    interrupted experiment resumes where it stopped.
    """
    say = progress or (lambda _m: None)
    cells_dir.mkdir(parents=True, exist_ok=True)
    unique: dict[str, RunSpec] = {}
    for spec in specs:
        unique.setdefault(spec.key(base), spec)
    records: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, RunSpec]] = []
    for key, spec in unique.items():
        path = cells_dir / f"{key}.json"
        if path.is_file():
            try:
                records[key] = json.loads(path.read_text())
                continue
            except (json.JSONDecodeError, OSError):
                pass  # a damaged cell is simply rerun
        todo.append((key, spec))
    cached = len(records)
    say(f"{phase}{len(unique)} cells: {cached} already done, {len(todo)} to run")
    bar = ProgressBar(len(unique), cached, say)
    if workers <= 1:
        for key, spec in todo:
            records[key] = _run_and_store(spec, base, str(cells_dir / f"{key}.json"))
            bar.update(spec.label(), records[key])
    else:
        ctx = get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_worker_init, initargs=(threads,)
        ) as pool:
            pending: dict[Future[dict[str, Any]], tuple[str, RunSpec]] = {}
            queue = list(todo)
            while queue or pending:
                while queue and len(pending) < 2 * workers:
                    key, spec = queue.pop(0)
                    fut = pool.submit(_run_and_store, spec, base, str(cells_dir / f"{key}.json"))
                    pending[fut] = (key, spec)
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    key, spec = pending.pop(fut)
                    records[key] = fut.result()
                    bar.update(spec.label(), records[key])
    return records, len(todo), cached


# ----------------------------------------------------------------------------- orchestration


def run_experiment(
    settings: ExperimentSettings,
    out_dir: Path,
    *,
    workers: int = 1,
    threads: int = 1,
    command: str | None = None,
    progress: Progress | None = None,
    plots: bool = True,
    cells_dir: Path | None = None,
) -> dict[str, Any]:
    """Run (or resume) the table's grid, then write ``table.md``, ``results.json``, plots.

    Cells go to ``cells_dir`` (default ``out_dir/cells``); several tables may share one
    cells directory, and then share the runs they have in common.
    """
    from spherecal.experiment_report import build_report, write_outputs

    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    cells_dir = cells_dir if cells_dir is not None else out_dir / "cells"
    base = settings.base_config()
    specs = grid_runs(settings)
    single_lr = all(len(settings.grid_for(m)) == 1 for m in settings.table_methods())
    if settings.table == "calibration" and single_lr:
        # One lr per method: the grid run *is* the selected model, so compute its oracle
        # in the same run instead of training the model a second time.
        specs = [replace(s, oracle=True) for s in specs]
    records, ran, cached = run_cells(
        specs, base, cells_dir, workers=workers, threads=threads, progress=say, phase="grid: "
    )
    oracle_records: dict[str, dict[str, Any]] = {}
    if settings.table == "calibration" and single_lr:
        oracle_records = records
    elif settings.table == "calibration":
        from spherecal.experiment_report import select_runs

        chosen = select_runs(settings, specs, records, base, criterion="none")
        oracle_specs = [replace(s, oracle=True) for s in chosen.values() if s is not None]
        oracle_records, ran2, cached2 = run_cells(
            oracle_specs,
            base,
            cells_dir,
            workers=workers,
            threads=threads,
            progress=say,
            phase="oracle re-runs of the selected models: ",
        )
        ran, cached = ran + ran2, cached + cached2
    wall = time.perf_counter() - t0
    report = build_report(
        settings,
        specs,
        records,
        base,
        oracle_records=oracle_records,
        command=command,
        timings={
            "wall_s": wall,
            "cells_run": ran,
            "cells_cached": cached,
            "cells_compute_s": sum(
                float(r.get("seconds", 0.0)) for r in [*records.values(), *oracle_records.values()]
            ),
        },
        threads=threads,
        workers=workers,
    )
    written = write_outputs(report, out_dir, plots=plots)
    for path in written:
        say(f"wrote {path}")
    say(f"done in {_fmt_time(wall)} ({ran} cells run, {cached} reused)")
    return report


# ----------------------------------------------------------------------------- CLI


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def add_experiment_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``spherecal experiment`` on the CLI's sub-parsers."""
    d = ExperimentSettings()
    s = SyntheticConfig()
    p = subparsers.add_parser(
        "experiment",
        help="compare every method of the papers (baselines, rival fixes, ablations)",
        description=(
            "Train every method of the chosen table on every partition column, seed and "
            "learning rate (tuned on the validation split), calibrate each with CCVR and "
            "FFC, and write DIR/table.md (mean ± std, best per column in bold), "
            "DIR/results.json and PNG plots. Finished runs are stored in DIR/cells/ and "
            "skipped when the command is run again (resumable)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--table", required=True, choices=TABLES)
    p.add_argument("--dataset", default=d.dataset, choices=DATASET_NAMES)
    p.add_argument(
        "--data-root", default=None, help="CIFAR directory, .npz file or the mnist1d cache dir"
    )
    p.add_argument(
        "--samples",
        type=_positive_int,
        default=None,
        help="mnist1d: samples generated (train + test; default 12000)",
    )
    p.add_argument(
        "--alpha",
        type=alpha_or_iid,
        nargs="+",
        default=None,
        help="Dirichlet α columns and/or 'iid' (default: 0.1 0.5 iid; none if only "
        "--shards is given)",
    )
    p.add_argument("--shards", type=_positive_int, nargs="+", default=[], help="shard columns")
    p.add_argument(
        "--seeds", type=_positive_int, default=None, help=f"seeds 0..N-1 (default {d.seeds})"
    )
    p.add_argument(
        "--lr-grid",
        type=positive_float,
        nargs="+",
        default=None,
        help="the learning-rate grid every method is tuned over (default "
        f"{' '.join(f'{x:g}' for x in DEFAULT_LR_GRID)}; with --quick "
        f"{' '.join(f'{x:g}' for x in QUICK_LR_GRID)})",
    )
    p.add_argument("--methods", nargs="+", default=None, help="only these methods (keys)")
    p.add_argument("--participants", type=_positive_int, default=d.participants)
    p.add_argument("--rounds", type=_positive_int, default=None, help=f"default {d.rounds}")
    p.add_argument("--local-epochs", type=_positive_int, default=d.local_epochs)
    p.add_argument("--batch-size", type=_positive_int, default=d.batch_size)
    p.add_argument("--model", default=d.model, choices=EXTRACTOR_NAMES)
    p.add_argument(
        "--fedopt-lr", type=positive_float, default=d.fedopt_lr, help="FedAdam/FedYogi server η"
    )
    p.add_argument("--synthetic-classes", type=_positive_int, default=s.num_classes)
    p.add_argument("--synthetic-dim", type=_positive_int, default=s.dim)
    p.add_argument("--synthetic-per-class", type=_positive_int, default=s.train_per_class)
    p.add_argument("--synthetic-noise", type=float, default=s.noise)
    p.add_argument(
        "--feature-shift",
        type=float,
        default=s.feature_shift,
        help="synthetic: norm of each participant's private feature offset",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1 seed, 15 rounds, 3-point lr grid (unless given explicitly)",
    )
    p.add_argument("--workers", type=_positive_int, default=1, help="parallel cell processes")
    p.add_argument(
        "--threads", type=_positive_int, default=1, help="torch/BLAS threads per process"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--cells",
        type=Path,
        default=None,
        help="where finished runs are stored (default OUT/cells); share it between tables "
        "to reuse their common runs",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_experiment)
    return p


def settings_from_args(args: argparse.Namespace) -> ExperimentSettings:
    alphas: tuple[float | str, ...]
    if args.alpha is not None:
        alphas = tuple(args.alpha)
    elif args.shards:
        alphas = ()
    else:
        alphas = ExperimentSettings().alphas
    d = ExperimentSettings()
    quick: dict[str, Any] = QUICK_OVERRIDES if args.quick else {}
    rounds = args.rounds if args.rounds is not None else quick.get("rounds", d.rounds)
    seeds = args.seeds if args.seeds is not None else quick.get("seeds", d.seeds)
    return ExperimentSettings(
        table=args.table,
        dataset=args.dataset,
        data_root=args.data_root,
        samples=args.samples,
        alphas=alphas,
        shards=tuple(args.shards),
        seeds=seeds,
        participants=args.participants,
        rounds=rounds,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        model=args.model,
        lr_grid=tuple(args.lr_grid) if args.lr_grid is not None else quick.get("lr_grid"),
        methods=None if args.methods is None else tuple(args.methods),
        fedopt_lr=args.fedopt_lr,
        synthetic=SyntheticConfig(
            num_classes=args.synthetic_classes,
            dim=args.synthetic_dim,
            train_per_class=args.synthetic_per_class,
            noise=args.synthetic_noise,
            feature_shift=args.feature_shift,
        ),
        quick=bool(args.quick),
    )


def _cmd_experiment(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    torch.set_num_threads(args.threads)
    _limit_blas(args.threads)

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[experiment] {msg}", file=sys.stderr, flush=True)

    from spherecal.experiment_report import command_line

    command = command_line(settings, out=str(args.out))
    report = run_experiment(
        settings,
        args.out,
        workers=args.workers,
        threads=args.threads,
        command=command,
        progress=progress,
        plots=not args.no_plots,
        cells_dir=args.cells,
    )
    print((args.out / "table.md").read_text())
    return 0 if report["rows"] else 1


__all__ = [
    "TABLES",
    "Column",
    "ExperimentSettings",
    "RunSpec",
    "add_experiment_parser",
    "execute_run",
    "grid_runs",
    "make_columns",
    "run_cells",
    "run_experiment",
    "settings_from_args",
]
