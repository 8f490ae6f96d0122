"""A coordinator reading a site's example count from where its DP-SGD budget runs out.

Local DP-SGD (``[privacy] dpsgd``) samples at rate ``1/⌈n/b⌉`` for ``⌈n/b⌉`` steps an
epoch, so each round's ε follows the site's example count ``n``; with ``b = 1`` in
the plan (the coordinator's choice) it is a function of ``n`` alone. A site that
checked its budget round by round stopped at round ``⌊budget / ε(n)⌋ + 1`` — the
round told the coordinator ``ε(n)`` — and its refusal named ``ε(n)`` to four digits.
Now the site admits the plan's rounds all or none, its own rounds of the plan left out
of what it has spent, so every round of a federation gets the same answer, and the
refusal names the budget, never that ε: a comparison with the budget per federation.

Real trainers on slices of the digits dataset (two sites, different counts), the real
Opacus DP-SGD step, the real SQLite ledger; the accountant's numbers are checked
against the RDP curves computed here. Mutation checks (run by hand at the commit
that added this file): without the plan's admission the first test fails (the larger
site trains three rounds and refuses the fourth) and so does the last; a refusal text
that names the ε fails the first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch

from spherecal.participant.data import load_local_data
from spherecal.participant.dp_gate import ParticipantPrivacy
from spherecal.participant.dpsgd_round import dpsgd_round, plan_prefix
from spherecal.participant.failures import wire_reason
from spherecal.participant.settings import DataSettings
from spherecal.participant.trainer import LocalTrainer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import model_spec_to_proto
from spherecal.spherefed.fl import state_vector
from spherecal.spherefed.network import ModelSpec
from spherecal.spherefed.privacy.accounting import dpsgd_rdp, epsilon
from spherecal.spherefed.privacy.ledger import BudgetExceeded
from spherecal.spherefed.privacy.settings import PrivacySettings

DELTA = 1e-5
SIGMA = 1.0
ROUNDS = 4


def _trainer(slice_of: int, batch_size: int) -> LocalTrainer:
    torch.manual_seed(0)
    plan = pb.Plan(
        federation_id="fed-a",
        model=model_spec_to_proto(ModelSpec(extractor="mlp")),
        training=pb.LocalTraining(epochs=1, batch_size=batch_size, lr=0.1, loss="mse"),
        rounds=ROUNDS,
    )
    data = load_local_data(DataSettings(dataset="digits", slice_index=0, slice_of=slice_of))
    return LocalTrainer(plan, data)


def _round_epsilon(n: int, batch: int, rounds: int = 1) -> float:
    """ε of ``rounds`` local DP-SGD rounds on ``n`` examples, computed here."""
    batches = -(-n // batch)
    return epsilon(dpsgd_rdp(SIGMA, 1.0 / batches, batches * rounds), DELTA)[0]


class _Site:
    """One site's DP-SGD rounds: its trainer, its own ledger, what it refused."""

    def __init__(self, tmp: Path, name: str, trainer: LocalTrainer, budget: float) -> None:
        self.trainer = trainer
        self.settings = PrivacySettings(
            enabled=True,
            epsilon=1e6,  # no per-release target in the way: the total decides
            total_epsilon=budget,
            delta=DELTA,
            dpsgd=True,
            dpsgd_noise_multiplier=SIGMA,
        )
        self.state = tmp / name
        self.name = name
        self.privacy = ParticipantPrivacy(self.settings, name, self.state)
        self.refused: list[BaseException] = []

    def restart(self) -> None:
        self.privacy.close()
        self.privacy = ParticipantPrivacy(self.settings, self.name, self.state)

    def round(self, r: int, federation: str = "fed-a", task: str | None = None) -> bool:
        vector: npt.NDArray[np.float64] = state_vector(
            self.trainer.model, self.trainer.keys
        ).astype(np.float64)
        update = dpsgd_round(
            self.trainer,
            self.settings,
            self.privacy,
            self.name,
            task or f"train-{federation}-{r}",
            vector,
            federation_id=federation,
            round_index=r,
            plan_rounds=ROUNDS,
            refuse=lambda _task, exc: self.refused.append(exc),
            failed=self.refused.append,
            log=lambda _line: None,
        )
        return update is not None

    def charged(self) -> list[str]:
        return [e.release_id for e in self.privacy.ledger(DELTA).entries(self.name)]


def test_where_the_budget_runs_out_no_longer_reads_the_count(tmp_path: Path) -> None:
    """Two sites with one budget and different counts, a plan of batch size 1: each
    round's ε differs, so round-by-round checks would stop them at different rounds
    (computed here); both refuse the plan at its first round and at every later one,
    charge nothing, and send the coordinator the same sentence."""
    small, large = _trainer(8, batch_size=1), _trainer(4, batch_size=1)
    n_small, n_large = small.data.train_size, large.data.train_size  # 104 and 232
    assert n_small < n_large
    eps_small, eps_large = _round_epsilon(n_small, 1), _round_epsilon(n_large, 1)
    budget = 1.06  # above one round of the larger site, below one of the smaller
    stops = [  # the round at which a round-by-round check refused (the attack)
        next(r for r in range(1, ROUNDS + 1) if _round_epsilon(n, 1, r) > budget)
        for n in (n_small, n_large)
    ]
    assert stops == [1, ROUNDS], (stops, eps_small, eps_large)  # the oracle was real

    sites = [_Site(tmp_path, "small", small, budget), _Site(tmp_path, "large", large, budget)]
    for site in sites:
        assert [site.round(r) for r in range(ROUNDS)] == [False] * ROUNDS
        assert site.charged() == []
        assert all(isinstance(e, BudgetExceeded) for e in site.refused)
        site.restart()  # a restarted site answers the same
        assert site.round(ROUNDS - 1) is False and site.charged() == []
    said = {wire_reason(e) for site in sites for e in site.refused}
    (sentence,) = said  # one text for both counts, every round
    assert f"total budget ε = {budget:g}" in sentence
    for eps in (eps_small, eps_large):
        assert f"{eps:.4g}" not in sentence and f"{eps:.3g}" not in sentence
    # the site's own log still has every number
    local = str(sites[0].refused[0])
    assert "this release ε = " in local and "already spent ε = " in local


def test_a_plan_that_fits_is_admitted_every_round_and_charged_per_round(tmp_path: Path) -> None:
    """The plan's rounds fit: every round trains and is charged as it happens; the
    composed charge is the plan's ε computed here; a restart admits the rest."""
    trainer = _trainer(8, batch_size=32)
    n = trainer.data.train_size
    whole = _round_epsilon(n, 32, ROUNDS)
    site = _Site(tmp_path, "p0", trainer, budget=whole * 1.01)
    assert site.round(0) and site.round(1)
    site.restart()
    assert site.round(2) and site.round(3)
    assert site.refused == []
    prefix = plan_prefix("fed-a")
    assert site.charged() == [f"{prefix}round-{r}" for r in range(ROUNDS)]
    spent = site.privacy.ledger(DELTA).spent("p0").epsilon
    assert spent == pytest.approx(whole, rel=1e-9)


def test_what_other_releases_spent_counts_and_this_plan_alone_does_not(tmp_path: Path) -> None:
    """Releases outside the plan (another federation's rounds) are spent; the plan's
    own rounds are not counted twice: each federation's answer stays the same at
    every one of its rounds."""
    trainer = _trainer(8, batch_size=32)
    n = trainer.data.train_size
    budget = _round_epsilon(n, 32, ROUNDS) * 1.01  # one plan fits, not a round more
    assert _round_epsilon(n, 32, ROUNDS + 1) > budget
    site = _Site(tmp_path, "p0", trainer, budget=budget)
    assert site.round(0, federation="fed-b")  # another federation's first round
    assert [site.round(r) for r in range(ROUNDS)] == [False] * ROUNDS  # fed-a: none
    assert [site.round(r, federation="fed-b") for r in range(1, ROUNDS)] == [True] * 3
    assert site.charged() == [f"{plan_prefix('fed-b')}round-{r}" for r in range(ROUNDS)]


def test_a_round_asked_again_under_other_task_ids_is_charged_once(tmp_path: Path) -> None:
    """A coordinator that drops a round's job before its masked step (nothing is
    released) and asks the round again under a fresh task and job id: charged per
    task id, each retry spent the round's ε again, and the retry at which the budget
    ran out read ε(n) — 4 retries for 104 examples, 14 for 232 at one budget. The
    round is charged once, whatever it is asked under, so both sites answer every
    retry the same."""
    small, large = _trainer(8, batch_size=1), _trainer(4, batch_size=1)
    budget = (
        max(
            _round_epsilon(small.data.train_size, 1, ROUNDS),
            _round_epsilon(large.data.train_size, 1, ROUNDS),
        )
        * 1.01
    )  # the whole plan fits both sites
    for name, trainer in (("small", small), ("large", large)):
        site = _Site(tmp_path, name, trainer, budget=budget)
        answers = [site.round(0, task=f"retry-{k}") for k in range(20)]
        assert answers == [True] * 20, name
        assert site.charged() == [f"{plan_prefix('fed-a')}round-0"]
