"""The deterministic in-process reference runner — the ground truth for the service.

One function, :func:`run_reference`, runs a whole federation in one process with no
network: load → split (train / validation / test) → partition → federated training
(FedAvg or FedProx on sums) → per-participant CCVR statistics, summed → FFC
(``V = Σ_c M_c``, ``U[:, c] = S_c``) and CCVR calibration → accuracies. The
distributed service must reproduce its numbers from the same :class:`ReferenceConfig`:
every random choice is derived with :func:`spherecal.spherefed.fl.derive_seed` from
``config.seed`` and a label, never from global RNG state.

The **oracle** is SphereFed's "sanity check" (§5.4, Fig. 4): the classifier alone
fine-tuned by SGD on *all pooled real training features*, best of CE and MSE over a
small learning-rate grid, best chosen on the test split. It is deliberately an
optimistic upper bound (it sees real features and picks on test), as in the paper.
It is *not* the closed form on pooled features: that equals FFC by construction and
would prove nothing.

:func:`run_federation` is the same pipeline with the training algorithm and local
objective pluggable (any :class:`spherecal.spherefed.algorithms.ServerStrategy`: FedNova, FedOpt,
SCAFFOLD…; FedUV's or a temperature-scaled loss): the experiment harness
(``spherecal experiment``) uses it so that every method goes through the *same* data
preparation, statistics and calibration code. :func:`run_reference` is
``run_federation`` with FedAvg/FedProx from the config, bit for bit as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from spherecal.spherefed.algorithms.base import (
    AlgorithmSettings,
    Payload,
    ServerStrategy,
    add_payloads,
)
from spherecal.spherefed.algorithms.registry import configured_strategy
from spherecal.spherefed.calibrate import ccvr_calibrate, ffc_solve, retrain_classifier
from spherecal.spherefed.calibration_suite import (
    CLOSED_FORMS,
    head_accuracy,
    select_on_validation,
)
from spherecal.spherefed.data import (
    ArrayDataset,
    apply_feature_shift,
    feature_shift_offsets,
    load_dataset,
    stratified_split,
)
from spherecal.spherefed.fl import (
    LocalObjective,
    aggregated_keys,
    derive_seed,
    evaluate,
    load_state_vector,
    local_train,  # noqa: F401  (re-exported: the service imports it from here too)
    model_seeds,
    server_step,  # noqa: F401  (re-exported: the service imports it from here too)
    state_vector,
)
from spherecal.spherefed.network import (
    ModelSpec,
    Net,
    build_model,
    classifier_swapped,
    compute_features,
)
from spherecal.spherefed.partition import partition, partition_summary
from spherecal.spherefed.privacy.secure_sum import secure_sum_statistics
from spherecal.spherefed.reference_config import SELECT_BY, ReferenceConfig
from spherecal.spherefed.stats import CCVRStatistics, ccvr_statistics, statistics_entry_bound

Progress = Callable[[str], None]


@dataclass(frozen=True)
class FederationData:
    """The splits and the partition every participant's data comes from."""

    train: ArrayDataset
    validation: ArrayDataset
    test: ArrayDataset
    parts: list[np.ndarray]

    def participant(self, k: int) -> ArrayDataset:
        return self.train.subset(self.parts[k])


def prepare_data(config: ReferenceConfig) -> FederationData:
    """Load, split off validation from train (stratified), and partition the rest.

    For the ``synthetic`` dataset with ``feature_shift > 0``, participant ``k``'s
    training samples are then shifted by its own offset (a feature-shift non-IID
    setting), and every validation/test sample by the offset of a seeded random
    participant — the global test distribution is the mixture of all domains.
    """
    splits = load_dataset(
        config.dataset,
        root=config.data_root,
        seed=config.seed,
        synthetic=config.synthetic,
        samples=config.samples,
    )
    train_idx, val_idx = stratified_split(
        splits.train.y,
        test_fraction=config.validation_fraction,
        seed=derive_seed(config.seed, "validation"),
    )
    train = splits.train.subset(train_idx)
    parts = partition(
        train.y,
        config.participants,
        scheme=config.partition,
        alpha=config.alpha if config.partition == "dirichlet" else None,
        shards_per_client=config.shards_per_client if config.partition == "shards" else None,
        seed=derive_seed(config.seed, "partition"),
    )
    validation, test = splits.train.subset(val_idx), splits.test
    if config.dataset == "synthetic" and config.synthetic.feature_shift > 0:
        train, validation, test = _shift_features(config, train, validation, test, parts)
    return FederationData(train, validation, test, parts)


def _shift_features(
    config: ReferenceConfig,
    train: ArrayDataset,
    validation: ArrayDataset,
    test: ArrayDataset,
    parts: list[np.ndarray],
) -> tuple[ArrayDataset, ArrayDataset, ArrayDataset]:
    dim = int(np.prod(train.x.shape[1:]))
    offsets = feature_shift_offsets(
        config.participants,
        dim,
        config.synthetic.feature_shift,
        seed=derive_seed(config.seed, "feature_shift"),
    )
    owner = np.zeros(len(train), dtype=np.int64)
    for k, idx in enumerate(parts):
        owner[idx] = k
    rng = np.random.default_rng(derive_seed(config.seed, "feature_shift", "eval"))
    val_dom = rng.integers(0, config.participants, size=len(validation))
    test_dom = rng.integers(0, config.participants, size=len(test))
    return (
        apply_feature_shift(train, owner, offsets),
        apply_feature_shift(validation, val_dom, offsets),
        apply_feature_shift(test, test_dom, offsets),
    )


def model_spec(config: ReferenceConfig, data: FederationData) -> ModelSpec:
    classifier_seed, init_seed = model_seeds(config.seed)
    c, h, w = data.train.image_shape
    return ModelSpec(
        extractor=config.model,
        head=config.head,
        norm=config.norm,
        classifier=config.classifier,
        classifier_seed=classifier_seed,
        init_seed=init_seed,
        num_classes=data.train.num_classes,
        in_channels=c,
        image_size=(h, w),
    )


def select_participants(config: ReferenceConfig, round_index: int) -> list[int]:
    """Seeded per-round sample of ``max(1, round(fraction·N))`` participants, sorted."""
    n = config.participants
    count = max(1, round(config.sample_fraction * n))
    if count >= n:
        return list(range(n))
    rng = np.random.default_rng(derive_seed(config.seed, "sample", round_index))
    return sorted(int(k) for k in rng.choice(n, size=count, replace=False))


def _tensors(ds: ArrayDataset) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(ds.x), torch.from_numpy(ds.y)


def _accuracy_with(model: Net, weight: np.ndarray, x: torch.Tensor, y: torch.Tensor) -> float:
    with classifier_swapped(model, weight):
        return evaluate(model, x, y)


def _oracle(
    model: Net, data: FederationData, config: ReferenceConfig
) -> tuple[float, dict[str, Any]]:
    z = compute_features(model, torch.from_numpy(data.train.x))
    init = model.head.weight.detach().double().numpy()
    x_test, y_test = _tensors(data.test)
    grid = []
    for loss in ("ce", "mse"):
        for lr in config.oracle_lrs:
            try:
                w = retrain_classifier(
                    z,
                    data.train.y,
                    init,
                    loss=loss,
                    lr=lr,
                    epochs=config.oracle_epochs,
                    seed=derive_seed(config.seed, "oracle"),
                )
                acc = _accuracy_with(model, w, x_test, y_test)
            except FloatingPointError:
                acc = float("nan")
            grid.append({"loss": loss, "lr": lr, "accuracy": acc})
    finite = [g for g in grid if np.isfinite(g["accuracy"])]
    best = max(finite, key=lambda g: g["accuracy"]) if finite else grid[0]
    return float(best["accuracy"]), {"best": best, "grid": grid}


def run_reference(config: ReferenceConfig, *, progress: Progress | None = None) -> dict[str, Any]:
    """Run one federation end to end and return the JSON-serialisable result."""
    return run_federation(config, progress=progress)


def default_strategy(config: ReferenceConfig) -> ServerStrategy:
    """The strategy :func:`run_reference` uses for ``config.algorithm`` (the registry's
    ``configured_strategy``): FedProx with ``config.prox_mu``, FedAdam / FedYogi with
    server η ``config.fedopt_lr`` (the paper's β₁, β₂, τ), SCAFFOLD with
    ``N = config.participants``, FedAvg / FedNova as they are."""
    return configured_strategy(
        config.algorithm,
        AlgorithmSettings(
            prox_mu=config.prox_mu,
            fedopt_lr=config.fedopt_lr,
            num_participants=config.participants,
        ),
    )


def _safe_calibration(fn: Callable[[], np.ndarray], robust: bool) -> np.ndarray | None:
    if not robust:
        return fn()
    try:
        return fn()
    except (FloatingPointError, ValueError, np.linalg.LinAlgError):
        return None


def run_federation(
    config: ReferenceConfig,
    *,
    strategy: ServerStrategy | None = None,
    objective: LocalObjective | None = None,
    oracle: bool = True,
    robust_calibration: bool = False,
    describe: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """One federation with a pluggable algorithm and local objective, then calibration.

    ``strategy`` (default :func:`default_strategy`) supplies the local and server
    steps — the server only ever sees the *sums* of the participants' payloads;
    ``objective`` replaces ``config.loss`` in local training (FedUV, CE with a
    temperature). Data, model, statistics, FFC, CCVR and the oracle are exactly
    :func:`run_reference`'s. ``oracle=False`` skips the (costly) oracle;
    ``robust_calibration=True`` records a failed calibration (e.g. CCVR retraining
    that diverges on large raw features) as NaN instead of raising. With
    ``strategy`` / ``objective`` / ``describe`` given, the result gains a
    ``"method"`` entry saying what ran (``settings.algorithm`` is then only the
    reference runner's field).

    Raises ``FloatingPointError`` when training diverges (a local or server step
    leaves NaN/Inf).
    """
    say = progress or (lambda _msg: None)
    custom = strategy is not None or objective is not None or describe is not None
    strat = strategy if strategy is not None else default_strategy(config)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    data = prepare_data(config)
    sizes = [len(p) for p in data.parts]
    say(
        f"data: {config.dataset} train={len(data.train)} val={len(data.validation)} "
        f"test={len(data.test)}; {config.participants} participants ({config.partition}"
        + (f", alpha={config.alpha}" if config.partition == "dirichlet" else "")
        + f"), sizes min/median/max {min(sizes)}/{int(np.median(sizes))}/{max(sizes)}"
    )
    model = build_model(model_spec(config, data))
    keys = aggregated_keys(model)
    global_vec = state_vector(model, keys)
    local_cfg = config.local_config()
    client_data = [_tensors(data.participant(k)) for k in range(config.participants)]
    x_test, y_test = _tensors(data.test)
    x_val, y_val = _tensors(data.validation)
    timings["setup_s"] = time.perf_counter() - t0

    per_round = []
    client_states: dict[int, dict[str, np.ndarray]] = {}
    t_train = time.perf_counter()
    for r in range(config.rounds):
        t_round = time.perf_counter()
        selected = select_participants(config, r)
        broadcast = strat.broadcast(global_vec)
        sums: Payload | None = None
        losses = []
        for k in selected:
            load_state_vector(model, global_vec, keys)
            xk, yk = client_data[k]
            res = strat.local_step(
                model,
                xk,
                yk,
                local_cfg,
                seed=derive_seed(config.seed, "train", r, k),
                broadcast=broadcast,
                client_state=client_states.get(k),
                objective=objective,
            )
            if res.client_state is not None:
                client_states[k] = res.client_state
            sums = add_payloads(sums, res.payload)
            losses.append(res.mean_loss)
        assert sums is not None
        global_vec = strat.server_step(global_vec, sums, num_selected=len(selected))
        if not np.isfinite(global_vec).all():
            raise FloatingPointError(
                f"{strat.name}: the server step produced NaN/Inf in round {r + 1}; lower the lr"
            )
        load_state_vector(model, global_vec, keys)
        acc = evaluate(model, x_test, y_test)
        per_round.append(
            {
                "round": r + 1,
                "participants": selected,
                "train_loss": float(np.mean(losses)),
                "test_accuracy": acc,
                "seconds": time.perf_counter() - t_round,
            }
        )
        say(
            f"round {r + 1}/{config.rounds}: loss {np.mean(losses):.4f} "
            f"test acc {acc:.4f} ({time.perf_counter() - t_round:.1f}s)"
        )
    timings["train_s"] = time.perf_counter() - t_train

    # Calibration statistics, one participant at a time, summed (what secure
    # aggregation will deliver). FFC follows exactly from the CCVR sums.
    t_stats = time.perf_counter()
    C, dim = data.train.num_classes, model.feature_dim
    parts = [ccvr_statistics(compute_features(model, xk), yk.numpy(), C) for xk, yk in client_data]
    if config.secure_sum:
        # the bound the service derives: no site holds more of a split than the dataset
        # has (`spherecal simulate`'s max_examples_per_site; validation came from train)
        max_examples = max(len(data.train) + len(data.validation), len(data.test))
        total = secure_sum_statistics(
            parts, bound=statistics_entry_bound(config.head, max_examples)
        )
    else:
        total = CCVRStatistics(np.zeros(C), np.zeros((C, dim)), np.zeros((C, dim, dim)))
        for part in parts:
            total = total + part
    ffc = total.to_ffc()
    timings["statistics_s"] = time.perf_counter() - t_stats

    t_cal = time.perf_counter()
    cals = config.calibrations
    w_ffc = (
        _safe_calibration(
            lambda: ffc_solve(ffc.V, ffc.U, ridge=config.ffc_ridge), robust_calibration
        )
        if "ffc" in cals
        else None
    )
    timings["ffc_s"] = time.perf_counter() - t_cal
    t_cal = time.perf_counter()
    init = model.head.weight.detach().double().numpy()
    ccvr_cfg = replace(config.ccvr, seed=derive_seed(config.seed, "ccvr", config.ccvr.seed))
    w_ccvr = (
        _safe_calibration(lambda: ccvr_calibrate(total, init, ccvr_cfg), robust_calibration)
        if "ccvr" in cals
        else None
    )
    timings["ccvr_s"] = time.perf_counter() - t_cal

    def with_weight(w: np.ndarray | None, x: torch.Tensor, y: torch.Tensor) -> float:
        return float("nan") if w is None else _accuracy_with(model, w, x, y)

    accuracy = {"none": evaluate(model, x_test, y_test)}
    validation = {"none": evaluate(model, x_val, y_val)}
    for name, w in (("ffc", w_ffc), ("ccvr", w_ccvr)):
        if name in cals:
            accuracy[name] = with_weight(w, x_test, y_test)
            validation[name] = with_weight(w, x_val, y_val)
    chosen: dict[str, Any] = {}
    closed = [c for c in CLOSED_FORMS if c in cals]
    if closed:
        t_cal = time.perf_counter()
        z_val = compute_features(model, x_val)
        z_test = compute_features(model, x_test)
        for name in closed:
            grid = config.ridge_grid if name == "ffc_bias" else config.shrinkage_grid
            sel = select_on_validation(name, total, grid, z_val, data.validation.y)
            if sel.head is None and not robust_calibration:
                raise ValueError(f"{name}: every grid point failed: {sel.grid}")
            validation[name] = sel.validation
            accuracy[name] = (
                float("nan") if sel.head is None else head_accuracy(sel.head, z_test, data.test.y)
            )
            chosen[name] = sel.to_json()
        timings["closed_forms_s"] = time.perf_counter() - t_cal
    oracle_info: dict[str, Any] | None = None
    if oracle:
        t_or = time.perf_counter()
        accuracy["oracle"], oracle_info = _oracle(model, data, config)
        timings["oracle_s"] = time.perf_counter() - t_or
    timings["total_s"] = time.perf_counter() - t0
    say(
        "accuracy: "
        + ", ".join(f"{k} {v:.4f}" for k, v in accuracy.items())
        + f" (total {timings['total_s']:.1f}s)"
    )
    result: dict[str, Any] = {
        "settings": config.to_json(),
        "accuracy": accuracy,
        "validation_accuracy": validation,
        "per_round": per_round,
    }
    if chosen:
        result["calibration"] = chosen
    if oracle_info is not None:
        result["oracle"] = oracle_info
    result.update(
        {
            "ccvr": {
                "empty_classes": [int(c) for c in np.flatnonzero(total.counts == 0)],
                "singleton_classes": [int(c) for c in np.flatnonzero(total.counts == 1)],
            },
            "partition": {
                "sizes": sizes,
                "class_counts": partition_summary(data.train.y, data.parts, C).tolist(),
            },
            "model": {"feature_dim": dim, "num_classes": C, "parameters": int(global_vec.size)},
            "timings": timings,
        }
    )
    if custom:
        result["method"] = {
            "algorithm": strat.name,
            "strategy": strat.hyperparameters(),
            **dict(describe or {}),
        }
    return result


def run_reference_sweep(
    config: ReferenceConfig,
    lrs: Sequence[float],
    *,
    select_by: str = "none",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run once per learning rate; report all, select on *validation* accuracy.

    The MSE loss on unit-norm outputs needs much larger learning rates than CE
    (FedFN appendix D.5), so comparing methods at one shared lr would be unfair to
    one of them. Selection uses the held-out validation split, never the test split.
    """
    if select_by not in SELECT_BY:
        raise ValueError(f"select_by must be one of {SELECT_BY}, got {select_by!r}")
    if not lrs:
        raise ValueError("need at least one learning rate")
    say = progress or (lambda _msg: None)
    runs = []
    for i, lr in enumerate(lrs):
        say(f"== lr {lr} ({i + 1}/{len(lrs)}) ==")
        try:
            runs.append(run_reference(replace(config, lr=float(lr)), progress=progress))
        except FloatingPointError as exc:
            say(f"lr {lr}: diverged ({exc})")
            runs.append({"settings": replace(config, lr=float(lr)).to_json(), "diverged": True})
    ok = [r for r in runs if not r.get("diverged")]
    if not ok:
        raise FloatingPointError(f"every learning rate diverged: {list(lrs)}")
    best = max(ok, key=lambda r: r["validation_accuracy"][select_by])
    result = dict(best)
    result["lr_sweep"] = [
        {
            "lr": r["settings"]["lr"],
            "diverged": bool(r.get("diverged", False)),
            "validation_accuracy": r.get("validation_accuracy"),
            "accuracy": r.get("accuracy"),
        }
        for r in runs
    ]
    result["selected"] = {"lr": best["settings"]["lr"], "by": f"validation_accuracy.{select_by}"}
    return result
