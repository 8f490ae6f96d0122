"""One DP-SGD training round of a participant, charged to its own ledger first.

Why first: the privacy cost of the round (noise multiplier, sampling rate, steps) is
known before training, so the participant charges its local ledger
(``state_dir/privacy.db``) and refuses over budget *before* its data is touched.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from spherecal.participant.dp_gate import BudgetExceeded, ParticipantPrivacy
from spherecal.participant.trainer import LocalTrainer
from spherecal.spherefed.fl import LocalUpdate
from spherecal.spherefed.privacy.charge import dpsgd_charge
from spherecal.spherefed.privacy.settings import PrivacySettings

__all__ = ["dpsgd_round"]


def dpsgd_round(
    trainer: LocalTrainer,
    p: PrivacySettings,
    privacy: ParticipantPrivacy,
    participant_id: str,
    task_id: str,
    vector: npt.NDArray[np.float64],
    *,
    refuse: Callable[[str, BaseException], None],
    log: Callable[[str], None],
) -> LocalUpdate | None:
    """Charge, then train with DP-SGD; None when refused (already reported)."""
    config = trainer.dpsgd_config(p.dpsgd_noise_multiplier, p.dpsgd_max_grad_norm, p.delta)
    rate, steps = trainer.dpsgd_steps()
    charge = dpsgd_charge(
        p.dpsgd_noise_multiplier, rate, steps, p.delta, max_grad_norm=p.dpsgd_max_grad_norm
    )
    try:
        entry = privacy.ledger(p.delta).charge(
            participant_id, charge, release_id=f"dpsgd-{task_id}"
        )
    except BudgetExceeded as exc:
        refuse(task_id, exc)
        return None
    try:
        update, result = trainer.train_dpsgd(vector, config)
    except ValueError as exc:  # UnsupportedModel (e.g. BatchNorm), no data
        refuse(task_id, exc)
        return None
    log(
        f"DP-SGD: ε = {result.epsilon:.4g} (ledger {charge.epsilon:.4g}) at δ = {p.delta:g}, "
        f"σ = {result.noise_multiplier:g}, {result.steps} steps; local total ε = "
        f"{entry.epsilon_total:.4g}"
    )
    return update
