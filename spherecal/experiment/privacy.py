"""``spherecal experiment --table privacy``: DP training and DP calibration at the
accuracy users compare against (issue #25).

Two grids, each cell run once and stored as ``CELLS/<hash>.json`` the moment it ends
(a rerun skips finished cells, as the other tables do):

* **DP-SGD** (:mod:`spherecal.spherefed.privacy.dpsgd_compare`): for every seed,
  ``nonprivate`` (the distributed algorithm without noise) and, at every record-level
  ε of :attr:`PrivacySettings.epsilons` (δ = :attr:`PrivacySettings.delta`),
  ``local`` DP-SGD, ``distributed`` DP-SGD (the service's algorithm) and ``central``
  DP-SGD on the pooled data (Opacus). The number of steps ``T`` and the rate ``q`` are
  fixed; σ is the smallest the distributed plan accepts for ε at ``T`` steps
  (:func:`~spherecal.spherefed.privacy.dpsgd_compare.plan_sigma`), and central DP-SGD
  uses the same σ, ``q``, ``C``, ``T`` and learning rate — so distributed and central
  differ only in where the noise is added.
* **DP calibration** (:mod:`spherecal.spherefed.privacy.calibration_compare`): for
  every seed one FedAvg model (the reference runner), then every FFC and CCVR
  variant at every ε per release of :attr:`PrivacySettings.release_epsilons`, each
  averaged over ``repeats`` noise draws, with what the validation gate ships.

The report (``table.md``, ``results.json``, plots) is :mod:`.privacy_report`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DPSGD_METHODS",
    "PRIVACY_FORMAT",
    "PrivacyCell",
    "PrivacySettings",
    "QUICK_PRIVACY",
    "privacy_cells",
    "run_privacy_cell",
    "run_privacy_cells",
]

DPSGD_METHODS: tuple[str, ...] = ("nonprivate", "local", "distributed", "central")
PRIVACY_FORMAT = 1
"""Part of every privacy cell's identity: bump it when a change alters a cell's numbers."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PrivacySettings:
    """The privacy table's grid and hyperparameters (defaults: the committed table)."""

    dataset: str = "mnist1d"
    samples: int | None = None
    participants: int = 10
    alpha: float = 0.1
    seeds: int = 3
    epsilons: tuple[float, ...] = (1.0, 4.0, 8.0)
    """Record-level ε of the whole DP-SGD training."""
    release_epsilons: tuple[float, ...] = (1.0, 4.0, 16.0)
    """ε per calibration release."""
    delta: float = 1e-5
    steps: int = 104
    """DP-SGD steps ``T`` (each over the union of the sites' data): ``bench/dpsgd.py``'s
    (the most within ε = 4 at σ = 1.5, ``q`` = 0.1)."""
    rate_batches: int = 10
    """``q = 1/rate_batches``."""
    clip: float = 1.0
    lr: float = 10.0
    local_rounds: int = 10
    local_batch: int = 32
    local_lr: float = 0.5
    calibration_rounds: int = 30
    """FedAvg rounds of the model the calibrators calibrate."""
    calibration_lr: float = 1.0
    min_contributors: int | None = None
    """``t`` of a calibration release; ``None``: a majority, the service's default
    (6 of 10 sites)."""
    repeats: int = 3
    """Noise draws per calibration cell and ε (averaged)."""
    quant_bits: int = 10
    max_examples: int = 4000

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.participants < 2 or self.steps < 1 or self.repeats < 1:
            raise ValueError("seeds, steps and repeats must be >= 1, participants >= 2")
        if self.local_rounds < 1 or self.calibration_rounds < 1 or self.rate_batches < 1:
            raise ValueError("local rounds, calibration rounds and rate batches must be >= 1")
        for eps in (*self.epsilons, *self.release_epsilons):
            if not eps > 0 or not math.isfinite(eps):
                raise ValueError(f"every ε must be positive and finite, got {eps}")
        if not 0 < self.delta < 1:
            raise ValueError(f"δ must lie in (0, 1), got {self.delta}")
        if not 1 <= self.release_contributors <= self.participants:
            raise ValueError("min_contributors must lie in 1..participants")

    @property
    def release_contributors(self) -> int:
        """``t`` of every calibration release."""
        if self.min_contributors is not None:
            return self.min_contributors
        return self.participants // 2 + 1

    @property
    def sample_rate(self) -> float:
        return 1.0 / self.rate_batches

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["epsilons"] = list(self.epsilons)
        out["release_epsilons"] = list(self.release_epsilons)
        out["release_contributors"] = self.release_contributors
        return out


QUICK_PRIVACY: dict[str, Any] = {
    "seeds": 1,
    "steps": 3,
    "local_rounds": 1,
    "calibration_rounds": 2,
    "repeats": 1,
}
"""``--quick``: a smoke run of the whole pipeline (1 seed, a few steps and rounds)."""


@dataclass(frozen=True)
class PrivacyCell:
    """One run: a DP-SGD ``method`` at ``epsilon`` (``None``: no noise), or the
    calibration comparison (``method == "calibration"``) of one seed."""

    method: str
    seed: int
    epsilon: float | None = None

    def identity(self, settings: PrivacySettings) -> dict[str, Any]:
        s = settings.to_json()
        del s["seeds"]
        if self.method == "calibration":  # the DP-SGD settings do not change it
            for k in ("epsilons", "steps", "rate_batches", "clip", "lr", "local_rounds"):
                s.pop(k)
            for k in ("local_batch", "local_lr"):
                s.pop(k)
        else:  # nor do the calibration settings change a DP-SGD cell
            for k in ("release_epsilons", "calibration_rounds", "calibration_lr"):
                s.pop(k)
            for k in ("min_contributors", "release_contributors", "repeats", "quant_bits"):
                s.pop(k)
            for k in ("max_examples",):
                s.pop(k)
        return {
            "format": PRIVACY_FORMAT,
            "settings": s,
            "method": self.method,
            "seed": self.seed,
            "epsilon": self.epsilon,
        }

    def key(self, settings: PrivacySettings) -> str:
        text = json.dumps(self.identity(settings), sort_keys=True)
        return "privacy-" + hashlib.sha256(text.encode()).hexdigest()[:20]

    def label(self) -> str:
        eps = "" if self.epsilon is None else f" ε={self.epsilon:g}"
        return f"{self.method}{eps} seed {self.seed}"


def privacy_cells(settings: PrivacySettings) -> list[PrivacyCell]:
    """Every cell of the table, the costly local DP-SGD cells first (a pool of
    workers then ends with the short ones)."""
    cells = []
    for seed in range(settings.seeds):
        for eps in settings.epsilons:
            cells.append(PrivacyCell("local", seed, eps))
    for seed in range(settings.seeds):
        cells.append(PrivacyCell("calibration", seed))
        cells.append(PrivacyCell("nonprivate", seed))
        for eps in settings.epsilons:
            cells.append(PrivacyCell("distributed", seed, eps))
            cells.append(PrivacyCell("central", seed, eps))
    return cells


def _reference_config(settings: PrivacySettings, seed: int, **kw: Any) -> Any:
    from spherecal.spherefed.reference import ReferenceConfig

    return ReferenceConfig(
        dataset=settings.dataset,
        samples=settings.samples,
        participants=settings.participants,
        alpha=settings.alpha,
        model="mlp",
        seed=seed,
        **kw,
    )


def _dpsgd_cell(cell: PrivacyCell, settings: PrivacySettings) -> dict[str, Any]:
    import torch

    import spherecal.spherefed.reference as runner
    from spherecal.spherefed.fl import count_correct
    from spherecal.spherefed.privacy import dpsgd_compare as dc
    from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan

    torch.manual_seed(cell.seed)
    config = _reference_config(settings, cell.seed)
    data = runner.prepare_data(config)
    spec = runner.model_spec(config, data)
    sites, test_x, test_y = dc.site_tensors(data)
    n_total = sum(int(x.shape[0]) for x, _ in sites)
    q, t = settings.sample_rate, settings.participants
    out: dict[str, Any] = {"records": n_total, "expected_batch": q * n_total}
    rng = np.random.default_rng([cell.seed, 25, 1, DPSGD_METHODS.index(cell.method)])
    if cell.method in ("nonprivate", "distributed", "central"):
        sigma = (
            1.0
            if cell.epsilon is None
            else dc.plan_sigma(
                cell.epsilon,
                q,
                settings.steps,
                settings.delta,
                max_grad_norm=settings.clip,
                min_contributors=t,
            )
        )
        plan = DistributedDpsgdPlan(sigma, q, settings.clip, t)
        if cell.epsilon is not None:
            out["sigma"] = sigma
            out["epsilon_charged"] = plan.charge(settings.steps, settings.delta).epsilon
        if cell.method == "central":
            pooled_x = torch.cat([x for x, _ in sites])
            pooled_y = torch.cat([y for _, y in sites])
            model, eps = dc.train_central(
                spec,
                pooled_x,
                pooled_y,
                sigma=sigma,
                clip=settings.clip,
                rate_batches=settings.rate_batches,
                steps=settings.steps,
                lr=settings.lr,
                delta=settings.delta,
                seed=cell.seed,
            )
            out["opacus_epsilon"] = eps
        else:
            model = dc.train_distributed(
                spec,
                sites,
                plan,
                steps=settings.steps,
                lr=settings.lr,
                expected_batch=q * n_total,
                noise=cell.method == "distributed",
                rng=rng,
            )
    elif cell.method == "local":
        assert cell.epsilon is not None
        model, sigmas = dc.train_local(
            spec,
            sites,
            rounds=settings.local_rounds,
            batch=settings.local_batch,
            clip=settings.clip,
            lr=settings.local_lr,
            epsilon=cell.epsilon,
            delta=settings.delta,
        )
        out["local_sigmas"] = sigmas
    else:
        raise ValueError(f"unknown DP-SGD method {cell.method!r}")
    out["accuracy"] = count_correct(model, test_x, test_y) / int(test_y.shape[0])
    return out


def _calibration_cell(cell: PrivacyCell, settings: PrivacySettings) -> dict[str, Any]:
    import torch

    import spherecal.spherefed.reference as runner
    from spherecal.spherefed.calibrate import CCVRConfig, ccvr_calibrate, ffc_solve
    from spherecal.spherefed.fl import derive_seed
    from spherecal.spherefed.network import compute_features
    from spherecal.spherefed.privacy import calibration_compare as cc

    torch.manual_seed(cell.seed)
    config = _reference_config(
        settings,
        cell.seed,
        rounds=settings.calibration_rounds,
        lr=settings.calibration_lr,
        calibrations=("ffc",),  # the runner's own calibrations are not used here
    )
    model, _ = cc.train_fedavg(config)
    data = runner.prepare_data(config)
    dim, classes = model.feature_dim, data.train.num_classes
    val = cc.Split(compute_features(model, torch.from_numpy(data.validation.x)), data.validation.y)
    test = cc.Split(compute_features(model, torch.from_numpy(data.test.x)), data.test.y)
    init = model.head.weight.detach().double().numpy()
    none = {"validation": val.acc(init), "test": test.acc(init)}
    ffc_exact, ccvr_exact = cc.exact_sums(model, data, settings.quant_bits)
    w_ffc = ffc_solve(ffc_exact.V, ffc_exact.U, ridge=0.0)
    w_ccvr = ccvr_calibrate(
        ccvr_exact, init, replace(CCVRConfig(), seed=derive_seed(cell.seed, "ccvr", 0))
    )
    nonprivate = {
        "ffc": {"validation": val.acc(w_ffc), "test": test.acc(w_ffc)},
        "ccvr": {"validation": val.acc(w_ccvr), "test": test.acc(w_ccvr)},
    }
    rng = np.random.default_rng([cell.seed, 25])
    by_eps: dict[str, Any] = {}
    for eps in settings.release_epsilons:
        sigma = {
            kind: cc.release_sigma(
                kind,
                dim=dim,
                classes=classes,
                participants=settings.participants,
                min_contributors=settings.release_contributors,
                epsilon=eps,
                delta=settings.delta,
                max_examples=settings.max_examples,
                quant_bits=settings.quant_bits,
            )
            for kind in ("ffc", "ccvr")
        }
        draws = []
        for _ in range(settings.repeats):
            draws.append(
                {
                    "ffc": cc.ffc_variants(ffc_exact, sigma["ffc"], rng, val, test),
                    "ccvr": cc.ccvr_variants(
                        ccvr_exact, sigma["ccvr"], rng, init, cell.seed, val, test
                    ),
                }
            )
        entry: dict[str, Any] = {"sigma": sigma}
        for method in ("ffc", "ccvr"):
            entry[method] = {}
            for variant in draws[0][method]:
                scores = [d[method][variant] for d in draws]
                ships = [cc.shipped(s, none) for s in scores]
                ship_val = [
                    s["validation"] if s["validation"] > none["validation"] else none["validation"]
                    for s in scores
                ]
                entry[method][variant] = {
                    "test": float(np.nanmean([s["test"] for s in scores])),
                    "shipped": float(np.mean(ships)),
                    "shipped_validation_min": float(np.min(ship_val)),
                    "withheld": sum(1 for s in scores if not s["validation"] > none["validation"]),
                    "failed": sum(1 for s in scores if math.isnan(s["test"])),
                }
        by_eps[f"{eps:g}"] = entry
    return {"uncalibrated": none, "nonprivate": nonprivate, "by_epsilon": by_eps}


def run_privacy_cell(cell: PrivacyCell, settings: PrivacySettings) -> dict[str, Any]:
    """Run one cell; the record carries the cell, its result and its seconds."""
    t0 = time.perf_counter()
    if cell.method == "calibration":
        result = _calibration_cell(cell, settings)
    else:
        result = _dpsgd_cell(cell, settings)
    return {
        "cell": {"method": cell.method, "seed": cell.seed, "epsilon": cell.epsilon},
        **result,
        "seconds": time.perf_counter() - t0,
    }


def _run_and_store(cell: PrivacyCell, settings: PrivacySettings, path: str) -> dict[str, Any]:
    record = run_privacy_cell(cell, settings)
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)  # a cell on disk is always whole
    return record


def _worker_init(threads: int) -> None:
    import torch

    from spherecal.experiment.cells import limit_blas

    torch.set_num_threads(threads)
    limit_blas(threads)


def _outcome(record: dict[str, Any]) -> str:
    if "accuracy" in record:
        return f"accuracy {record['accuracy']:.4f}"
    return f"uncalibrated {record['uncalibrated']['test']:.4f}"


def run_privacy_cells(
    settings: PrivacySettings,
    cells_dir: Path,
    *,
    workers: int = 1,
    threads: int = 1,
    progress: Progress | None = None,
) -> tuple[dict[str, dict[str, Any]], int, int]:
    """Run every cell not yet on disk; ``(records by key, ran, cached)``. One progress
    line per finished cell with an ETA."""
    from spherecal.experiment.cells import fmt_time

    say = progress or (lambda _m: None)
    cells_dir.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, PrivacyCell]] = []
    for cell in privacy_cells(settings):
        key = cell.key(settings)
        path = cells_dir / f"{key}.json"
        if path.is_file():
            try:
                records[key] = json.loads(path.read_text())
                continue
            except (json.JSONDecodeError, OSError):
                pass  # a damaged cell is rerun
        todo.append((key, cell))
    cached = len(records)
    total = cached + len(todo)
    say(f"privacy: {total} cells: {cached} already done, {len(todo)} to run")
    t0 = time.perf_counter()

    def done(key: str, cell: PrivacyCell, record: dict[str, Any]) -> None:
        records[key] = record
        ran = len(records) - cached
        elapsed = time.perf_counter() - t0
        eta = elapsed / ran * (total - len(records))
        say(
            f"{len(records)}/{total} {cell.label()}: {_outcome(record)} "
            f"({record['seconds']:.0f}s) elapsed {fmt_time(elapsed)} ETA {fmt_time(eta)}"
        )

    if workers <= 1:
        for key, cell in todo:
            done(key, cell, _run_and_store(cell, settings, str(cells_dir / f"{key}.json")))
    else:
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=get_context("spawn"),
            initializer=_worker_init,
            initargs=(threads,),
        ) as pool:
            pending: dict[Future[dict[str, Any]], tuple[str, PrivacyCell]] = {
                pool.submit(_run_and_store, cell, settings, str(cells_dir / f"{key}.json")): (
                    key,
                    cell,
                )
                for key, cell in todo
            }
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    key, cell = pending.pop(fut)
                    done(key, cell, fut.result())
    return records, len(todo), cached
