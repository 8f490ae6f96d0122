"""A site's training weight: its example count, released once per federation with DP noise.

Why: FedAvg weights each site's update by its example count ``n_k`` (the server step
``x + Σ n_k Δ_k / Σ n_k``, McMahan et al. 2017; FedProx, FedOpt, SCAFFOLD and FedNova
weight alike), so every round's sum carries ``Σ n_k``. Secure aggregation hides one
site's ``n_k`` inside that one sum, but the count is the same in every round of a
federation: two rounds over rosters that differ by one site — an honest dropout is
enough, no dishonest coordinator needed — give that site's count exactly (issue #19's
rule: every value that leaves a site is one accounted release, however many sums it
is in).

So a site weights its updates by a *released* count instead: ``ñ_k = max(1, n_k + Z)``,
``Z`` discrete Gaussian ``N_Z(0, σ²)`` (Canonne, Kamath & Steinke 2020), drawn from
``os.urandom`` (:func:`spherecal.crypto.dp.sample_noise`) the first time an update of
the federation leaves, kept in the site's release ledger (``state_dir/privacy.db``,
table ``site_example_counts``) and used for every later round and after a restart —
and in any later federation on the same training split (its fingerprint,
:func:`spherecal.participant.data.fingerprint`, at the same σ), so that a renamed or
restarted federation gets the same value rather than a fresh draw to average.
Differencing any number of rounds over any rosters then gives ``ñ_k``: one release,
whose ε is the discrete Gaussian's with sensitivity 1 (one record moves the count by
one; ``ρ = 1/2σ²``; the plan, cost and the coordinator's ceiling are both sides'
:mod:`spherecal.spherefed.privacy.example_count`), recorded beside it and listed
by ``spherecal audit --site``. The default ``σ = 4`` costs ε ≈ 1.0 at δ = 1e-5 per
training split; it moves a site of 100 examples' weight by 4 % (one sd), which
FedAvg's average barely feels. Changed data (another fingerprint) or another σ is a
new draw, a new release. Reused across federations, equal answers tell the
coordinator that the training split did not change — what the per-class moments'
once-per-fingerprint rule already tells it.

Applying it is the strategy's (:meth:`ServerStrategy.reweighed
<spherecal.spherefed.algorithms.base.ServerStrategy.reweighed>`, which the site calls
on its result before it flattens it): every sum declared proportional to the weight
(:attr:`NamedSum.example_weighted <spherecal.spherefed.algorithms.base.NamedSum>`:
``n_k Δ_k``, ``n_k``) is multiplied by ``ñ_k / n_k``, so the server step is FedAvg's
with weights ``ñ_k``. The coordinator states the σ its
integrity checks tolerate in the plan (``Plan.example_count_noise_sd``, ``[federation]
example_count_noise_sd``); a site whose own σ (``[policy] example_count_noise_sd``) is
larger refuses the plan, since its honest weight would fail those checks.

FedNova's ``τ`` sum carries the count a second way (``τ/weight = ‖a_k‖₁`` follows the
local step count ``epochs·⌈n_k/B⌉``); it is sent as a site of ``ñ_k`` examples would
(:meth:`FedNova.reweighed <spherecal.spherefed.algorithms.strategies.FedNova.reweighed>`).
What this does not cover: the update ``Δ_k`` itself and the round's mean loss
(``docs/threat_model.md``, *Different training rounds*).

**Within the job's bound** (:func:`weight_within_bound`). The coordinator chooses each
update job's entry bound; a weight whose entries (``ñ_k``, FedNova's ``τ``, at their
plan scales) did not fit it would make the site refuse — its own answer, past secure
aggregation, to "is your weight above B?", once per round at bounds the coordinator
picks. A site weights its update instead by the largest count up to ``ñ_k`` whose
entries fit: a function of ``ñ_k`` and public values only, so nothing beyond the
released count, and only its own log says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from spherecal.crypto.dp import DGAUSS, sample_noise
from spherecal.participant.release_ledger import ExampleCount, ReleaseLedger
from spherecal.spherefed.algorithms.base import ClientResult, ServerStrategy, SumLayout
from spherecal.spherefed.fl import LocalTrainConfig
from spherecal.spherefed.privacy.example_count import count_charge, count_noise_plan

__all__ = [
    "check_plan_noise",
    "draw_example_count",
    "training_weight",
    "weight_within_bound",
]


def draw_example_count(federation: str, data: bytes, count: int, sd: int) -> ExampleCount:
    """A fresh released count for ``count`` examples of the training split
    fingerprinted ``data`` (exact at ``sd = 0``)."""
    if count < 0:
        raise ValueError(f"an example count must be >= 0, got {count}")
    if sd == 0:
        return ExampleCount(federation, data, federation, count, count, 0, None, None, {})
    plan = count_noise_plan(sd)
    noise = int(sample_noise(plan)[0])
    charge = count_charge(sd, plan.tail_probability)
    return ExampleCount(
        federation=federation,
        data=data,
        drawn_in=federation,
        count=count,
        released=max(1, count + noise),
        sd=sd,
        epsilon=charge.epsilon,
        delta=charge.delta,
        noise={
            "mechanism": DGAUSS,
            "sd": sd,
            "noise_bound": plan.noise_bound,
            "tail_probability": plan.tail_probability,
        },
    )


def training_weight(
    ledger: ReleaseLedger,
    federation: str,
    data: bytes,
    count: int,
    sd: int,
    log: Callable[[str], None],
) -> int:
    """The weight this site's updates in ``federation`` carry: the one kept for the
    federation in ``ledger``; else the one drawn for the same training split
    (fingerprint ``data``) at the same ``sd`` in an earlier federation, sent again —
    a renamed or restarted federation on the same data learns nothing new, where a
    fresh draw each time would average the noise away; else a fresh draw. Kept before
    it is returned, so before any update carries it."""
    kept = ledger.example_count(federation)
    if kept is not None:
        if kept.count != count:
            log(
                f"training weight: kept from this federation's first round ({kept.count} "
                f"examples then, {count} now): a new draw would be a second release"
            )
        return kept.released
    earlier = ledger.example_count_of_data(data, sd) if sd > 0 else None
    if earlier is not None:
        kept = ledger.record_example_count(replace(earlier, federation=federation))
        log(
            f"training weight: the count drawn for this training data in federation "
            f"{earlier.drawn_in}, sent again (no new release)"
        )
        return kept.released
    kept = ledger.record_example_count(draw_example_count(federation, data, count, sd))
    if kept.sd:
        log(
            f"training weight: this site's example count with noise of sd {kept.sd}, "
            f"drawn once for this training data (epsilon {kept.epsilon:.3g} at delta "
            f"{kept.delta:g}, in the release ledger)"
        )
    else:
        log(
            "training weight: this site's exact example count ([policy] example_count_noise_sd = 0)"
        )
    return kept.released


def check_plan_noise(plan_sd: int, site_sd: int) -> None:
    """Refuse a plan whose stated tolerance is below this site's noise: the
    coordinator's integrity checks would refuse this site's honest weight."""
    if site_sd > plan_sd:
        raise ValueError(
            f"this site weights its updates by its example count with noise of sd "
            f"{site_sd} ([policy] example_count_noise_sd), but the plan's integrity checks "
            f"allow sd {plan_sd} ([federation] example_count_noise_sd at the coordinator); "
            "the coordinator must raise its value (lowering this site's own is a weakening "
            "of its privacy, logged)"
            + (
                "; a coordinator older than this setting (before 2026-11-27) states 0: upgrade it"
                if plan_sd == 0
                else ""
            )
        )


def weight_within_bound(
    strategy: ServerStrategy,
    layout: SumLayout,
    result: ClientResult,
    weight: int,
    config: LocalTrainConfig,
    bound: float,
) -> int:
    """The largest training weight ``w <= weight`` whose count entries — the scalar
    sums proportional to the weight (``weight`` itself, FedNova's ``τ = w‖a(w)‖₁``),
    as :meth:`ServerStrategy.reweighed` sets them, divided by their plan scales — are
    at most the job's ``bound``; ``weight`` itself whenever it fits (every honest
    job: the coordinator derives its bound from the largest weight a site may send).

    Why not refuse: a site whose weight did not fit would withdraw, an answer of its
    own about its count to a bound the coordinator chose. The weight is a released
    count (``ñ_k``), so the answer would not break its ε, but it would leave past
    secure aggregation, once per round; fitted instead, the site always sends, and
    what it sends is a function of ``ñ_k`` and public values only. Each entry grows
    with ``w`` (``τ``'s effective steps grow with the step count), so the largest
    fitting ``w`` is found by bisection; ``w = 0`` (all count entries 0) always fits."""
    names = [s.name for s in strategy.sums if s.example_weighted and not s.per_entry]
    probe = replace(result, payload={k: result.payload[k] for k in names if k in result.payload})

    def fits(w: int) -> bool:
        sent = strategy.reweighed(probe, w, config).payload
        return all(abs(float(sent[k])) / layout.scale_of(k) <= bound for k in sent)

    if fits(weight):
        return weight
    low, high = 0, weight  # fits(low), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
