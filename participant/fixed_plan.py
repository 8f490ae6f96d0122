"""One plan per federation: the checks a site makes of a plan against its data are
answered once per federation.

Why: a site checks the plan it joins under against its own data — its labels must fit
the model's classes (``participant.data.check_fits_model``: a site's own ``.npz``
takes its label range from the labels), and with local DP-SGD the plan's rounds,
epochs and batch size must fit its budget all or none (``participant.dpsgd_round``:
their ε follows its example count). Each answer is one bit the coordinator reads from
whether the site stays. The documented bound was "once per federation, again only
after the site's operator starts it for a new one" (``[policy]
follow_new_federation``), but nothing fixed the plan *within* a federation: a
coordinator could expire the session (free), send the same federation id with a plan
one class smaller, or one round longer, and watch for the site's exit — the highest
label of the site in at most ``C`` rejoins, its example count by bisection on the
rounds.

How: the first plan a site accepts for a federation — before any check reads its
data — is kept in its release ledger (``site_plans``, durable, so a restart of the
site keeps it too); a later plan for that federation must carry the same terms, or
the site stops (exit 2) without checking it. The terms are the whole plan but for the
site's position in the roster and what only paces the transport
(:mod:`spherecal.proto.plan_terms`). The coordinator keeps the
same rule (``coordinator.driver.resume``: a federation resumes only with the plan it
started with), so an honest operator who edits the plan's settings mid-federation is
told so at the coordinator, not by sites that stop.

What is left: one answer per federation — "do this plan's classes cover my labels?",
"do its rounds fit my budget?" — for a coordinator that starts a new federation per
question, i.e. after the site's operator starts the site again each time. A site that
states its classes (``[data] num_classes``) answers the first from its configuration,
not its data.
"""

from __future__ import annotations

from spherecal.participant.release_ledger import ReleaseLedger
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.plan_terms import changed_fields, plan_terms

__all__ = ["PlanChanged", "fix_plan"]


class PlanChanged(ValueError):
    """The coordinator sent another plan for a federation whose plan this site fixed."""


def fix_plan(ledger: ReleaseLedger, plan: pb.Plan) -> None:
    """Keep ``plan`` as its federation's plan, or raise :class:`PlanChanged` if the
    federation already has other terms. Call before any check of the plan reads the
    site's data."""
    now = plan_terms(plan)
    before = ledger.fix_plan(plan.federation_id, now)
    if before is None:
        return
    fields = ", ".join(changed_fields(before, now)) or "its encoding"
    raise PlanChanged(
        f"the coordinator changed the plan of federation {plan.federation_id} since this "
        f"site accepted it ({fields}); this site checks a federation's plan against its "
        "data once, so it stops here without checking the new one — a changed plan "
        "needs a new federation (the coordinator's operator starts one, this site's "
        "operator starts the site again)"
    )
