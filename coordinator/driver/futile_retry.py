"""Whether retrying a failed job can help: the refusals that asking again meets again.

Why (2026-11-27): after ``spherecal coordinator --new-federation`` over the same sites
and data, every site refused the exact calibration statistics
(``RULE_RELEASE_REPEATED``: its release ledger had already let them out). The
coordinator still retried the statistics job up to ``[training] max_round_attempts``
times — backing off and waiting for the sites between attempts — though that refusal
cannot change on a retry, and the status then repeated the whole causal chain once
per attempt. A retry is a *fresh job id over the sites still alive*, with the same
task (model, kind, round, heads, plan terms) and the coordinator's same settings; so
a refusal that follows from the site's history, its declared policy or the
coordinator's fixed configuration is met again, and only one that depends on the job
itself or on who takes part can turn out otherwise.

Each stage asks :meth:`RefusalWatch.futile` after a failed attempt. The refusals come
typed (``FailureReport.kind`` and ``.rule``, recorded by ``conduct`` as they arrive),
never read from text. A retry is skipped only when the sites that refused with an
*unchangeable* refusal in this stage's attempts leave too few others — counting every
eligible site of the roster (or of the round's selection), connected or not — for a
retry to reach what it is for: the fewest participants a job can be created with
(``[secure_aggregation]`` threshold and ``min_participants``; one plaintext upload)
or a round's ``[training] min_participants``. Where a statistics job or the final
evaluation keeps a short result, the sites in it count as refusing (they would: the
release left them), since the retry asks only the others and adds to what it keeps.
Otherwise the stage retries exactly as before: dropouts, deadlines, a site that
vanished, changeable refusals, and mixed causes where the unchangeable refusals alone
do not sink the retry. Skipping never asks a site anything: the coordinator makes
at most the retries it made before, never another.

**Unchangeable** (:data:`UNCHANGEABLE`) — asked again, the same site refuses again:

* ``BUDGET_EXCEEDED``: the site's spent ε only grows (its ledger is append-only), and a
  retry asks for the same release: a statistics plan targets the same configured ε
  whatever the roster, a distributed DP-SGD step charges the same noise multiplier at
  its worst case of ``t`` contributors, a local DP-SGD plan is the federation's. (A
  statistics plan's discrete noise meets its target within a rounding that follows
  ``n`` and ``t``; a budget within that rounding of its edge is not one a retry is
  for.)
* ``RULE_RELEASE_REPEATED``: the release already left the site (its ledger's
  ``released`` rows are never taken back), keyed by what the release *is* — federation,
  executed model, data, round, head contents — never by the job id a retry changes.
  (Its one form about a key — a key already reserved for another release — needs a
  job id used twice, which a fresh job's never is; a plaintext task's key is its task
  id, the same on a retry for the same release.)
  A site that *withheld* its input (``BAD_INPUT`` "this site withholds its input")
  had that refusal charged as the release, so it answers a retry with this rule; the
  withholding itself is not counted here (``BAD_INPUT`` also covers errors of one job's
  messages), which costs at most one more attempt.
* ``RULE_EVALUATIONS_EXHAUSTED``: the site's count of evaluations answered in this
  federation, and of the evaluated split in all federations, only grows.
* ``RULE_ATTEMPTS_EXHAUSTED``: the site's count of started jobs for this purpose whose
  input never left (a round, the moments, the federation's evaluations) only grows
  within the federation, and a retry is one more such job.
* ``RULE_PLAINTEXT_REFUSED``, ``RULE_DP_REQUIRED``: the site's declared policy against
  the coordinator's configuration (no secure aggregation, no DP noise, too little
  evaluation noise), both fixed for the federation.
* ``RULE_EVALUATION_HEADS``: the heads (and split) of the same evaluation are the same.
* ``RULE_ROUND_OUTSIDE_PLAN``: the round index of a retried round is the same.
* ``RULE_EXAMPLE_COUNT_NOISE``, ``RULE_EXTRACTOR_NOT_ALLOWED``: the federation's plan,
  which does not change while it runs.

**Changeable** — a retry may be admitted, so it is made as before:

* ``RULE_THRESHOLD_TOO_LOW``, ``RULE_TOO_FEW_PARTICIPANTS``, ``RULE_TOO_FEW_INPUTS``,
  ``RULE_DP_PLAN``: the threshold, the participant count, the survivors and the DP plan
  (its ``n`` and guaranteed ``t``) all follow who takes part.
* ``RULE_DOUBLE_REVEAL``, ``RULE_BOTH_SHARE_KINDS``, ``RULE_TASK_NOT_BOUND``: about one
  job's messages or binding (a continued job's spec, say); a fresh job is fresh.
* ``RULE_CONSISTENCY_ROUND_REQUIRED``: also raised for an unmask asked before the site
  signed its survivor view — one job's sequence.
* ``RULE_KEY_SUBSTITUTION``: the directory follows the roster.
* ``POLICY_REFUSAL`` without a rule, and every other kind (``TOO_FEW_SURVIVORS``,
  ``JOB_ABORTED``, ``SHARE_AUTHENTICATION`` — whose dealer the retry excludes —,
  ``BAD_INPUT``, ``INTERNAL_ERROR`` …): not known to repeat.

A refusal recorded after the decision (its report still in flight as the job ended)
only means a retry as before; the next attempt's check counts it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from spherecal.coordinator.driver.conduct import Refusal
from spherecal.coordinator.driver.secure_job import participants_needed
from spherecal.coordinator.driver.stages import StageContext
from spherecal.coordinator.settings import CoordinatorSettings, SecAggSettings, TrainingSettings

__all__ = [
    "CHANGEABLE",
    "UNCHANGEABLE",
    "FutileRetry",
    "RefusalWatch",
    "attempts_warning",
    "fewest_for_a_job",
    "unchangeable",
]

UNCHANGEABLE: frozenset[str] = frozenset(
    {
        "BUDGET_EXCEEDED",
        "RULE_RELEASE_REPEATED",
        "RULE_EVALUATIONS_EXHAUSTED",
        "RULE_ATTEMPTS_EXHAUSTED",
        "RULE_PLAINTEXT_REFUSED",
        "RULE_DP_REQUIRED",
        "RULE_EVALUATION_HEADS",
        "RULE_ROUND_OUTSIDE_PLAN",
        "RULE_EXAMPLE_COUNT_NOISE",
        "RULE_EXTRACTOR_NOT_ALLOWED",
    }
)
"""The ``FailureKind`` (``BUDGET_EXCEEDED``) and ``PolicyRule`` names (of a
``POLICY_REFUSAL``) that a retry of the same task meets again (module docstring)."""

CHANGEABLE: frozenset[str] = frozenset(
    {
        "RULE_THRESHOLD_TOO_LOW",
        "RULE_TOO_FEW_PARTICIPANTS",
        "RULE_TOO_FEW_INPUTS",
        "RULE_DP_PLAN",
        "RULE_DOUBLE_REVEAL",
        "RULE_BOTH_SHARE_KINDS",
        "RULE_TASK_NOT_BOUND",
        "RULE_CONSISTENCY_ROUND_REQUIRED",
        "RULE_KEY_SUBSTITUTION",
    }
)
"""The ``PolicyRule`` names a retry may find otherwise (module docstring): every rule
of ``proto/spherecal.proto`` is in exactly one of the two sets, so a new rule is
classified when it is added (``tests/unit/coordinator/test_futile_retry.py``)."""


def unchangeable(refusal: Refusal) -> bool:
    """Whether ``refusal`` is one a retry of the same task meets again."""
    if refusal.kind == "BUDGET_EXCEEDED":
        return True
    return refusal.kind == "POLICY_REFUSAL" and refusal.rule in UNCHANGEABLE


def shown(refusal: Refusal) -> str:
    """``KIND/RULE`` as the log shows a withdrawal (``KIND`` alone without a rule)."""
    if refusal.rule and refusal.rule != "RULE_UNSPECIFIED":
        return f"{refusal.kind}/{refusal.rule}"
    return refusal.kind


def fewest_for_a_job(settings: SecAggSettings, most: int, colluders: int = 0) -> int:
    """The fewest participants (at most ``most``) a secure job can be created with —
    ``n ≥ participants_needed(n)``, the threshold counting the ``colluders`` assumed,
    the check ``SecureJob`` makes — or ``most + 1`` when no job over ``most`` or fewer
    can be."""
    for n in range(2, most + 1):
        if n >= participants_needed(settings, n, colluders):
            return n
    return most + 1


@dataclass(frozen=True)
class FutileRetry:
    """A failed stage no retry can help: who refused what, and what that leaves."""

    refusals: dict[str, list[Refusal]]
    """Each refusing site's unchangeable refusals in this stage (first one first)."""
    pool: int
    """Eligible sites a retry could ask at best (the roster or the round's selection)."""
    shortfall: str
    """Why the sites left are not enough, e.g. ``fewer than the 3 a secure job needs``."""
    released: tuple[str, ...] = ()
    """Eligible sites that did not refuse but whose input is in the sum the stage
    keeps (:meth:`RefusalWatch.futile`'s ``released``): a retry meets their refusal."""

    @property
    def possible(self) -> int:
        return self.pool - len(self.refusals) - len(self.released)

    def reason(self) -> str:
        """One sentence: the sites grouped by what they refused (their words once),
        the sites whose release the kept sum holds, and why that leaves a retry short."""
        groups: dict[tuple[str, str], list[str]] = {}
        for site, refused in self.refusals.items():
            first = refused[0]
            groups.setdefault((shown(first), first.reason[:240]), []).append(site)
        said = [
            f"{', '.join(sites)} refused it: {name}" + (f": {text}" if text else "")
            for (name, text), sites in groups.items()
        ]
        if said:
            said[-1] += " — a refusal that asking again cannot change"
        if self.released:
            whose = "its" if len(self.released) == 1 else "their"
            said.append(
                f"{', '.join(self.released)} released {whose} input into the sum kept "
                "(asked again, a site refuses a release that left it)"
            )
        out = len(self.refusals) + len(self.released)
        them = "it" if out == 1 else "them"
        return (
            f"not retried: {'; '.join(said)}; without {them}, {self.possible} of the "
            f"{self.pool} eligible participants could take part, {self.shortfall}"
        )


class RefusalWatch:
    """The unchangeable refusals of one stage's attempts — a statistics kind, a
    round, the final evaluation — counted from when the stage began.

    Which refusals are the stage's: those recorded since it began for its
    ``purpose`` (``"ffc"``, ``"update"``, ``"evaluate"``), except ones naming a secure
    job that existed before it (a late report for an earlier job of that purpose:
    the board keeps every job). A plaintext task's report is recorded only while that
    task is current (``CoordinatorService.report_failure``), so it is this stage's.
    A site's refusal in an earlier attempt of the stage counts for the next, since it
    is one that repeats."""

    def __init__(self, ctx: StageContext, purpose: str) -> None:
        self.ctx = ctx
        self.purpose = purpose
        self._since = len(ctx.conduct.refusals)
        self._before = frozenset(job.job_hex for job in ctx.board.all_jobs())

    def refusals(self) -> dict[str, list[Refusal]]:
        """Each site's unchangeable refusals in this stage so far, in arrival order."""
        out: dict[str, list[Refusal]] = {}
        for refusal in self.ctx.conduct.refusals_since(self._since):
            if refusal.purpose != self.purpose or refusal.job in self._before:
                continue
            if unchangeable(refusal):
                out.setdefault(refusal.participant, []).append(refusal)
        return out

    def futile(
        self,
        pool: Collection[str],
        *,
        least: int,
        needs: str,
        released: Collection[str] = (),
    ) -> FutileRetry | None:
        """The reason no retry can help, or None (retry as before).

        ``pool``: every eligible site a retry could ask at best. A retry is futile when,
        without the sites that refused unchangeably, fewer than ``least`` are left
        (``needs`` says what needs them: a job, a round).

        ``released``: the sites whose input is in the result the stage keeps (a sum
        short of the calibration minimum, to which a retry's is added). Asked again
        for the same release, each refuses (``RULE_RELEASE_REPEATED``: one release per
        key, the site's ledger), so they count as refused before any retry asks them:
        a retry can only sum the others, and is made only if they could make a job."""
        eligible = set(pool)
        refused = {p: r for p, r in self.refusals().items() if p in eligible}
        spent = tuple(p for p in released if p in eligible and p not in refused)
        if not refused and not spent:
            return None
        possible = len(eligible) - len(refused) - len(spent)
        if possible >= least:
            return None
        shortfall = f"fewer than the {least} {needs}"
        order = self.ctx.registry.index_of
        return FutileRetry(
            refusals={p: refused[p] for p in sorted(refused, key=order)},
            pool=len(eligible),
            shortfall=shortfall,
            released=tuple(sorted(spent, key=order)),
        )


def attempts_warning(settings: CoordinatorSettings) -> list[str]:
    """The line logged at start when ``[training] max_round_attempts`` is above its
    default: a site admits that default number of started jobs per purpose whose input
    never left (its ``[policy] max_unreleased_attempts``, default 3 — the same number),
    so unless every site raised it, a fourth attempt of a round, of the statistics or
    of an evaluation meets ``RULE_ATTEMPTS_EXHAUSTED`` from the sites whose earlier
    attempts left nothing."""
    attempts = settings.training.max_round_attempts
    default = TrainingSettings().max_round_attempts
    if attempts <= default:
        return []
    return [
        f"[training] max_round_attempts = {attempts} (default {default}): a site admits "
        f"{default} started jobs per purpose whose input never left ([policy] "
        "max_unreleased_attempts, each one a free reading of its local work's timing); "
        "unless every site raised it, a later attempt is refused (RULE_ATTEMPTS_EXHAUSTED)"
    ]
