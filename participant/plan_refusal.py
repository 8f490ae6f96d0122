"""A site checks the federation's plan as it joins, and refuses it out loud.

At every join with a new plan the site builds its trainer from the plan and checks
the plan against itself (:func:`check_plan`): a custom extractor it did not allow, an
algorithm or model this build cannot run, data that does not fit the model (images
of another shape, labels beyond the model's classes), less example-count noise than
its ``[policy]``. Any of these ends the process with exit status 2 and the closing
line ``this site refused the federation's plan: REASON`` — the site refused, not the
coordinator (before 2026-11-27 the line said "refused by the coordinator").

Before it exits the site tells the coordinator (:class:`PlanRefused`, sent by
``ParticipantRunner.run``): a ``FailureReport`` with no task id, the typed kind and
rule, and a reason that may leave the site. The coordinator then ends the site's
session — ``spherecal status`` stops showing it connected — and records that it
refused the plan and why. As for every withdrawal (``spherecal.participant.failures``),
the text sent is made only of what the coordinator sent and the site's declared
settings: a label refusal says the labels do not fit the plan's class count, never
which labels the site holds; the site's own log and release ledger keep the whole
reason.
"""

from __future__ import annotations

from spherecal.participant.backoff import ParticipantExit
from spherecal.participant.data import DataOutsideModel, LocalData, check_fits_model
from spherecal.participant.example_weight import check_plan_noise
from spherecal.participant.fixed_plan import PlanChanged, fix_plan
from spherecal.participant.release_ledger import ReleaseLedger
from spherecal.participant.results import refuse_extractor
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.trainer import LocalTrainer
from spherecal.proto import spherecal_pb2 as pb

__all__ = ["PLAN_TASK", "PlanRefused", "check_plan"]

PLAN_TASK = "plan"
"""The task a plan refusal is listed under in the site's release ledger."""


class PlanRefused(ParticipantExit):
    """This site refuses the federation's plan: exit status 2, after telling the
    coordinator ``public`` with the typed ``kind`` and ``rule``. ``reason`` (the site's
    own log) may name values of the site's data; ``public`` never does."""

    def __init__(
        self,
        reason: str,
        *,
        public: str,
        kind: pb.FailureKind,
        rule: pb.PolicyRule = pb.RULE_UNSPECIFIED,
    ) -> None:
        super().__init__(
            2,
            f"cannot run this federation's plan: {reason}",
            ending=f"this site refused the federation's plan: {reason}",
        )
        self.reason = reason
        self.public = public
        self.kind = kind
        self.rule = rule
        self.federation = ""
        """The id of the federation whose plan was refused (set by :func:`check_plan`)."""

    def report(self, caller: pb.Caller) -> pb.FailureReport:
        """The withdrawal from the federation the coordinator is sent (no task id)."""
        return pb.FailureReport(
            caller=caller, task_id="", reason=self.public[:300], kind=self.kind, rule=self.rule
        )


def check_plan(
    plan: pb.Plan, data: LocalData, settings: ParticipantSettings, releases: ReleaseLedger
) -> LocalTrainer:
    """The trainer for ``plan``, or :class:`PlanRefused` naming the plan's federation
    (module docstring). The plan is first kept as its federation's in ``releases``
    (:mod:`spherecal.participant.fixed_plan`): before any check reads the data, so a
    federation's plan is checked against it once."""
    try:
        try:
            fix_plan(releases, plan)
        except PlanChanged as exc:
            raise PlanRefused(str(exc), public=str(exc), kind=pb.POLICY_REFUSAL) from None
        return _trainer_for(plan, data, settings)
    except PlanRefused as refusal:
        refusal.federation = plan.federation_id
        raise


def _trainer_for(plan: pb.Plan, data: LocalData, settings: ParticipantSettings) -> LocalTrainer:
    """Each check with the text the coordinator may be told: the extractor refusal, the
    trainer's errors and the noise check are made of the plan and this site's declared
    settings (sent as they are); the data check sends its public form
    (:class:`~spherecal.participant.data.DataOutsideModel`)."""
    refused = refuse_extractor(plan.model.extractor, settings.extractors)
    if refused is not None:
        raise PlanRefused(
            refused, public=refused, kind=pb.POLICY_REFUSAL, rule=pb.RULE_EXTRACTOR_NOT_ALLOWED
        )
    try:
        trainer = LocalTrainer(plan, data)  # built from the plan alone; data is kept
    except ValueError as exc:  # e.g. an algorithm or model this build does not know
        raise PlanRefused(str(exc), public=str(exc), kind=pb.BAD_INPUT) from None
    try:
        check_fits_model(data, trainer.spec)
    except DataOutsideModel as exc:
        raise PlanRefused(str(exc), public=exc.public, kind=pb.BAD_INPUT) from None
    try:
        check_plan_noise(int(plan.example_count_noise_sd), settings.policy.example_count_noise_sd)
    except ValueError as exc:
        raise PlanRefused(
            str(exc), public=str(exc), kind=pb.POLICY_REFUSAL, rule=pb.RULE_EXAMPLE_COUNT_NOISE
        ) from None
    return trainer
