"""A site's training weight: its example count, released once per federation.

Every round's sum carries the sites' weights, and the count is the same every round,
so two rounds over rosters that differ by one site give that site's weight. The
site therefore weights by ``max(1, n + Z)``, ``Z`` discrete Gaussian, drawn once per
federation and kept in its release ledger: the same value every round and after a
restart, a new one only in a new federation, its ε recorded (computed here from the
RDP curve ``α/2σ²``). Reweighing scales exactly the sums proportional to ``n``."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch

from spherecal import crypto
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.participant import example_weight
from spherecal.participant.backoff import ParticipantExit
from spherecal.participant.data import load_local_data
from spherecal.participant.example_weight import (
    check_plan_noise,
    draw_example_count,
    training_weight,
    weight_within_bound,
)
from spherecal.participant.policy import DEFAULT_EXAMPLE_COUNT_NOISE_SD, PolicySettings
from spherecal.participant.release_ledger import ExampleCount, ReleaseLedger
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import model_spec_to_proto
from spherecal.spherefed.algorithms.base import (
    LOSS_SUM,
    AlgorithmSettings,
    ClientResult,
    as_payload,
)
from spherecal.spherefed.algorithms.registry import configured_strategy
from spherecal.spherefed.algorithms.scaffold import scaffold_control_update
from spherecal.spherefed.algorithms.strategies import fednova_norm
from spherecal.spherefed.fl import LocalTrainConfig, local_steps, local_train
from spherecal.spherefed.network import ModelSpec, build_model
from spherecal.spherefed.privacy.accounting import ORDERS
from spherecal.spherefed.privacy.example_count import (
    EXAMPLE_COUNT_DELTA,
    count_charge,
)

DATA, OTHER = b"\x01" * 32, b"\x02" * 32
"""Fingerprints of two training splits."""


def _epsilon(sd: int, delta: float) -> float:
    """Balle et al. 2020 Thm. 21 on ``ε(α) = α/2σ²`` (the discrete Gaussian with
    sensitivity 1, CKS20), minimised over the ledger's orders: computed here."""
    best = math.inf
    for a in ORDERS:
        rdp = math.ceil(a) / (2.0 * sd * sd)
        eps = rdp - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a)
        best = min(best, eps)
    return best


def test_the_charge_is_the_discrete_gaussians() -> None:
    for sd in (1, 4, 9):
        charge = count_charge(sd)
        assert charge.epsilon == pytest.approx(_epsilon(sd, EXAMPLE_COUNT_DELTA), rel=1e-9)
        assert charge.kind == "example_count" and charge.delta == EXAMPLE_COUNT_DELTA
    # the default: about 1 per federation
    assert 0.9 < count_charge(DEFAULT_EXAMPLE_COUNT_NOISE_SD).epsilon < 1.1
    with pytest.raises(ValueError, match="sd >= 1"):
        count_charge(0)


def test_draws_are_the_count_plus_bounded_noise_of_the_stated_sd() -> None:
    n, sd = 500, 4
    draws = np.array([draw_example_count("f", DATA, n, sd).released for _ in range(4000)])
    first = draw_example_count("f", DATA, n, sd)
    assert first.sd == sd and first.epsilon == pytest.approx(count_charge(sd).epsilon)
    assert np.all(np.abs(draws - n) <= first.noise["noise_bound"])
    assert abs(float(np.mean(draws)) - n) < 0.5  # sd of the mean: 4/√4000 ≈ 0.06
    assert 3.6 < float(np.std(draws)) < 4.4  # sd of the sd: ≈ 0.045
    assert len(np.unique(draws)) > 10  # fresh noise per draw, not a constant


def test_draws_stay_at_least_one_and_exact_at_sd_zero() -> None:
    assert min(draw_example_count("f", DATA, 1, 50).released for _ in range(200)) == 1
    exact = draw_example_count("f", DATA, 123, 0)
    assert (exact.released, exact.epsilon, exact.sd) == (123, None, 0)
    with pytest.raises(ValueError, match=">= 0"):
        draw_example_count("f", DATA, -1, 4)


def test_one_draw_per_federation_across_rounds_and_restarts(tmp_path: Path) -> None:
    path = tmp_path / "privacy.db"
    lines: list[str] = []
    ledger = ReleaseLedger(path, participant="p0")
    first = training_weight(ledger, "fed-a", DATA, 300, 4, lines.append)
    again = [training_weight(ledger, "fed-a", DATA, 300, 4, lines.append) for _ in range(5)]
    assert again == [first] * 5
    assert len(lines) == 1 and "drawn once for this training data" in lines[0]
    assert str(first) not in lines[0].split("epsilon")[1]  # the value is never logged
    ledger.close()

    restarted = ReleaseLedger(path, participant="p0")  # a new process, the same state
    assert training_weight(restarted, "fed-a", DATA, 300, 4, lines.append) == first
    # the data changed within the federation: the kept weight, and a note why
    assert training_weight(restarted, "fed-a", OTHER, 301, 4, lines.append) == first
    assert "a new draw would be a second release" in lines[-1]
    # another participant id in the same file keeps its own
    assert ReleaseLedger(path, participant="p1").example_count("fed-a") is None
    restarted.close()
    rows = sqlite3.connect(path).execute("SELECT count(*) FROM site_example_counts").fetchone()
    assert rows == (1,)


def test_a_later_federation_on_the_same_data_gets_the_same_draw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renamed or restarted federation asks again for free; a fresh draw each time
    would average the noise away (k federations: sd 4/√k). On the same training split
    at the same sd the site sends its first draw again, recorded without a new ε;
    changed data or another sd is a new draw. The sampler is scripted (+3, −2, +5,
    +1) so the test sees which draw left."""
    draws = iter([3, -2, 5, 1])
    monkeypatch.setattr(example_weight, "sample_noise", lambda plan: np.array([next(draws)]))
    ledger = ReleaseLedger(tmp_path / "privacy.db", participant="p0")
    lines: list[str] = []
    assert training_weight(ledger, "fed-a", DATA, 300, 4, lines.append) == 303
    for name in ("fed-b", "fed-c", "renamed"):
        assert training_weight(ledger, name, DATA, 300, 4, lines.append) == 303
    assert "sent again (no new release)" in lines[-1] and "fed-a" in lines[-1]
    assert training_weight(ledger, "fed-d", OTHER, 301, 4, lines.append) == 299  # new data
    assert training_weight(ledger, "fed-e", DATA, 300, 6, lines.append) == 305  # another sd
    assert training_weight(ledger, "fed-f", DATA, 300, 0, lines.append) == 300  # exact
    assert training_weight(ledger, "fed-g", DATA, 300, 6, lines.append) == 305  # fed-e's
    kept = ledger.example_counts()
    assert [(k.federation, k.drawn_in, k.reused) for k in kept] == [
        ("fed-a", "fed-a", False),
        ("fed-b", "fed-a", True),
        ("fed-c", "fed-a", True),
        ("renamed", "fed-a", True),
        ("fed-d", "fed-d", False),
        ("fed-e", "fed-e", False),
        ("fed-f", "fed-f", False),
        ("fed-g", "fed-e", True),
    ]
    ledger.close()
    # the site's audit counts each draw's ε once: fed-a's, fed-d's (sd 4), fed-e's (sd 6)
    from spherecal.site_audit import read_site_audit

    audit = read_site_audit(tmp_path)
    total = audit.to_json()["epsilon_total"]["p0"]
    assert total == pytest.approx(2 * count_charge(4).epsilon + count_charge(6).epsilon)


def test_the_first_draw_wins(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path / "privacy.db", participant="p0")
    one = ExampleCount("f", DATA, "f", 10, 11, 4, 1.0, 1e-5, {})
    two = ExampleCount("f", DATA, "f", 10, 7, 4, 1.0, 1e-5, {})
    assert ledger.record_example_count(one).released == 11
    assert ledger.record_example_count(two).released == 11  # a concurrent draw loses


def test_the_noise_is_what_the_sampler_drew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(example_weight, "sample_noise", lambda plan: np.array([-3]))
    assert draw_example_count("f", DATA, 40, 4).released == 37
    monkeypatch.setattr(example_weight, "sample_noise", lambda plan: np.array([-90]))
    assert draw_example_count("f", DATA, 40, 4).released == 1


def _result(payload: dict[str, object], n: int) -> ClientResult:
    return ClientResult(as_payload(**payload), n, 7, 0.5)  # type: ignore[arg-type]


CONFIG = LocalTrainConfig(epochs=2, batch_size=32, lr=0.1, momentum=0.9)


def test_reweighing_scales_exactly_the_sums_proportional_to_the_count() -> None:
    rng = np.random.default_rng(0)
    delta, control = rng.normal(size=6), rng.normal(size=6)
    n, w = 50, 53
    for name, payload, scaled in (
        ("fedavg", {"delta": n * delta, "weight": n}, {"delta", "weight"}),
        ("fedprox", {"delta": n * delta, "weight": n}, {"delta", "weight"}),
        ("fednova", {"delta": n * delta, "tau": n * 2.5, "weight": n}, {"delta"}),
        (
            "scaffold",
            {"delta": n * delta, "weight": n, "control_delta": control},
            {"delta", "weight"},
        ),
    ):
        strategy = configured_strategy(name, AlgorithmSettings(num_participants=3))
        out = strategy.reweighed(_result(payload, n), w, CONFIG)
        assert out.num_samples == w and out.mean_loss == 0.5
        assert out.num_steps == local_steps(w, CONFIG) == 4  # a site of 53: 2 × 2 batches
        assert float(out.payload["weight"]) == w
        for key, value in payload.items():
            expected = np.asarray(value, dtype=np.float64) * (w / n if key in scaled else 1.0)
            if key not in ("weight", "tau"):
                np.testing.assert_allclose(out.payload[key], expected, rtol=1e-15)


def _momentum_norm(steps: int, rho: float) -> float:
    """FedNova's ``‖a‖₁`` under momentum: ``Σ_{t=1..τ} (1 − ρ^t)/(1 − ρ)``."""
    return sum((1 - rho**t) / (1 - rho) for t in range(1, steps + 1))


@pytest.mark.parametrize(
    ("n", "w", "steps_w"),
    # epochs 2, batch 32: 53 → 2 batches; 65 → 3 less its 1-example tail; 97 → 4 less 1
    [(50, 53, 4), (60, 65, 4), (100, 97, 6), (64, 70, 6)],
)
def test_fednova_sends_tau_as_a_site_of_the_released_count_would(
    n: int, w: int, steps_w: int
) -> None:
    """``τ / weight = ‖a‖₁`` follows the local step count: sent from the true steps
    it gives the count to within the batch size, so FedNova sends ``τ`` for ``ñ``."""
    strategy = configured_strategy("fednova", AlgorithmSettings(num_participants=3))
    true_norm = _momentum_norm(local_steps(n, CONFIG), 0.9)
    payload = {"delta": np.ones(3) * n / true_norm, "tau": n * true_norm, "weight": n}
    out = strategy.reweighed(_result(payload, n), w, CONFIG)
    assert local_steps(w, CONFIG) == steps_w
    assert float(out.payload["tau"]) == pytest.approx(w * _momentum_norm(steps_w, 0.9), rel=1e-12)
    # the direction keeps the true norm: ñ Δ / ‖a(τ_n)‖₁
    np.testing.assert_allclose(out.payload["delta"], np.ones(3) * w / true_norm, rtol=1e-15)


@pytest.mark.parametrize(("n", "w"), [(50, 53), (60, 65), (100, 97), (64, 70), (40, 41)])
def test_scaffold_sends_its_control_update_for_the_released_count(n: int, w: int) -> None:
    """``Δc_k = −c − Δ_k/(ηK_k)`` divides by the local step count: with the update (a
    coordinator can isolate it by differencing two rounds of one model) it gave ``K_k``,
    the count to within the batch size. Sent, and kept in ``c_k``, for the released
    count's steps; zero on buffers; unchanged where both counts take as many steps."""
    strategy = configured_strategy("scaffold", AlgorithmSettings(num_participants=3))
    rng = np.random.default_rng(n)
    trainable = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])  # the last two: buffers
    c, ck = rng.normal(size=6) * trainable, rng.normal(size=6) * trainable
    delta = rng.normal(size=6)  # y_k − x, buffers included (running statistics)
    norm = {"momentum": CONFIG.momentum, "lr": CONFIG.lr, "prox_mu": CONFIG.prox_mu}
    true_k = fednova_norm(local_steps(n, CONFIG), **norm)
    sent_k = fednova_norm(local_steps(w, CONFIG), **norm)
    computed = scaffold_control_update(ck, c, delta, lr=CONFIG.lr, effective_steps=true_k)
    result = ClientResult(
        as_payload(delta=n * delta, weight=n, control_delta=computed * trainable - ck),
        n,
        local_steps(n, CONFIG),
        0.5,
        client_state={"control": computed * trainable},
    )
    out = strategy.reweighed(result, w, CONFIG, trainable=trainable)
    assert out.client_state is not None
    expected = scaffold_control_update(ck, c, delta, lr=CONFIG.lr, effective_steps=sent_k)
    np.testing.assert_allclose(out.client_state["control"], expected * trainable, atol=1e-12)
    np.testing.assert_allclose(out.payload["control_delta"], expected * trainable - ck, atol=1e-12)
    # what the sums give a coordinator that knows c and the update: the released steps
    sent = out.payload
    per_example = np.asarray(sent["delta"])[:4] / float(sent["weight"])
    read_k = -per_example / (CONFIG.lr * (np.asarray(sent["control_delta"])[:4] + c[:4]))
    np.testing.assert_allclose(read_k, sent_k, rtol=1e-9)
    if local_steps(n, CONFIG) != local_steps(w, CONFIG):
        assert not np.allclose(read_k, true_k)
    # without the mask the control update is left as computed (the base reweighing)
    plain = strategy.reweighed(result, w, CONFIG)
    np.testing.assert_array_equal(plain.payload["control_delta"], result.payload["control_delta"])


# ----------------------------------------------------------------- within a job's bound
def _sent_counts(name: str, result: ClientResult, w: int, scales: dict[str, float]) -> float:
    """The largest count entry (``weight``, ``tau``) a site weighted by ``w`` sends, at
    the plan's scales: computed here from the strategy's reweighing."""
    strategy = configured_strategy(name, AlgorithmSettings(num_participants=3))
    out = strategy.reweighed(result, w, CONFIG).payload
    return max(float(out[k]) / scales.get(k, 1.0) for k in ("weight", "tau") if k in out)


@pytest.mark.parametrize(
    ("name", "scales"),
    [("fedavg", {}), ("fedavg", {"weight": 4.0}), ("scaffold", {}), ("fednova", {"tau": 8.0})],
)
@pytest.mark.parametrize("released", [1, 53, 400])
def test_the_weight_within_a_bound_is_the_largest_that_fits(
    name: str, scales: dict[str, float], released: int
) -> None:
    """At every bound from far below to above the released weight's entries: the
    released weight when it fits, else the largest ``w`` whose entries fit (``w + 1``
    does not), 0 when not even one example's fit."""
    strategy = configured_strategy(name, AlgorithmSettings(num_participants=3))
    layout = strategy.layout(6, LOSS_SUM).with_scales(scales)
    n = 50
    payload: dict[str, object] = {"delta": np.ones(6) * n, "weight": n}
    if name == "fednova":
        payload["tau"] = n * 3.0
    if name == "scaffold":
        payload["control_delta"] = np.full(6, 1e9)  # per entry: never the weight's concern
    result = _result(payload, n)
    top = _sent_counts(name, result, released, scales)
    for bound in (0.1, 0.3, 1.0, 2.5, top / 3, top - 1e-9, top, top + 1, 1e12):
        w = weight_within_bound(strategy, layout, result, released, CONFIG, bound)
        assert 0 <= w <= released
        if top <= bound:
            assert w == released
            continue
        assert w == 0 or _sent_counts(name, result, w, scales) <= bound
        assert _sent_counts(name, result, w + 1, scales) > bound


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 64, 65, 97])
def test_local_steps_are_the_steps_local_training_takes(n: int) -> None:
    torch.manual_seed(0)
    model = build_model(ModelSpec(extractor="mlp"))
    x = torch.randn(n, 1, 8, 8)
    y = torch.arange(n) % 10
    update = local_train(model, x, y, CONFIG, seed=1)
    assert update.num_steps == local_steps(n, CONFIG)


def test_the_server_step_is_fedavg_with_the_released_weights() -> None:
    """Three sites reweighed, summed and stepped: ``x + Σ ñ_k Δ_k / Σ ñ_k``."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=5)
    counts, released = [40, 90, 7], [43, 88, 9]
    deltas = [rng.normal(size=5) for _ in counts]
    strategy = configured_strategy("fedavg", AlgorithmSettings(num_participants=3))
    sums = {"delta": np.zeros(5), "weight": np.zeros(())}
    for n, w, d in zip(counts, released, deltas, strict=True):
        out = strategy.reweighed(_result({"delta": n * d, "weight": n}, n), w, CONFIG)
        sums = {k: sums[k] + out.payload[k] for k in sums}
    stepped = strategy.server_step(x, sums, num_selected=3)
    expected = x + sum(w * d for w, d in zip(released, deltas, strict=True)) / sum(released)
    np.testing.assert_allclose(stepped, expected, rtol=1e-12)


def test_a_plan_below_the_sites_noise_is_refused() -> None:
    check_plan_noise(4, 4)
    check_plan_noise(8, 4)
    check_plan_noise(0, 0)
    with pytest.raises(ValueError, match=r"sd 4 \(\[policy\].*allow sd 2"):
        check_plan_noise(2, 4)


def test_the_policy_key_is_checked_and_its_weakening_logged() -> None:
    assert PolicySettings().example_count_noise_sd == DEFAULT_EXAMPLE_COUNT_NOISE_SD
    assert not any("example_count" in r for r in PolicySettings().relaxations())
    for bad in (-1, 2.5, True, "4", 10**7):
        with pytest.raises(ValueError, match="example_count_noise_sd"):
            PolicySettings(example_count_noise_sd=bad)  # type: ignore[arg-type]
    (exact,) = [r for r in PolicySettings(example_count_noise_sd=0).relaxations() if "example" in r]
    assert "exact example count" in exact
    (less,) = [r for r in PolicySettings(example_count_noise_sd=2).relaxations() if "example" in r]
    assert "less noise" in less


class _Coordinator:
    """Answers a join with a plan for the digits MLP stating ``sd``."""

    def __init__(self, sd: int) -> None:
        self.sd = sd

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        plan = pb.Plan(
            federation_id="f",
            model=model_spec_to_proto(ModelSpec(extractor="mlp")),
            training=pb.LocalTraining(epochs=1, batch_size=32, lr=0.1, loss="mse"),
            rounds=1,
            example_count_noise_sd=self.sd,
        )
        return pb.JoinReply(session="s", plan=plan)


@pytest.mark.parametrize(
    ("plan_sd", "site_sd", "joins"),
    [(4, 4, True), (9, 4, True), (2, 4, False), (0, 4, False), (0, 0, True)],
)
def test_a_real_site_refuses_a_plan_below_its_noise(
    tmp_path: Path, plan_sd: int, site_sd: int, joins: bool
) -> None:
    settings = ParticipantSettings(
        participant_id="p0",
        coordinator="127.0.0.1:1",
        insecure=True,
        state_dir=tmp_path / "state",
        policy=PolicySettings(example_count_noise_sd=site_sd),
    )
    runner = ParticipantRunner(
        settings,
        _Coordinator(plan_sd),  # type: ignore[arg-type]  # join is the one call made
        load_local_data(DataSettings(dataset="digits", slice_index=0, slice_of=5)),
        crypto.generate_identity(),
        MemoryJobLedger(),
        DirectoryTrust(None),
        log=lambda _m: None,
    )
    if joins:
        runner._join()
        assert runner.plan is not None
        return
    with pytest.raises(ParticipantExit) as caught:
        runner._join()
    assert caught.value.code == 2 and runner.plan is None
    assert f"allow sd {plan_sd}" in str(caught.value)
    assert "[federation] example_count_noise_sd" in str(caught.value)
    assert ("upgrade it" in str(caught.value)) is (plan_sd == 0)
