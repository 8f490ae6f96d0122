"""One DP-SGD training round of a participant, charged to its own ledger first.

Why first: the privacy cost of the round (noise multiplier, sampling rate, steps) is
known before training, so the participant charges its local ledger
(``state_dir/privacy.db``) and refuses over budget *before* its data is touched.

Why the whole plan is admitted at once: local DP-SGD samples at rate ``1/⌈n/b⌉`` for
``⌈n/b⌉`` steps an epoch, so a round's ε follows the site's example count ``n`` (with
``b = 1`` in the plan, ``n`` itself). Checked round by round, the first round that no
longer fits the budget is ``⌊(budget − spent) / ε(n)⌋ + 1``: the round at which the
site stops, and the ε a refusal used to name, told the coordinator the count. The
site admits every round of the plan it joined or none
(:meth:`~spherecal.spherefed.privacy.ledger.PrivacyLedger.check_plan`, its own rounds
left out of what it has spent, so the answer is the same at every round and after a
restart), and its refusal names the budget, never the ε
(:func:`spherecal.participant.failures.wire_reason`): a comparison with the budget,
once per federation (again if the federation's DP statistics release is charged
between two rounds: it counts as spent for the rounds to come).

Why a failed round is not a refusal: once admitted and charged, whether DP-SGD's
training fails (a split with no examples, a torch error on this site's data, memory)
can depend on the data, so it goes to ``failed`` — withheld to the job's masked step
and counted as the round's release, like any failed local work
(:data:`~spherecal.participant.failures.LOCAL_WORK_ERRORS`) — never refused at once,
which the coordinator would read as an answer outside every release.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from spherecal.participant.dp_gate import BudgetExceeded, ParticipantPrivacy, charge_once
from spherecal.participant.failures import LOCAL_WORK_ERRORS
from spherecal.participant.trainer import LocalTrainer
from spherecal.spherefed.fl import LocalUpdate
from spherecal.spherefed.privacy.charge import PrivacyCharge, dpsgd_charge
from spherecal.spherefed.privacy.settings import PrivacySettings

__all__ = ["dpsgd_round", "plan_prefix"]


def plan_prefix(federation_id: str) -> str:
    """The ledger's ``release_id`` prefix of one federation's local DP-SGD rounds."""
    return f"local-dpsgd/{federation_id}/"


def dpsgd_round(
    trainer: LocalTrainer,
    p: PrivacySettings,
    privacy: ParticipantPrivacy,
    participant_id: str,
    task_id: str,
    vector: npt.NDArray[np.float64],
    *,
    federation_id: str,
    round_index: int,
    plan_rounds: int,
    refuse: Callable[[str, BaseException], None],
    failed: Callable[[BaseException], None],
    log: Callable[[str], None],
    charged: Callable[[PrivacyCharge], None] | None = None,
) -> LocalUpdate | None:
    """Admit the plan's ``plan_rounds`` rounds (all or none), charge round
    ``round_index`` once (``local-dpsgd/<federation>/round-N``: asked again under
    another task or job id — one dropped before its masked step releases nothing —
    it is not charged again; charged per task id, each retry spent budget again, and
    the retry at which the budget ran out read ε(n), the count), then
    train with DP-SGD; None when the plan is refused (``refuse``: at once, by the
    plan's terms alone) or the admitted round's training failed (``failed``: a
    refusal that depends on the data, module docstring). ``charged`` is told the
    round's charge once it is in the budget ledger, before training: the round's row
    of the release ledger carries its ε, as a DP statistics release's and a distributed
    step's do, so the site's audit counts it (until 2026-11-27 it listed the rounds as
    noised with no ε, and its total ε left them out)."""
    config = trainer.dpsgd_config(p.dpsgd_noise_multiplier, p.dpsgd_max_grad_norm, p.delta)
    rate, steps = trainer.dpsgd_steps()
    sigma, clip = p.dpsgd_noise_multiplier, p.dpsgd_max_grad_norm
    charge = dpsgd_charge(sigma, rate, steps, p.delta, max_grad_norm=clip)
    whole = dpsgd_charge(sigma, rate, steps * max(1, plan_rounds), p.delta, max_grad_norm=clip)
    prefix = plan_prefix(federation_id)
    try:
        ledger = privacy.ledger(p.delta)
        ledger.check_plan(participant_id, charge, whole, own_prefix=prefix)
        # one charge per round of the plan, whatever the task or job it comes in
        entry = charge_once(ledger, participant_id, charge, prefix + f"round-{round_index}")
    except BudgetExceeded as exc:
        refuse(task_id, exc)
        return None
    if charged is not None:
        charged(charge)
    try:
        update, result = trainer.train_dpsgd(vector, config)
    except LOCAL_WORK_ERRORS as exc:  # e.g. no examples, a torch error on the data
        failed(exc)
        return None
    log(
        f"DP-SGD: ε = {result.epsilon:.4g} (ledger {charge.epsilon:.4g}) at δ = {p.delta:g}, "
        f"σ = {result.noise_multiplier:g}, {result.steps} steps; local total ε = "
        f"{entry.epsilon_total:.4g}"
    )
    return update
