"""DP calibration mechanisms compared on the same noisy sums (the privacy table,
``spherecal experiment --table privacy``, and ``bench/dp_calibration.py``).

A trained model's sites compute their exact quantised statistics (as the
participants do for a DP release, :mod:`.sensitivity`); for each ε per release the
release is planned as the service plans it (:func:`.plan.plan_calibration_release`:
n sites, t guaranteed contributors, Skellam, δ), the *sum* of the sites' noise is
added to the summed statistics, and every variant below is solved on the same noisy
sums, so the variants differ only in the mechanism:

FFC  ``service``      ridge 2√l·σ on the raw noisy V (the coordinator's rule)
     ``val_ridge``    ridge chosen on validation from {¼, ½, 1, 2, 4}·2√l·σ
     ``psd``          V projected onto the PSD cone first, then the service's ridge
     ``psd_val``      V projected onto the PSD cone first, then ``val_ridge``
     ``psd_fine``     the same on a finer grid reaching down to 2√l·σ/64
     ``cutoff``       V's eigen-directions with eigenvalue ≤ τ dropped (no ridge),
                      τ chosen on validation from {½, 1, 1½, 2, 3}·2√l·σ
     ``alloc_val``    the release's sensitivity spent on V and U only (the count,
                      which FFC does not use, scaled by 0.1 before the noise and back
                      after: V and U then carry ≈ 0.82σ)
CCVR ``service``      projected (counts ≥ 1 kept, means in the unit ball, PSD scatter;
                      :mod:`.projection`) — the service's rule
     ``trace``        the same, plus each class scatter rescaled to its known trace
     ``min3σ``        classes with a noisy count below 3σ treated as empty
     ``trace_min3σ``  both

Each variant also has a ``shipped`` accuracy: what the validation gate ships (the
calibrated head when its validation accuracy beats the uncalibrated model's, else
the uncalibrated model) — the service's never-a-loss rule
(``coordinator/driver/validation_gate.py``).

The noise: the sum of the sites' exact Skellam noise has the planned total variance;
at these variances (≥ 2^38 ring units²) it is Gaussian to any precision that matters
for accuracy, so the sum is drawn as a Gaussian of exactly the planned variance.
Off-diagonal triangle entries are sent √2-scaled (isometric layout), as in the
service.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from spherecal.spherefed import reference as runner
from spherecal.spherefed.algorithms.base import Payload
from spherecal.spherefed.algorithms.strategies import FedAvg
from spherecal.spherefed.calibrate import (
    CCVRConfig,
    SingularStatisticsWarning,
    ccvr_calibrate,
    ffc_solve,
)
from spherecal.spherefed.calibration_suite import head_accuracy
from spherecal.spherefed.discriminant import CalibratedHead
from spherecal.spherefed.fl import aggregated_keys, derive_seed, load_state_vector
from spherecal.spherefed.network import Net, build_model, compute_features
from spherecal.spherefed.privacy.plan import plan_calibration_release
from spherecal.spherefed.privacy.projection import project_ccvr, project_ffc
from spherecal.spherefed.privacy.sensitivity import exact_ccvr_statistics, exact_ffc_statistics
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics

__all__ = [
    "Scores",
    "Split",
    "ccvr_variants",
    "exact_sums",
    "ffc_variants",
    "release_sigma",
    "shipped",
    "train_fedavg",
]

RIDGE_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
FINE_FACTORS = (1 / 64, 1 / 16, 1 / 8, 0.25, 0.5, 1.0, 2.0)
CUT_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0)
COUNT_WEIGHT = 0.1  # alloc_val: the count's share of the sensitivity

Scores = dict[str, float]
"""``{"validation": …, "test": …}`` accuracies of one head."""
Array = npt.NDArray[np.float64]


def _linear(weight: Array) -> CalibratedHead:
    return CalibratedHead(weight=weight, bias=np.zeros(weight.shape[0]))


@dataclass(frozen=True)
class Split:
    """Features and labels of one evaluation split, and a head's accuracy on it."""

    z: Array
    y: npt.NDArray[Any]

    def acc(self, weight: Array) -> float:
        return head_accuracy(_linear(weight), self.z, self.y)


class _KeepLast(FedAvg):
    """FedAvg that remembers its last global vector (the trained model's weights)."""

    last: Array | None = None

    def server_step(self, global_vector: Array, sums: Payload, *, num_selected: int) -> Array:
        out = super().server_step(global_vector, sums, num_selected=num_selected)
        self.last = out
        return out


def train_fedavg(config: runner.ReferenceConfig) -> tuple[Net, dict[str, Any]]:
    """The reference federation (FedAvg) and its trained model; raises if the rebuilt
    model's test accuracy is not the federation's own (a layout mismatch)."""
    if config.algorithm != "fedavg":
        raise ValueError(f"train_fedavg trains FedAvg, not {config.algorithm!r}")
    keep = _KeepLast()
    result = runner.run_federation(config, strategy=keep, oracle=False)
    assert keep.last is not None
    data = runner.prepare_data(config)
    model = build_model(runner.model_spec(config, data))
    load_state_vector(model, keep.last, aggregated_keys(model))
    test = Split(compute_features(model, torch.from_numpy(data.test.x)), data.test.y)
    got = test.acc(model.head.weight.detach().double().numpy())
    if abs(got - float(result["accuracy"]["none"])) > 1e-9:
        raise RuntimeError(f"rebuilt model scores {got}, the federation {result['accuracy']}")
    return model, result


def exact_sums(
    model: Net, data: runner.FederationData, quant_bits: int
) -> tuple[FFCStatistics, CCVRStatistics]:
    """The federation's exact quantised FFC and CCVR sums (each site's as a
    participant computes it for a DP release, added)."""
    classes = data.train.num_classes
    ffc: FFCStatistics | None = None
    ccvr: CCVRStatistics | None = None
    for k in range(len(data.parts)):
        ds = data.participant(k)
        z = compute_features(model, torch.from_numpy(ds.x))
        f = exact_ffc_statistics(z, ds.y, classes, quant_bits=quant_bits)
        c = exact_ccvr_statistics(z, ds.y, classes, quant_bits=quant_bits)
        ffc = f if ffc is None else ffc + f
        ccvr = c if ccvr is None else ccvr + c
    assert ffc is not None and ccvr is not None
    return ffc, ccvr


def release_sigma(
    kind: str,
    *,
    dim: int,
    classes: int,
    participants: int,
    min_contributors: int,
    epsilon: float,
    delta: float,
    max_examples: int,
    quant_bits: int,
) -> float:
    """The standard deviation (real units) of the summed noise on every entry of a
    ``kind`` release planned by the service for ε per release, all sites contributing."""
    plan = plan_calibration_release(
        kind,
        dim=dim,
        num_classes=classes,
        participants=participants,
        min_contributors=min_contributors,
        epsilon_target=epsilon,
        delta=delta,
        max_examples=max_examples,
        mechanism="skellam",
        quant_bits=quant_bits,
    )
    return math.sqrt(plan.noise.total_variance(participants)) / 2.0**plan.scale_bits


def _noisy(vector: Array, sigma: Array | float, rng: np.random.Generator) -> Array:
    return vector + rng.normal(size=vector.shape) * sigma


def ffc_variants(
    exact: FFCStatistics, sigma: float, rng: np.random.Generator, val: Split, test: Split
) -> dict[str, Scores]:
    """Every FFC variant (module docstring) on one draw of the noisy sums."""
    dim, classes = exact.dim, exact.num_classes
    packed = exact.pack(isometric=True)
    noisy = FFCStatistics.unpack(_noisy(packed, sigma, rng), dim, classes, isometric=True)
    base = 2.0 * math.sqrt(dim) * sigma
    out: dict[str, Scores] = {}

    def solve(stats: FFCStatistics, ridge: float) -> Array:
        with warnings.catch_warnings():  # a noisy V is often indefinite: expected here
            warnings.simplefilter("ignore", SingularStatisticsWarning)
            return ffc_solve(stats.V, stats.U, ridge=ridge)

    def by_validation(
        stats: FFCStatistics, scale: float, factors: tuple[float, ...] = RIDGE_FACTORS
    ) -> Scores:
        best: tuple[float, Array] | None = None
        for f in factors:
            w = solve(stats, f * scale)
            a = val.acc(w)
            if best is None or a > best[0]:
                best = (a, w)
        assert best is not None
        return {"validation": best[0], "test": test.acc(best[1])}

    w = solve(noisy, base)
    out["service"] = {"validation": val.acc(w), "test": test.acc(w)}
    out["val_ridge"] = by_validation(noisy, base)
    projected, _ = project_ffc(noisy)
    w = solve(projected, base)
    out["psd"] = {"validation": val.acc(w), "test": test.acc(w)}
    out["psd_val"] = by_validation(projected, base)
    out["psd_fine"] = by_validation(projected, base, FINE_FACTORS)
    # spectral cut-off: directions of V whose eigenvalue is not above the noise's
    # spectral norm carry noise, not signal; solve on the others (τ on validation)
    eigvals, eigvecs = np.linalg.eigh(0.5 * (noisy.V + noisy.V.T))
    best: tuple[float, Array] | None = None
    for f in CUT_FACTORS:
        keep = eigvals > f * base
        if not keep.any():
            continue
        basis = eigvecs[:, keep]
        w = (basis @ ((basis.T @ noisy.U) / eigvals[keep][:, None])).T
        a = val.acc(w)
        if best is None or a > best[0]:
            best = (a, w)
    if best is not None:
        out["cutoff"] = {"validation": best[0], "test": test.acc(best[1])}
    # the count's weight 0.1, V and U share the rest of the squared sensitivity 3
    w_vu = math.sqrt((3.0 - COUNT_WEIGHT**2) / 2.0)
    t = dim * (dim + 1) // 2
    per_entry = np.concatenate(
        [np.full(1, sigma / COUNT_WEIGHT), np.full(t + dim * classes, sigma / w_vu)]
    )
    alloc = FFCStatistics.unpack(_noisy(packed, per_entry, rng), dim, classes, isometric=True)
    out["alloc_val"] = by_validation(alloc, base / w_vu)
    return out


def ccvr_variants(
    exact: CCVRStatistics,
    sigma: float,
    rng: np.random.Generator,
    init: Array,
    seed: int,
    val: Split,
    test: Split,
) -> dict[str, Scores]:
    """Every CCVR variant (module docstring) on one draw of the noisy sums; a variant
    whose retraining fails scores NaN."""
    dim, classes = exact.dim, exact.num_classes
    noisy = CCVRStatistics.unpack(
        _noisy(exact.pack(isometric=True), sigma, rng), dim, classes, isometric=True
    )
    cfg = replace(CCVRConfig(), seed=derive_seed(seed, "ccvr", 0))
    out: dict[str, Scores] = {}
    for name, trace, min_count in (
        ("service", False, 1.0),
        ("trace", True, 1.0),
        ("min3σ", False, max(1.0, 3.0 * sigma)),
        ("trace_min3σ", True, max(1.0, 3.0 * sigma)),
    ):
        stats, _ = project_ccvr(noisy, unit_norm=True, min_count=min_count, match_trace=trace)
        try:
            w = ccvr_calibrate(stats, init, cfg)
            out[name] = {"validation": val.acc(w), "test": test.acc(w)}
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            out[name] = {"validation": math.nan, "test": math.nan}
    return out


def shipped(result: Scores, none: Scores) -> float:
    """The validation gate's DP rule: the calibrated head's test accuracy when its
    validation accuracy beats the uncalibrated model's, else the uncalibrated one's
    (a NaN — failed — head is never shipped)."""
    return result["test"] if result["validation"] > none["validation"] else none["test"]
