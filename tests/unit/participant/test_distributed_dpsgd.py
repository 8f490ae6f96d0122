"""A site's gate for distributed DP-SGD steps (issue #25): it re-plans from the
step's public inputs, checks the signed job spec against that plan and its own
policy, and charges its ledger before its data is touched — refusing over budget.

Mutation check: with the spec check removed (``verify_plan`` a no-op), a coordinator
that claims ``t = 3`` guaranteed contributors in the step while its job unmasks sums
of 2 gets its step admitted — each site would add a third of the noise where half
is needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spherecal.crypto import JobSpec
from spherecal.participant import distributed_dpsgd as gate
from spherecal.participant.distributed_dpsgd import admit_step, require_distributed
from spherecal.participant.dp_gate import (
    BudgetExceeded,
    NoiseRequired,
    ParticipantPrivacy,
    PrivacyRefused,
)
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.settings import PrivacySettings

IDS = ["p0", "p1", "p2"]
LENGTH, MAX_EXAMPLES = 500, 1000
STEP: dict[str, Any] = dict(
    noise_multiplier=1.0,
    sample_rate=0.02,
    max_grad_norm=1.0,
    min_contributors=3,
    delta=1e-5,
    mechanism="skellam",
    scale_bits=16,
    max_examples=MAX_EXAMPLES,
)
ROUND_0: dict[str, Any] = {"federation": "f", "round_index": 0, "plan_rounds": 1}
"""One round of a one-round plan in federation ``f``."""


def _plan(**change: float) -> DistributedDpsgdPlan:
    return DistributedDpsgdPlan(
        float(change.get("noise_multiplier", 1.0)),
        0.02,
        max_grad_norm=1.0,
        min_contributors=int(change.get("min_contributors", 3)),
    )


def _spec(*, threshold: int = 3, min_participants: int = 3, **change: float) -> JobSpec:
    args = _plan(**change).job_spec_arguments(LENGTH, len(IDS), MAX_EXAMPLES)
    return JobSpec.create(IDS, threshold=threshold, min_participants=min_participants, **args)


def _privacy(tmp_path: Path, **settings: object) -> ParticipantPrivacy:
    return ParticipantPrivacy(PrivacySettings(**settings), "p0", tmp_path)  # type: ignore[arg-type]


def _ledger_rows(privacy: ParticipantPrivacy) -> int:
    return len(privacy.ledger(1e-5).store.entries("p0"))


def test_a_step_is_planned_verified_and_charged(tmp_path: Path) -> None:
    privacy = _privacy(tmp_path, updates="distributed")
    admitted = admit_step(privacy, pb.DPSGDStep(**STEP), _spec(), model_length=LENGTH, **ROUND_0)
    assert admitted.entry["epsilon"] == pytest.approx(_plan().charge(1, 1e-5).epsilon)
    assert admitted.noise.min_contributors == 3 and _ledger_rows(privacy) == 1


@pytest.mark.parametrize(
    ("step", "spec_change", "match"),
    [
        ({"noise_multiplier": 0.5}, {"noise_multiplier": 0.5}, "below this site's"),
        ({"delta": 1e-6}, {}, "δ"),
        ({}, {"noise_multiplier": 0.5}, "noise bound"),  # the job's bound too small
        ({"scale_bits": 12}, {}, "noise plan|scale"),
    ],
)
def test_a_step_the_site_does_not_accept_is_refused_before_any_charge(
    tmp_path: Path,
    step: dict[str, Any],
    spec_change: dict[str, Any],
    match: str,
) -> None:
    privacy = _privacy(tmp_path, updates="distributed")
    with pytest.raises(PrivacyRefused, match=match):
        admit_step(
            privacy,
            pb.DPSGDStep(**{**STEP, **step}),
            _spec(**spec_change),
            model_length=LENGTH,
            **ROUND_0,
        )
    assert _ledger_rows(privacy) == 0


def test_a_job_guaranteeing_fewer_contributors_than_the_step_claims_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weaker = _spec(threshold=2, min_participants=2)  # unmasks sums of 2
    privacy = _privacy(tmp_path, updates="distributed")
    with pytest.raises(PrivacyRefused, match="guarantees only 2 contributors"):
        admit_step(privacy, pb.DPSGDStep(**STEP), weaker, model_length=LENGTH, **ROUND_0)
    # mutation: without the check the under-noised step is admitted
    monkeypatch.setattr(gate, "verify_plan", lambda spec, plan: None)
    admitted = admit_step(privacy, pb.DPSGDStep(**STEP), weaker, model_length=LENGTH, **ROUND_0)
    assert admitted.plan.min_contributors == 3


def test_a_plan_of_steps_is_admitted_all_or_none_once_per_federation(tmp_path: Path) -> None:
    """Two steps do not fit, one does: a two-round plan is refused at its first round,
    nothing charged, and kept refused; a one-round plan is admitted, its round charged
    once however often it is asked."""
    one = _plan().charge(1, 1e-5).epsilon
    two = _plan().charge(2, 1e-5).epsilon
    privacy = _privacy(tmp_path, updates="distributed", total_epsilon=(one + two) / 2)
    step, spec = pb.DPSGDStep(**STEP), _spec()
    two_rounds: dict[str, Any] = {"federation": "f", "plan_rounds": 2}
    with pytest.raises(BudgetExceeded):
        admit_step(privacy, step, spec, model_length=LENGTH, round_index=0, **two_rounds)
    assert _ledger_rows(privacy) == 0
    with pytest.raises(PrivacyRefused, match="steps were refused"):
        admit_step(privacy, step, spec, model_length=LENGTH, round_index=1, **two_rounds)
    for _ in range(3):
        admit_step(privacy, step, spec, model_length=LENGTH, **{**ROUND_0, "federation": "g"})
    assert _ledger_rows(privacy) == 1


def test_steps_of_other_parameters_are_not_compared_again(tmp_path: Path) -> None:
    """The sweep: lowering q until the first admission read what the site spent. The
    federation's first step fixes the terms; another q is refused without comparing
    (so even one that would fit), whatever the job's roster."""
    privacy = _privacy(tmp_path, updates="distributed")
    admit_step(privacy, pb.DPSGDStep(**STEP), _spec(), model_length=LENGTH, **ROUND_0)
    lower = pb.DPSGDStep(**{**STEP, "sample_rate": STEP["sample_rate"] / 2})
    with pytest.raises(PrivacyRefused, match="with other parameters"):
        admit_step(privacy, lower, _spec(), model_length=LENGTH, **{**ROUND_0, "round_index": 1})
    assert _ledger_rows(privacy) == 1


def test_the_site_demands_the_mode_and_secure_aggregation(tmp_path: Path) -> None:
    spec_bytes = _spec().to_bytes()
    secure = pb.SecAggJob(spec=spec_bytes)
    demanding = _privacy(tmp_path, updates="distributed")
    with pytest.raises(NoiseRequired, match="only with distributed DP-SGD"):
        require_distributed(demanding, pb.TrainTask(round=0, secure=secure))
    with pytest.raises(NoiseRequired, match="needs secure aggregation"):
        require_distributed(_privacy(tmp_path), pb.TrainTask(dpsgd=pb.DPSGDStep(**STEP)))
    require_distributed(demanding, pb.TrainTask(secure=secure, dpsgd=pb.DPSGDStep(**STEP)))
    require_distributed(_privacy(tmp_path), pb.TrainTask(secure=secure))  # default: no demand
