"""The cells of ``spherecal experiment``: run each training run once, store it, reuse it.

Each cell's record (test and validation accuracy for no calibration, +CCVR and +FFC,
accuracy per round) is written to ``CELLS/<hash>.json`` the moment it finishes, so a
rerun skips finished cells (resumable) and two tables that need the same run share it.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from spherecal.experiment.grid import Progress, RunSpec
from spherecal.experiment.service_engine import train_cell_as_service
from spherecal.spherefed.reference import ReferenceConfig, run_federation

__all__ = ["ProgressBar", "execute_run", "fmt_time", "limit_blas", "run_cells", "write_json"]


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
    if spec.engine == "service":
        if spec.oracle:
            raise ValueError("the oracle re-run is in-process only")
        record.update(train_cell_as_service(spec, base))
        record["warnings"] = []
        record["seconds"] = time.perf_counter() - t0
        return record
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
    limit_blas(threads)


def limit_blas(threads: int) -> None:
    try:
        from threadpoolctl import threadpool_limits
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
            f"({record['seconds']:.1f}s) elapsed {fmt_time(elapsed)} ETA {fmt_time(eta)}"
        )


def fmt_time(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _run_on_ray(
    todo: list[tuple[str, RunSpec]],
    base: ReferenceConfig,
    cells_dir: Path,
    records: dict[str, dict[str, Any]],
    bar: ProgressBar,
    *,
    threads: int,
    address: str | None,
) -> None:
    """Every cell a Ray task (``threads`` CPUs each) on a local instance or the cluster
    at ``address``. Each record comes back to this process and is cached here, on the
    driver's disk, as it arrives: a worker on another machine could not write it."""
    from spherecal.engines.ray import connect, disconnect, map_on_ray

    def store(index: int, record: dict[str, Any]) -> None:
        key, spec = todo[index]
        write_json(cells_dir / f"{key}.json", record)
        records[key] = record
        bar.update(spec.label(), record)

    started = connect(address, cpus=threads, threads=threads)
    try:
        map_on_ray(execute_run, [(spec, base) for _, spec in todo], store, cpus_per_call=threads)
    finally:
        if started:
            disconnect()


def run_cells(
    specs: Iterable[RunSpec],
    base: ReferenceConfig,
    cells_dir: Path,
    *,
    workers: int = 1,
    threads: int = 1,
    progress: Progress | None = None,
    phase: str = "",
    ray: bool = False,
    ray_address: str | None = None,
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
    if ray or ray_address:
        _run_on_ray(todo, base, cells_dir, records, bar, threads=threads, address=ray_address)
    elif workers <= 1:
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
