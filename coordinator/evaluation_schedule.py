"""What a federation's schedule asks of each site in evaluation releases, against the
sites' limit.

Why a module of its own: a site answers at most ``[policy]
max_evaluations_per_federation`` evaluations per federation
(:data:`~spherecal.spherefed.privacy.evaluation_noise.DEFAULT_MAX_EVALUATIONS_PER_FEDERATION`:
each evaluation is fresh noise on counts that can be asked for again at no cost), so
the coordinator must count what its schedule asks — the evaluations a run cannot do
without, and the optional per-round ones — and keep within ``[evaluation]
site_limit``. The settings (:mod:`spherecal.coordinator.settings`) validate against
it; the start-up log states it; the round driver asks
:meth:`~spherecal.coordinator.settings.CoordinatorSettings.evaluates_after_round`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spherecal.spherefed.privacy.evaluation_noise import DEFAULT_MAX_EVALUATIONS_PER_FEDERATION

if TYPE_CHECKING:
    from spherecal.coordinator.settings import CoordinatorSettings

__all__ = ["essential_evaluations", "evaluations_per_site", "evaluations_warning"]


def essential_evaluations(
    *, rounds: int, round_gate: str, validation_gate: bool, closed_forms: bool
) -> int:
    """The evaluation releases per site a run cannot do without: the final test
    evaluation (1), the calibrators' validation grid (1, with closed forms
    configured), the validation gate's remaining heads (1) and, with a round gate,
    each round's model and the model before the first checked round on validation
    (``rounds + 1``). A retried job adds none: one whose input left is the same
    release (refused as repeated), one that failed before it consumed nothing."""
    count = 1 + int(closed_forms) + int(validation_gate)
    if round_gate != "off":
        count += rounds + 1
    return count


def evaluations_per_site(
    *,
    rounds: int,
    federated_every: int,
    round_gate: str,
    validation_gate: bool,
    closed_forms: bool,
) -> int:
    """The most evaluation releases this schedule asks of one site in a federation:
    :func:`essential_evaluations` and one test evaluation every ``federated_every``
    rounds — what a site's ``[policy] max_evaluations_per_federation`` (default
    ``spherecal.spherefed.privacy.evaluation_noise.DEFAULT_MAX_EVALUATIONS_PER_FEDERATION``)
    must allow for all of them to run."""
    count = essential_evaluations(
        rounds=rounds,
        round_gate=round_gate,
        validation_gate=validation_gate,
        closed_forms=closed_forms,
    )
    if federated_every > 0:
        count += rounds // federated_every
    return count


def evaluations_warning(settings: CoordinatorSettings) -> list[str]:
    """The lines logged at start about the sites' evaluation limit (``[evaluation]
    site_limit``): per-round evaluations the limit cuts short, and a limit above
    the sites' default that each site must have raised too."""
    out: list[str] = []
    limit = settings.evaluation.site_limit
    every = settings.evaluation.federated_every
    asked = settings.evaluations_per_site
    if limit > 0 and every > 0 and asked > limit:
        last = (limit - settings.essential_evaluations) * every
        kept = settings.essential_evaluations
        out.append(
            f"per-round federated evaluations (every {every} round(s)) stop after round "
            f"{last}: sites answer {limit} evaluations per federation ([evaluation] "
            f"site_limit, the sites' [policy] max_evaluations_per_federation) and {kept} "
            "are kept for the validation gate, the calibrators and the final evaluation"
        )
    if (limit == 0 or limit > DEFAULT_MAX_EVALUATIONS_PER_FEDERATION) and (
        asked > DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    ):
        shown = "no limit" if limit == 0 else str(limit)
        out.append(
            f"[evaluation] site_limit = {limit} ({shown}; default "
            f"{DEFAULT_MAX_EVALUATIONS_PER_FEDERATION}): this schedule asks each site for up "
            f"to {asked} evaluation releases; every site must set [policy] "
            f"max_evaluations_per_federation to at least that, or it refuses the rest "
            "(RULE_EVALUATIONS_EXHAUSTED)"
        )
    return out
