"""Empirical DP audit of the noisy FFC release with a canary (a lower bound on ε).

An upper bound (the accountant's ε) is a proof; this is evidence that the code does
what the proof assumes. The audit plays the DP distinguishing game many times: a
federation of small synthetic participants releases its noisy FFC statistic, with a
unit-norm canary example ``(z_c, y_c)`` at participant 0 ("in") or without it
("out"). Each release goes through the participants' code path — exact quantised
statistics (:func:`~spherecal.spherefed.privacy.sensitivity.exact_ffc_statistics`), isometric
packing, :func:`spherecal.crypto.ring.encode`, noise from :func:`spherecal.crypto.dp.sample_noise`
(the exact samplers, OS-keyed), :func:`spherecal.crypto.ring.add_noise`, the wrapping ring sum
that secure aggregation computes (masks cancel exactly, so summing noisy encodings
in ``Z_2^64`` *is* its output), and :func:`spherecal.crypto.ring.decode`.

The attacker knows everything except the canary bit and scores each release by a
likelihood-ratio statistic:

* ``"full"`` (default): the projection of ``x̂ - x_out`` on the canary's contribution
  ``c`` to all released blocks (count, ``z zᵀ``, ``z e_yᵀ``). For (near-)Gaussian
  noise this *is* the Neyman–Pearson likelihood-ratio test, so it is the statistic
  that can make the audit tight.
* ``"v_projection"``: ``z_cᵀ (V̂ - V_out) z_c`` (the issue's statistic), which uses only
  the ``V`` block — about a third of the signal energy, so expect a looser bound.

Trials are split in half: the first half picks the decision threshold, the second
half evaluates it, so the threshold search does not bias the bound. Two lower bounds,
each at confidence ``1 - β/2`` (Clopper–Pearson bounds at ``β/4`` on each error rate,
Bonferroni over the two rates and the two methods; overall ``1 - β``):

* **Clopper–Pearson** (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021): any
  ``(ε, δ)``-DP test has ``FPR + e^ε FNR >= 1 - δ`` and ``FNR + e^ε FPR >= 1 - δ``; with
  upper confidence bounds on FPR and FNR this gives ``ε >= ln((1 - δ - FPR⁺)/FNR⁺)``
  (and symmetrically). No assumption on the mechanism.
* **Gaussian DP** (Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini & Terzis
  2023, "Tight Auditing of Differentially Private Machine Learning", USENIX Security
  2023): a ``μ``-GDP test has ``FNR = Φ(Φ⁻¹(1 - FPR) - μ)``, so
  ``μ >= Φ⁻¹(1 - FPR⁺) - Φ⁻¹(FNR⁺)``, converted to ε at δ with Dong, Roth & Su's
  formula. It assumes the trade-off curve is Gaussian-shaped — true to within far
  less than the sampling error for Skellam noise of large variance.

``epsilon_empirical_lower`` is the larger of the two; ``tightness`` is its ratio to
``epsilon_claimed`` (the accountant's ε for the noise actually in these releases).
A lower bound above the claim means the implementation leaks more than its
accounting says — a bug — and the result says so (``exceeds_claim``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.crypto.dp import DEFAULT_MECHANISM, NoisePlan, plan_noise, sample_noise
from spherecal.crypto.entropy import RandomSource
from spherecal.crypto.ring import RING_DTYPE, add_noise, decode, encode
from spherecal.spherefed.privacy.accounting import gdp_epsilon
from spherecal.spherefed.privacy.plan import CalibrationPlan, plan_calibration_release
from spherecal.spherefed.privacy.sensitivity import exact_ffc_statistics, quantize_unit_features
from spherecal.spherefed.stats import FFCStatistics

__all__ = ["AuditResult", "AuditSettings", "clopper_pearson_upper", "run_canary_audit"]

STATISTICS = ("full", "v_projection")
_NORMAL = NormalDist()


@dataclass(frozen=True)
class AuditSettings:
    """A small federation and audit parameters (defaults run in a few seconds)."""

    dim: int = 4
    num_classes: int = 2
    participants: int = 3
    min_contributors: int = 2
    examples_per_participant: int = 16
    epsilon: float = 4.0
    delta: float = 1e-5
    mechanism: str = DEFAULT_MECHANISM
    quant_bits: int = 10
    trials: int = 4000
    """Releases per world (in and out); half select the threshold, half evaluate."""
    confidence: float = 0.95
    statistic: str = "full"
    noise_scale: float = 1.0
    """Multiplies the planned noise variance (``< 1`` plants an under-noised release)."""
    data_seed: int = 0
    """Seeds the synthetic data and the canary only — never the noise."""

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {self.statistic!r}")
        if self.trials < 20:
            raise ValueError("need at least 20 trials per world")
        if not 0 < self.confidence < 1:
            raise ValueError("confidence must be in (0, 1)")


@dataclass(frozen=True)
class AuditResult:
    epsilon_claimed: float
    epsilon_empirical_lower: float
    tightness: float
    epsilon_lower_clopper_pearson: float
    epsilon_lower_gdp: float
    mu_lower: float
    mu_claimed_gaussian: float
    """``‖c‖/σ``: the GDP parameter of the attack's 1-D Gaussian view, for reference."""
    exceeds_claim: bool
    delta: float
    confidence: float
    statistic: str
    trials_per_world: int
    thresholds: dict[str, float]
    rates: dict[str, dict[str, float]]
    plan: dict[str, Any]
    settings: dict[str, Any]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------- statistics
def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided ``1 - alpha`` Clopper–Pearson upper bound on a binomial proportion:
    the ``p`` with ``P(Bin(trials, p) <= successes) = alpha``, which is the
    ``1 - alpha`` quantile of ``Beta(successes + 1, trials - successes)`` (SciPy)."""
    from scipy.stats import beta

    if not 0 <= successes <= trials or trials < 1:
        raise ValueError("need 0 <= successes <= trials, trials >= 1")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if successes == trials:
        return 1.0
    return float(beta.ppf(1.0 - alpha, successes + 1, trials - successes))


def _eps_from_rates(fpr: float, fnr: float, delta: float) -> float:
    best = 0.0
    for a, b in ((fpr, fnr), (fnr, fpr)):
        if b > 0 and 1.0 - delta - a > b:
            best = max(best, math.log((1.0 - delta - a) / b))
    return best


def _mu_from_rates(fpr: float, fnr: float) -> float:
    lo = 1e-12
    f, n = min(max(fpr, lo), 1 - lo), min(max(fnr, lo), 1 - lo)
    return max(0.0, _NORMAL.inv_cdf(1.0 - f) - _NORMAL.inv_cdf(n))


def _errors(
    s_out: npt.NDArray[np.float64], s_in: npt.NDArray[np.float64], threshold: float
) -> tuple[int, int]:
    """(false positives among out, false negatives among in) for "in iff s > threshold"."""
    return int(np.count_nonzero(s_out > threshold)), int(np.count_nonzero(s_in <= threshold))


def _bounds(
    s_out: npt.NDArray[np.float64],
    s_in: npt.NDArray[np.float64],
    threshold: float,
    alpha: float,
    delta: float,
) -> tuple[float, float, float, float]:
    fp, fn = _errors(s_out, s_in, threshold)
    fpr_up = clopper_pearson_upper(fp, s_out.size, alpha)
    fnr_up = clopper_pearson_upper(fn, s_in.size, alpha)
    return (
        _eps_from_rates(fpr_up, fnr_up, delta),
        gdp_epsilon(_mu_from_rates(fpr_up, fnr_up), delta),
        fpr_up,
        fnr_up,
    )


# ------------------------------------------------------------------ releases
def _synthetic(settings: AuditSettings) -> tuple[list[FFCStatistics], FFCStatistics, Any]:
    rng = np.random.default_rng(settings.data_seed)  # data only, never noise
    stats = []
    for _ in range(settings.participants):
        z = rng.normal(size=(settings.examples_per_participant, settings.dim))
        y = rng.integers(0, settings.num_classes, size=settings.examples_per_participant)
        stats.append(
            exact_ffc_statistics(z, y, settings.num_classes, quant_bits=settings.quant_bits)
        )
    canary_z = rng.normal(size=(1, settings.dim))
    canary_y = np.array([int(rng.integers(0, settings.num_classes))])
    canary = exact_ffc_statistics(
        canary_z, canary_y, settings.num_classes, quant_bits=settings.quant_bits
    )
    zq = np.ldexp(
        quantize_unit_features(canary_z, settings.quant_bits)[0].astype(np.float64),
        -settings.quant_bits,
    )
    return stats, canary, zq


def _noisy_releases(
    encoded: list[npt.NDArray[np.uint64]],
    noise: NoisePlan,
    trials: int,
    scale_bits: int,
    source: RandomSource,
) -> npt.NDArray[np.float64]:
    """``trials`` decoded noisy sums, each participant's noise added with ``add_noise``."""
    n = len(encoded)
    draws = sample_noise(noise, count=trials * n, source=source)
    out = np.empty((trials, encoded[0].shape[0]), dtype=np.float64)
    for t in range(trials):
        total = np.zeros(encoded[0].shape[0], dtype=RING_DTYPE)
        for p in range(n):
            noisy = encoded[p].copy()
            add_noise(noisy, draws[t * n + p], noise_bound=noise.noise_bound)
            np.add(total, noisy, out=total)  # wraps mod 2^64, as the masked sum does
        out[t] = decode(total, scale_bits=scale_bits)
    return out


def run_canary_audit(
    settings: AuditSettings | None = None, *, source: RandomSource | None = None
) -> AuditResult:
    """Run the audit (module docstring) and return its result.

    ``source`` lets tests make the noise reproducible (``RandomSource.deterministic``);
    by default the noise is OS-keyed, exactly as a participant's."""
    cfg = settings or AuditSettings()
    noise_source = source if source is not None else RandomSource()
    started = time.perf_counter()
    plan: CalibrationPlan = plan_calibration_release(
        "ffc",
        dim=cfg.dim,
        num_classes=cfg.num_classes,
        participants=cfg.participants,
        min_contributors=cfg.min_contributors,
        epsilon_target=cfg.epsilon,
        delta=cfg.delta,
        max_examples=cfg.examples_per_participant + 1,
        mechanism=cfg.mechanism,
        quant_bits=cfg.quant_bits,
    )
    noise = plan.noise
    if cfg.noise_scale != 1.0:
        noise = plan_noise(
            plan.noise.target_variance * cfg.noise_scale,
            min_contributors=noise.min_contributors,
            participants=noise.participants,
            length=noise.length,
            mechanism=noise.mechanism,
        )
        noise = replace(noise, noise_bound=max(noise.noise_bound, 1))
    stats, canary, zq = _synthetic(cfg)
    f, bound = plan.scale_bits, plan.value_bound
    worlds = {}
    for name, first in (("out", stats[0]), ("in", stats[0] + canary)):
        members = [first, *stats[1:]]
        encoded = [encode(s.pack(isometric=True), scale_bits=f, bound=bound) for s in members]
        exact = np.zeros(plan.length, dtype=RING_DTYPE)
        for e in encoded:
            np.add(exact, e, out=exact)
        worlds[name] = (encoded, decode(exact, scale_bits=f))
    x_out = worlds["out"][1]
    direction = worlds["in"][1] - x_out  # the canary's contribution as released
    scores = {}
    for name in ("out", "in"):
        releases = _noisy_releases(worlds[name][0], noise, cfg.trials, f, noise_source)
        if cfg.statistic == "full":
            scores[name] = (releases - x_out) @ (direction / np.linalg.norm(direction))
        else:
            v_hat = np.stack(
                [
                    FFCStatistics.unpack(r, cfg.dim, cfg.num_classes, isometric=True).V
                    for r in releases
                ]
            )
            v_out = FFCStatistics.unpack(x_out, cfg.dim, cfg.num_classes, isometric=True).V
            scores[name] = np.einsum("i,tij,j->t", zq, v_hat - v_out, zq)

    half = cfg.trials // 2
    select = {k: v[:half] for k, v in scores.items()}
    evaluate = {k: v[half:] for k, v in scores.items()}
    beta = 1.0 - cfg.confidence
    alpha = beta / 4.0
    pooled = np.concatenate([select["out"], select["in"]])
    candidates = np.quantile(pooled, np.linspace(0.005, 0.995, 199))
    sel = [_bounds(select["out"], select["in"], float(c), alpha, cfg.delta) for c in candidates]
    t_cp = float(candidates[int(np.argmax([s[0] for s in sel]))])
    t_gdp = float(candidates[int(np.argmax([s[1] for s in sel]))])
    eps_cp, _, fpr_cp, fnr_cp = _bounds(evaluate["out"], evaluate["in"], t_cp, alpha, cfg.delta)
    _, eps_gdp, fpr_g, fnr_g = _bounds(evaluate["out"], evaluate["in"], t_gdp, alpha, cfg.delta)
    mu_lower = _mu_from_rates(fpr_g, fnr_g)

    claimed = plan.charge(cfg.participants).epsilon
    lower = max(eps_cp, eps_gdp)
    sigma_real = math.sqrt(noise.total_variance(cfg.participants)) / 2.0**f
    fp_c, fn_c = _errors(evaluate["out"], evaluate["in"], t_cp)
    fp_g, fn_g = _errors(evaluate["out"], evaluate["in"], t_gdp)
    return AuditResult(
        epsilon_claimed=claimed,
        epsilon_empirical_lower=lower,
        tightness=lower / claimed if claimed > 0 else math.inf,
        epsilon_lower_clopper_pearson=eps_cp,
        epsilon_lower_gdp=eps_gdp,
        mu_lower=mu_lower,
        mu_claimed_gaussian=float(np.linalg.norm(direction)) / sigma_real,
        exceeds_claim=lower > claimed,
        delta=cfg.delta,
        confidence=cfg.confidence,
        statistic=cfg.statistic,
        trials_per_world=cfg.trials,
        thresholds={"clopper_pearson": t_cp, "gdp": t_gdp},
        rates={
            "clopper_pearson": {
                "fpr": fp_c / evaluate["out"].size,
                "fnr": fn_c / evaluate["in"].size,
                "fpr_upper": fpr_cp,
                "fnr_upper": fnr_cp,
            },
            "gdp": {
                "fpr": fp_g / evaluate["out"].size,
                "fnr": fn_g / evaluate["in"].size,
                "fpr_upper": fpr_g,
                "fnr_upper": fnr_g,
            },
        },
        plan=plan.to_json(),
        settings=asdict(cfg),
        seconds=time.perf_counter() - started,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m spherecal.spherefed.privacy.empirical --out DIR``: write ``DIR/audit.json``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--trials", type=int, default=AuditSettings.trials)
    p.add_argument("--epsilon", type=float, default=AuditSettings.epsilon)
    p.add_argument("--delta", type=float, default=AuditSettings.delta)
    p.add_argument("--mechanism", default=DEFAULT_MECHANISM)
    p.add_argument("--statistic", default="full", choices=STATISTICS)
    p.add_argument("--noise-scale", type=float, default=1.0)
    args = p.parse_args(argv)
    result = run_canary_audit(
        AuditSettings(
            trials=args.trials,
            epsilon=args.epsilon,
            delta=args.delta,
            mechanism=args.mechanism,
            statistic=args.statistic,
            noise_scale=args.noise_scale,
        )
    )
    args.out.mkdir(parents=True, exist_ok=True)
    data = result.to_json()
    (args.out / "audit.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(
        f"claimed ε = {result.epsilon_claimed:.3f}, empirical lower bound = "
        f"{result.epsilon_empirical_lower:.3f} (Clopper–Pearson "
        f"{result.epsilon_lower_clopper_pearson:.3f}, GDP {result.epsilon_lower_gdp:.3f}), "
        f"tightness {result.tightness:.2f}"
        + ("  ** EXCEEDS THE CLAIM **" if result.exceeds_claim else "")
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
