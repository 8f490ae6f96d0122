"""The participant's ``[policy]`` table: what it refuses, whatever the coordinator asks.

Why on the participant: it is the party whose data is at stake, and a malicious
coordinator chooses every job spec, survivor view, model and evaluation head. The
secure-aggregation rules are enforced in :class:`crypto.SecAggParticipant` itself
(:class:`spherecal.crypto.policy.SecAggPolicy`, built by :meth:`PolicySettings.secagg`); the
process-level rules — at most one release of each statistic per federation and per
model (:mod:`spherecal.participant.release_ledger`), evaluation heads of the plan's shape and at
most ``max_evaluation_heads`` of them — are checked by the runner before it computes
anything. Every default is the safe setting; weakening one is logged at WARNING when
the process starts (:meth:`PolicySettings.relaxations`). Keys, defaults and refusal
kinds: ``docs/privacy.md``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from spherecal.crypto.policy import DEFAULT_MIN_INPUTS, DEFAULT_MIN_PARTICIPANTS, SecAggPolicy
from spherecal.participant.dp_gate import PrivacyRefused
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.task_context import task_context
from spherecal.spherefed.privacy.evaluation_noise import (
    DEFAULT_EVALUATION_NOISE_SD,
    DEFAULT_MAX_EVALUATIONS_PER_FEDERATION,
)

__all__ = [
    "DEFAULT_EXAMPLE_COUNT_NOISE_SD",
    "DEFAULT_MAX_EVALUATION_HEADS",
    "DEFAULT_MAX_UNRELEASED_ATTEMPTS",
    "DEFAULT_MAX_VALIDATION_HEADS",
    "DEFAULT_SHARE_WAIT_S",
    "AttemptsExhausted",
    "EvaluationRefused",
    "EvaluationsExhausted",
    "PolicySettings",
    "ReleaseRepeated",
    "RoundOutsidePlan",
    "TaskNotBound",
    "require_task_bound",
]

DEFAULT_MAX_EVALUATION_HEADS = 2
"""FFC and CCVR: the calibrated heads a federation evaluates besides the model's own."""

DEFAULT_EXAMPLE_COUNT_NOISE_SD = 4
"""σ (examples) of the DP noise on the example count a site's training updates are
weighted by, drawn once per training split (:mod:`spherecal.participant.example_weight`):
ε ≈ 1.0 at δ = 1e-5 for each draw."""
DEFAULT_SHARE_WAIT_S = 900.0
"""The coordinator's default first-stage deadline (``[timeouts] round_s``): an honest
coordinator sends the share step (or moves on) within it."""

DEFAULT_MAX_UNRELEASED_ATTEMPTS = 3
"""Started jobs per purpose whose input never left (``[policy]
max_unreleased_attempts``): the coordinator's default ``[training]
max_round_attempts``, so an honest coordinator's retries of a round, of the
statistics or of an evaluation fit."""

DEFAULT_MAX_VALIDATION_HEADS = 16
"""One validation evaluation scores every grid point of the closed-form calibrators
(FFC+bias, LDA, QDA × a 5-point grid = 15, plus one spare) on the local
*validation* split, never on test; its counts go through secure aggregation."""


class ReleaseRepeated(PrivacyRefused):
    """This release already left the site under its key (an update for this round or
    the same exact update — executed model, seed, broadcast, local training — under
    another round index, the per-class moments for this federation, model or —
    exactly — this data, this evaluation): a second release over a different set of
    participants would give this site's input by differencing (``[policy]
    one_update_per_round``, ``one_release_per_model``,
    ``reuse_data_across_federations``, ``exact_moments_of_changed_data``)."""


class RoundOutsidePlan(PrivacyRefused):
    """A training task for a round index outside ``[0, rounds)`` of the plan this site
    joined under: each round is one update release (``one_update_per_round``), so a
    coordinator free to name further rounds could ask for as many updates as it liked
    — of one model, moved by an ulp, trained with the seed it sends. The plan's round
    count bounds them."""


class EvaluationsExhausted(PrivacyRefused):
    """This site already made ``max_evaluations_per_federation`` evaluation releases
    in this federation, or ``max_evaluations_per_split`` of the evaluated split in all
    federations together. Each evaluation's noise is fresh, and the same counts can be
    asked for again at no cost — the split's total is in every evaluation, and a model
    moved by one ulp is a new release key — so an unbounded number of evaluations would
    average the noise away (``DEFAULT_MAX_EVALUATIONS_PER_FEDERATION``)."""


class AttemptsExhausted(PrivacyRefused):
    """This site already started ``max_unreleased_attempts`` jobs for this purpose —
    a training round, the per-class moments, the federation's evaluations — whose
    input never left. A job the coordinator abandons during its local work costs no
    release (a release counts when its input leaves, so that an honest retry is
    admitted), yet when the site next speaks follows how long that work took, and
    whether it failed; asked again under a fresh job id it would be read as often as
    the coordinator liked (``docs/threat_model.md``, *Timing*). The refusal comes
    before any local work and depends only on what the coordinator sent."""


class TaskNotBound(PrivacyRefused):
    """A secure job whose spec's context is not the digest of the task it came with
    (:mod:`spherecal.proto.task_context`). The context is what makes every member of a
    job compute on the same model and inputs (their signatures cover the spec): a
    coordinator that sent the members different models — the real one to a target,
    one with a known update or known statistics to everyone else (Pasquini et al.
    2022) — would read the target's input from one sum."""


class EvaluationRefused(PrivacyRefused):
    """An evaluation this participant will not run: heads of a shape other than the
    plan's, more heads than ``max_evaluation_heads``, or duplicate head names (each
    crafted head would be one more count over the local test labels)."""


def require_task_bound(
    context: bytes, task: pb.TrainTask | pb.StatisticsTask | pb.EvaluateTask, plan: pb.Plan
) -> None:
    """Raise :class:`TaskNotBound` unless ``context`` (a job spec's) is the digest of
    ``task`` under ``plan``, the plan this site joined under. Always enforced: with a
    current coordinator a job that is not bound to its task is never legitimate."""
    expected = task_context(task, plan)
    if not hmac.compare_digest(context, expected):
        what = (
            "carries no task context"
            if not context
            else "is bound to another task than the one it came with"
        )
        raise TaskNotBound(
            f"the secure job's spec {what} (its model, round, inputs and the plan this "
            "site joined under): every member of a job must compute on the same task"
        )


@dataclass(frozen=True, kw_only=True)
class PolicySettings:
    """The ``[policy]`` table of a participant config (every default is the safe one)."""

    require_consistency_round: bool = True
    """Refuse secure-aggregation jobs without the signed survivor-set round
    (Bonawitz et al. 2017, round 3): without it a coordinator that shows different
    survivor sets to different holders rebuilds one input alone."""
    require_majority_threshold: bool = True
    """Refuse thresholds with ``2t <=`` share holders plus ``[privacy] colluders`` (two
    groups of ``t`` holders, the colluders in both, could reveal both secrets of one
    participant)."""
    min_participants: int = DEFAULT_MIN_PARTICIPANTS
    """Refuse jobs with fewer participants (three 2-party jobs give each input by
    differencing); at least 2."""
    min_inputs: int = DEFAULT_MIN_INPUTS
    """Reveal unmask shares only for a sum of at least this many inputs; at least 2."""
    one_release_per_model: bool = True
    """Release the per-class moments (FFC, CCVR, LDA, QDA: one family) at most once
    per federation and at most once per executed model, and each evaluation (executed
    model, split, head contents) once; recorded in ``state_dir/privacy.db`` so a
    restart does not reset it (:mod:`spherecal.participant.release_ledger`)."""
    one_update_per_round: bool = True
    """Release at most one training update per (federation, round), and an exact
    update at most once in any federation: the same round asked twice over two
    rosters, or a second round — or a second federation's — from the same executed
    model with the same seed (the same update bit for bit), gives this site's update
    by differencing. A federation run again from the same model and ``[federation]
    seed`` on unchanged data loses its first round to it."""
    reuse_data_across_federations: bool = False
    """Allow a second *exact* (un-noised) release of the per-class moments of the same
    local data under another federation. Off: a new federation on the same data gets
    the moments only with DP noise (``[privacy] enabled``)."""
    exact_moments_of_changed_data: bool = False
    """Allow a second *exact* (un-noised) release of the per-class moments under
    another federation after this site's training split changed (a new data
    fingerprint). Off: exact moments leave this site in one federation only; a later
    federation gets them only with DP noise (``[privacy] enabled``). Why: a
    coordinator can vary weights the features never read (the outgoing weights of a
    hidden unit that is never active) and so run a new executed model with the same
    features; the difference of the two exact releases is then the statistics of the
    records that were added or changed, exactly."""
    evaluation_noise_sd: float = DEFAULT_EVALUATION_NOISE_SD
    """Distributed DP noise on evaluation counts: the total standard deviation
    (counts) that any guaranteed set of contributors reaches on every entry of the
    sum (:mod:`spherecal.spherefed.privacy.evaluation_noise`). 0: exact counts, which
    two evaluations over rosters that differ by this site give exactly (logged)."""
    example_count_noise_sd: int = DEFAULT_EXAMPLE_COUNT_NOISE_SD
    """Standard deviation (examples) of the discrete Gaussian noise on the example
    count this site's training updates are weighted by (FedAvg's ``n_k``), drawn once
    per training split and used in every round and every federation on that data
    (:mod:`spherecal.participant.example_weight`): the count is the same every round,
    so rounds over rosters that differ by this site would otherwise give it exactly.
    A plan whose ``[federation] example_count_noise_sd`` is below this is refused.
    0: the exact count (logged)."""
    max_evaluation_heads: int = DEFAULT_MAX_EVALUATION_HEADS
    """Most calibrated heads one evaluation may carry (besides the model's own)."""
    max_validation_heads: int = DEFAULT_MAX_VALIDATION_HEADS
    """Most candidate heads one *validation-split* evaluation (the calibrators'
    ridge/shrinkage grid) may carry; such an evaluation never touches the test split."""
    max_evaluations_per_federation: int = DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    """Most evaluation releases (either split) this site makes in one federation;
    each is fresh noise on counts that can be asked for again at no cost (a model
    moved by one ulp is a new release), so their number bounds how far the noise
    averages down. The default (4) covers the coordinator's default schedule (at most
    3); per-round evaluations (``[evaluation] federated_every``, ``[federation]
    round_gate``) need more, and the coordinator keeps within the limit it is told
    the sites have (``[evaluation] site_limit``). 0: no limit (logged)."""
    max_evaluations_per_split: int | None = None
    """Most evaluation releases this site ever makes of one local split (its test or
    validation split, as fingerprinted: the same records), across every federation it
    takes part in. Unset: ``max_evaluations_per_federation``'s value — one
    federation's allowance for the split's lifetime. Why: the per-federation count
    starts over in each new federation, while the counts a coordinator can ask for
    again (the split's total is in every evaluation; a constant head's counts are its
    label histogram) stay the same as long as the records do, so federation after
    federation on unchanged data averaged their fresh noise down without bound. A
    split that changes (a record added) starts a count of its own. Set it higher to
    let more federations evaluate on unchanged data (logged); 0: no limit across
    federations (logged)."""
    max_unreleased_attempts: int = DEFAULT_MAX_UNRELEASED_ATTEMPTS
    """Most jobs this site starts for one purpose in a federation whose input never
    leaves — per training round, for the per-class moments, and for the federation's
    evaluations together (this times ``max_evaluations_per_federation``). A job
    abandoned during its local work charges no release, but the moment the site next
    speaks follows that work (its length grows with the local example count; a crafted
    model can make it fail on some records), so each such job is one free reading of
    it unless ``min_local_work_s`` holds it; this bounds how many. Counted in
    ``state_dir/privacy.db`` (a restart does not reset it); a job continued under its
    own id is the same attempt. The default (3) is the coordinator's default
    ``[training] max_round_attempts``. 0: no limit (logged)."""
    follow_new_federation: bool = False
    """Whether this process joins another federation when the coordinator, on a
    rejoin, runs a different one than the process joined (a coordinator restarted on
    a fresh state directory, or one cycling federations). Off: the process ends
    (status 1) and the site's operator decides whether to start it again for the new
    one — every per-federation bound (one update per round, the moments once, the
    evaluations per federation) starts over in a new federation, so the coordinator
    must not be able to start one on its own. On: logged as a weakening."""
    trust_ca_for_members: bool = False
    """Under mutual TLS, whether any member the federation's CA issued a certificate to
    may sit in this site's jobs without being pinned in ``[tls] peer_keys``. Off (the
    default): the site refuses to start without that file — whoever holds the CA key
    can issue certificates for members whose inputs it knows, put them in a job beside
    this site and read this site's input from the sum, so the sites pin the members
    they agreed on among themselves (``spherecal certs pin``). On: only where the CA's
    key is held by a party independent of the coordinator's operator; logged as a
    weakening. Setting both is a contradiction and refused."""
    min_local_work_s: float = 0.0
    """Hold a secure job's input until this many seconds after its task arrived, so
    the time of the masked upload does not reveal how long the local work took (it
    grows with the number of local examples). 0: off. Set it above the slowest local
    work of the federation; a task that takes longer is logged. At 0 a secure
    statistics job's feature pass runs while its keys and shares are exchanged: their
    moments do not wait for it, but the share answer, computed while it runs, then
    follows the example count weakly (as the masked upload does strongly at 0;
    docs/threat_model.md, Timing); above 0 the order is strict: keys, shares, then the
    work."""
    share_wait_s: float = DEFAULT_SHARE_WAIT_S
    """Answer a secure job's share stage *before* the local work: after advertising
    its keys the participant waits up to this long for the job's share step (key
    sharing does not depend on the data, so its timing then says nothing about it),
    and only then trains, computes statistics or evaluates. If the step has not come
    by then, it does the local work first and answers the share step afterwards.
    0: off (shares follow the local work and their time tracks the example count;
    logged as a weakening)."""

    def __post_init__(self) -> None:
        self.secagg()  # validates the secure-aggregation keys (typed InvalidSpec)
        if not isinstance(self.one_release_per_model, bool):
            raise ValueError("policy one_release_per_model must be true or false")
        for key in (
            "one_update_per_round",
            "reuse_data_across_federations",
            "exact_moments_of_changed_data",
            "follow_new_federation",
            "trust_ca_for_members",
        ):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"policy {key} must be true or false")
        sd = self.evaluation_noise_sd
        if isinstance(sd, bool) or not isinstance(sd, (int, float)) or not 0 <= sd <= 1e6:
            raise ValueError(f"policy evaluation_noise_sd must be in [0, 1e6] counts, got {sd!r}")
        count_sd = self.example_count_noise_sd
        if (
            isinstance(count_sd, bool)
            or not isinstance(count_sd, int)
            or not 0 <= count_sd <= 1_000_000
        ):
            raise ValueError(
                f"policy example_count_noise_sd must be an integer in [0, 1000000] examples, "
                f"got {count_sd!r}"
            )
        heads = self.max_evaluation_heads
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 0:
            raise ValueError(f"policy max_evaluation_heads must be an integer >= 0, got {heads!r}")
        vheads = self.max_validation_heads
        if isinstance(vheads, bool) or not isinstance(vheads, int) or vheads < 0:
            raise ValueError(f"policy max_validation_heads must be an integer >= 0, got {vheads!r}")
        most = self.max_evaluations_per_federation
        if isinstance(most, bool) or not isinstance(most, int) or most < 0:
            raise ValueError(
                f"policy max_evaluations_per_federation must be an integer >= 0, got {most!r}"
            )
        per_split = self.max_evaluations_per_split
        if per_split is not None and (
            isinstance(per_split, bool) or not isinstance(per_split, int) or per_split < 0
        ):
            raise ValueError(
                f"policy max_evaluations_per_split must be an integer >= 0, got {per_split!r}"
            )
        attempts = self.max_unreleased_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise ValueError(
                f"policy max_unreleased_attempts must be an integer >= 0, got {attempts!r}"
            )
        for key in ("min_local_work_s", "share_wait_s"):
            seconds = getattr(self, key)
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, (int, float))
                or not 0 <= seconds < 86400
            ):
                raise ValueError(f"policy {key} must be in [0, 86400) s, got {seconds!r}")

    def secagg(self, *, colluders: int = 0) -> SecAggPolicy:
        """The rules :class:`crypto.SecAggParticipant` enforces itself; ``colluders``:
        the members of a job this site assumes collude with the coordinator (its
        ``[privacy] colluders``), which the majority rule counts (``2t > h + c``)."""
        return SecAggPolicy(
            require_consistency_round=self.require_consistency_round,
            require_majority_threshold=self.require_majority_threshold,
            min_participants=self.min_participants,
            min_inputs=self.min_inputs,
            colluders=colluders,
        )

    def relaxations(self) -> tuple[str, ...]:
        """Every rule weaker than its default, with what it exposes (logged at start)."""
        out = list(self.secagg().relaxations())
        if not self.one_release_per_model:
            out.append(
                "one_release_per_model = false: repeated statistics requests over different "
                "participant sets give one participant's statistics by differencing"
            )
        if not self.one_update_per_round:
            out.append(
                "one_update_per_round = false: one round asked twice over two rosters, or "
                "a second round from the same executed model and seed, gives this site's "
                "update by differencing"
            )
        if self.reuse_data_across_federations:
            out.append(
                "reuse_data_across_federations = true: a new federation on the same data gets "
                "its exact per-class moments again; differencing across federations gives them"
            )
        if self.exact_moments_of_changed_data:
            out.append(
                "exact_moments_of_changed_data = true: a new federation after this site's "
                "data changed gets its exact per-class moments again; the difference with "
                "the earlier release is the changed records' statistics"
            )
        if self.evaluation_noise_sd == 0:
            out.append(
                "evaluation_noise_sd = 0: evaluation counts leave exactly; two evaluations over "
                "rosters that differ by this site give its label counts"
            )
        elif self.evaluation_noise_sd < DEFAULT_EVALUATION_NOISE_SD:
            out.append(
                f"evaluation_noise_sd = {self.evaluation_noise_sd:g} (default "
                f"{DEFAULT_EVALUATION_NOISE_SD:g}): less noise on evaluation counts"
            )
        if self.example_count_noise_sd == 0:
            out.append(
                "example_count_noise_sd = 0: training updates carry this site's exact example "
                "count, the same every round; two rounds over rosters that differ by this site "
                "give it"
            )
        elif self.example_count_noise_sd < DEFAULT_EXAMPLE_COUNT_NOISE_SD:
            out.append(
                f"example_count_noise_sd = {self.example_count_noise_sd} (default "
                f"{DEFAULT_EXAMPLE_COUNT_NOISE_SD}): less noise on the example count "
                "training updates are weighted by"
            )
        if self.max_evaluation_heads > DEFAULT_MAX_EVALUATION_HEADS:
            out.append(
                f"max_evaluation_heads = {self.max_evaluation_heads} (default "
                f"{DEFAULT_MAX_EVALUATION_HEADS}): crafted heads count local test labels"
            )
        if self.max_validation_heads > DEFAULT_MAX_VALIDATION_HEADS:
            out.append(
                f"max_validation_heads = {self.max_validation_heads} (default "
                f"{DEFAULT_MAX_VALIDATION_HEADS}): crafted heads count local validation labels"
            )
        if self.follow_new_federation:
            out.append(
                "follow_new_federation = true: a coordinator can move this process into a "
                "new federation on its own, where every per-federation bound starts over"
            )
        if self.trust_ca_for_members:
            out.append(
                "trust_ca_for_members = true: whoever holds the federation CA's key can add "
                "members whose inputs it knows to this site's jobs and read this site's "
                "input from the sum"
            )
        most = self.max_evaluations_per_federation
        if most == 0 or most > DEFAULT_MAX_EVALUATIONS_PER_FEDERATION:
            out.append(
                f"max_evaluations_per_federation = {most} (default "
                f"{DEFAULT_MAX_EVALUATIONS_PER_FEDERATION}; 0: no limit): more evaluations "
                "per federation average the counts' noise further down"
                + (
                    " (and, max_evaluations_per_split being unset, of each split across "
                    "federations too)"
                    if self.max_evaluations_per_split is None
                    else ""
                )
            )
        per_split = self.max_evaluations_per_split
        if per_split is not None and (
            per_split == 0 or per_split > DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
        ):
            out.append(
                f"max_evaluations_per_split = {per_split} (default: "
                "max_evaluations_per_federation's value; 0: no limit): more evaluations of "
                "an unchanged split across federations average the counts' noise further down"
            )
        attempts = self.max_unreleased_attempts
        if attempts == 0 or attempts > DEFAULT_MAX_UNRELEASED_ATTEMPTS:
            out.append(
                f"max_unreleased_attempts = {attempts} (default "
                f"{DEFAULT_MAX_UNRELEASED_ATTEMPTS}; 0: no limit): more jobs abandoned during "
                "their local work, each a free reading of how long it took"
                + ("" if self.min_local_work_s > 0 else " (min_local_work_s = 0 does not hold it)")
            )
        if self.share_wait_s == 0:
            out.append(
                "share_wait_s = 0: shares are sent after the local work, so their time "
                "tracks how long it took (and with it the local example count)"
            )
        return tuple(out)
