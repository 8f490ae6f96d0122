"""What a participant tells the coordinator when it withdraws: a typed ``FailureKind``.

The kind is the meaning (the coordinator branches on it: a privacy refusal is
recorded in the privacy summary, anything else is a dropout); a text travels only as
a human message. The mapping goes from the most specific class to the most general,
so a subclass is never swallowed by its parent (e.g. ``UntrustedDirectory`` is a
``ValueError`` but means something else).

**Which text leaves the site** (:func:`wire_reason`). A withdrawal is a message the
coordinator receives, so its text is one more value that leaves the site. The
exception's own text goes only where it is made of what the coordinator sent (a
spec, a directory, a signature, a plan, a downloaded tensor) or of the site's
declared policy; the text of anything that depends on the site's data or history —
an input outside the job's bound, a failure of the local computation, the privacy
budget already spent, an earlier release (which could name another federation) —
stays in the site's own log and ledger (``site_refusals``), and the coordinator gets
a fixed sentence for its kind. Unknown errors are treated as local: the safe default.

**Any failure of the local work is withheld, never an exit** (2026-11-27;
:data:`LOCAL_WORK_ERRORS`). Where the site computes on its data — training (plain or
local DP-SGD, and the released weight, reweighing and flattening of its result), the
statistics pass, an evaluation, a distributed DP-SGD step — every ``Exception`` is
failed local work: withheld to the job's masked step and counted as its release
(``SecureSteps.withhold``; a plaintext task's release is counted at once). Until then
only ``ValueError``, ``ArithmeticError``, ``RuntimeError`` and ``MemoryError`` were;
anything else — an ``IndexError``, ``KeyError``, ``TypeError`` of numpy, torch, Opacus
or the site's own code — ended the process. Why every ``Exception``:

* whether the local work raises can depend on the data, whatever the class: an index
  past a class the split lacks, a batch left empty by the split's size, a shape only
  some records give, a library's check that fires on some values. The classes numpy,
  torch and Opacus raise are not a closed list (and change between versions), so a
  list of "data errors" is a guess that the next release falsifies;
* an exit is an answer at once, outside every release: the coordinator sees the
  site's presence stream close the moment it happens, before any masked step, for a
  model and bound it chose and may vary for free — one bit per job, the oracle a
  withheld refusal exists to close (``secure_jobs``);
* what it costs is that a programming error no longer stops the site: it is withheld
  and charged like a failure of the data (the safe side for the data: the release is
  spent, nothing of it left), and it is logged in the site's own log *with its
  traceback* (:func:`unforeseen`, for anything outside :data:`FORESEEN_LOCAL_ERRORS`),
  once per task it breaks, so an operator sees it as before — only not as an exit.

What is a ``BaseException`` but no ``Exception`` — ``KeyboardInterrupt``,
``SystemExit`` — still stops the site: the operator's, not the data's. And the catch
is at those call sites only: errors of what the coordinator sent — a spec, a plan, a
model's format (``TensorFormatError`` at download), a model DP-SGD cannot train
(checked before the work) — are raised before the work starts and still refused at
once with their own text (:data:`PUBLIC_TEXT`), since they depend on what the
coordinator sent alone.
"""

from __future__ import annotations

import traceback

from spherecal import crypto
from spherecal.participant.dp_gate import NoiseRequired, PlaintextRefused, PrivacyRefused
from spherecal.participant.policy import (
    AttemptsExhausted,
    EvaluationRefused,
    EvaluationsExhausted,
    ReleaseRepeated,
    RoundOutsidePlan,
    TaskNotBound,
)
from spherecal.participant.trust import UntrustedDirectory
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import TensorFormatError
from spherecal.spherefed.privacy.charge import LOCAL_DPSGD_KIND
from spherecal.spherefed.privacy.dpsgd import UnsupportedModel
from spherecal.spherefed.privacy.ledger import BudgetExceeded

__all__ = [
    "DATA_DEPENDENT_CHARGES",
    "WITHHELD_TEXT",
    "InputWithheld",
    "KINDS",
    "LOCAL_REASONS",
    "LOCAL_WORK_ERRORS",
    "LOCAL_WORK_FAILED",
    "FORESEEN_LOCAL_ERRORS",
    "PUBLIC_TEXT",
    "RULES",
    "failure_kind",
    "policy_rule",
    "unforeseen",
    "wire_reason",
]


class InputWithheld(Exception):
    """A refusal that depends on this site's data, answered at the job's masked step
    in the input's place and counted as the job's release: an input outside the
    job's bound or not finite, or local work that failed (``SecureSteps.withhold``,
    ``ParticipantRunner._local_work_failed``).

    Why one class for every cause: the refusal is charged as the release, but which
    cause it was — the input out of bound, a ``ValueError`` of the computation, a
    torch or arithmetic error — is more about the data again (up to log₂3 bits a
    release where one was stated). So it travels as one kind (``BAD_INPUT``) and one
    sentence; :attr:`cause` and the text stay in the site's log and its audit.

    ``cause`` may be the *name* of its class alone: a job withheld before this site's
    restart, restored from its held-job record (``held_jobs``: the record keeps the
    name, never the text, which can carry values of the data)."""

    def __init__(self, cause: BaseException | str) -> None:
        if isinstance(cause, str):
            super().__init__(f"input withheld before this site's restart: {cause}")
            self.cause: BaseException | None = None
            self.cause_name = cause
            return
        super().__init__(f"input withheld: {type(cause).__name__}: {cause}")
        self.cause = cause
        self.cause_name = type(cause).__name__


WITHHELD_TEXT = (
    "this site withholds its input to this job: it is outside the job's declared bound "
    "or not finite, or the site's local computation failed (counted as the job's "
    "release; the site's own log has which)"
)
"""The one wire sentence of every :class:`InputWithheld`."""

KINDS: tuple[tuple[type[BaseException], pb.FailureKind], ...] = (
    (InputWithheld, pb.BAD_INPUT),  # one kind whatever the cause (class docstring)
    (BudgetExceeded, pb.BUDGET_EXCEEDED),
    (PrivacyRefused, pb.POLICY_REFUSAL),
    # the participant's secure-aggregation policy (spherecal.crypto.policy), before the
    # protocol errors below that some of its rules also are
    (crypto.PolicyViolation, pb.POLICY_REFUSAL),
    (PermissionError, pb.POLICY_REFUSAL),  # e.g. a plaintext upload it does not allow
    (UntrustedDirectory, pb.UNTRUSTED_DIRECTORY),
    (crypto.TooFewSurvivors, pb.TOO_FEW_SURVIVORS),
    (crypto.JobAborted, pb.JOB_ABORTED),
    (crypto.ForgedShare, pb.SHARE_AUTHENTICATION),
    (crypto.BadSignature, pb.SHARE_AUTHENTICATION),
    (crypto.BadKey, pb.SHARE_AUTHENTICATION),
    (crypto.SenderMismatch, pb.SHARE_AUTHENTICATION),
    (crypto.MalformedMessage, pb.BAD_INPUT),
    (crypto.WrongLength, pb.BAD_INPUT),
    (crypto.EncodingOverflow, pb.BAD_INPUT),
    (crypto.InvalidSpec, pb.BAD_INPUT),
    (crypto.WrongJob, pb.PROTOCOL_VIOLATION),
    (crypto.WrongRecipient, pb.PROTOCOL_VIOLATION),
    (crypto.UnknownParticipant, pb.PROTOCOL_VIOLATION),
    (crypto.Excluded, pb.PROTOCOL_VIOLATION),
    (crypto.OutOfStage, pb.PROTOCOL_VIOLATION),
    (crypto.DuplicateMessage, pb.PROTOCOL_VIOLATION),
    (crypto.UploadSlotsBusy, pb.PROTOCOL_VIOLATION),
    (crypto.UnexpectedShare, pb.PROTOCOL_VIOLATION),
    (crypto.OverlappingReveal, pb.PROTOCOL_VIOLATION),
    (crypto.InconsistentSurvivors, pb.PROTOCOL_VIOLATION),
    (crypto.JobReplayed, pb.PROTOCOL_VIOLATION),
    # any other secure-aggregation error (e.g. a DP plan the ring cannot hold safely):
    # the job's parameters are unusable for this participant
    (crypto.SecAggError, pb.BAD_INPUT),
    (TensorFormatError, pb.BAD_INPUT),
    (UnsupportedModel, pb.BAD_INPUT),
    (ValueError, pb.BAD_INPUT),
)


RULES: tuple[tuple[type[BaseException], pb.PolicyRule], ...] = (
    (crypto.ConsistencyRoundRequired, pb.RULE_CONSISTENCY_ROUND_REQUIRED),
    (crypto.ThresholdTooLow, pb.RULE_THRESHOLD_TOO_LOW),
    (crypto.TooFewParticipants, pb.RULE_TOO_FEW_PARTICIPANTS),
    (crypto.TooFewInputs, pb.RULE_TOO_FEW_INPUTS),
    (crypto.DoubleReveal, pb.RULE_DOUBLE_REVEAL),
    (crypto.OverlappingReveal, pb.RULE_BOTH_SHARE_KINDS),
    (crypto.KeySubstitution, pb.RULE_KEY_SUBSTITUTION),
    (ReleaseRepeated, pb.RULE_RELEASE_REPEATED),
    (EvaluationsExhausted, pb.RULE_EVALUATIONS_EXHAUSTED),
    (AttemptsExhausted, pb.RULE_ATTEMPTS_EXHAUSTED),
    (TaskNotBound, pb.RULE_TASK_NOT_BOUND),
    (RoundOutsidePlan, pb.RULE_ROUND_OUTSIDE_PLAN),
    (EvaluationRefused, pb.RULE_EVALUATION_HEADS),
    (PlaintextRefused, pb.RULE_PLAINTEXT_REFUSED),
    (PermissionError, pb.RULE_PLAINTEXT_REFUSED),
    (NoiseRequired, pb.RULE_DP_REQUIRED),
    (PrivacyRefused, pb.RULE_DP_PLAN),
)
"""Which policy rule a ``POLICY_REFUSAL`` is (most specific first)."""


def policy_rule(error: BaseException) -> pb.PolicyRule:
    """The rule behind a policy refusal (``RULE_UNSPECIFIED`` for anything else)."""
    for cls, rule in RULES:
        if isinstance(error, cls):
            return rule
    return pb.RULE_UNSPECIFIED


def failure_kind(error: BaseException) -> pb.FailureKind:
    """The wire meaning of ``error`` (``INTERNAL_ERROR`` for anything unforeseen)."""
    for cls, kind in KINDS:
        if isinstance(error, cls):
            return kind
    return pb.INTERNAL_ERROR


LOCAL_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (InputWithheld, WITHHELD_TEXT),
    (
        crypto.EncodingOverflow,
        "refusing to encode: this site's input is outside the job's declared bound or not "
        "finite (withheld, and counted as the job's release)",
    ),
    (
        ReleaseRepeated,
        "this release already left this site under the same key (one release per "
        "purpose, [policy]); the site's own audit names the earlier one",
    ),
)
"""Errors whose text depends on the site's data or history: a fixed sentence goes
instead (checked before :data:`PUBLIC_TEXT`, since some are subclasses of its
classes)."""

PUBLIC_TEXT: tuple[type[BaseException], ...] = (
    PrivacyRefused,  # the job's plan or spec against this site's declared policy
    crypto.SecAggError,  # the coordinator's messages, spec, directory, stage
    UntrustedDirectory,
    TensorFormatError,
    UnsupportedModel,
)
"""Errors whose text is made of what the coordinator sent and the site's declared
policy: it goes as it is."""

LOCAL_WORK_FAILED = (
    "this site's local computation for the task failed; the site's own log has the reason"
)
"""The text for anything else (a failed training step, statistics pass or evaluation,
an unforeseen error): its message may carry values of the local data."""

LOCAL_WORK_ERRORS: tuple[type[BaseException], ...] = (Exception,)
"""What a site's local computation on its data (training, statistics, evaluation, a
DP-SGD round or step) may raise and be answered as failed local work — withheld to
the job's masked step and counted as its release — rather than end the process:
every ``Exception`` (module docstring: whether it is raised can depend on the data,
and an exit would answer at once, outside every release). Caught at the call sites of
the local work alone, never around what the coordinator sent."""

FORESEEN_LOCAL_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    ArithmeticError,
    RuntimeError,
    MemoryError,
    InputWithheld,
    crypto.SecAggError,
)
"""The failures the local work is known to have on some data: bad values
(``ValueError``, numpy's ``LinAlgError``), arithmetic (training that diverges raises
``FloatingPointError``), torch's own errors (``RuntimeError``, its CPU allocator's
"can't allocate memory" among them), numpy's failed allocations (``MemoryError``: how
much memory a task needs follows the split's size), an input outside the job's bound
(``EncodingOverflow``) — logged as one line. Anything else is logged with its
traceback (:func:`unforeseen`)."""


def unforeseen(error: BaseException) -> str | None:
    """The traceback of a failure of the local work that no foreseen class covers
    (:data:`FORESEEN_LOCAL_ERRORS`) — a programming error as likely as the data —
    for the site's own log; None for a foreseen one. It stays in that log (its text
    and values are the site's: never on the wire, :func:`wire_reason`)."""
    if isinstance(error, FORESEEN_LOCAL_ERRORS):
        return None
    return "".join(traceback.format_exception(error)).rstrip()


DATA_DEPENDENT_CHARGES = frozenset({LOCAL_DPSGD_KIND})
"""Release kinds whose ε the site computes from its own data (local DP-SGD); a
refusal of one never names that ε."""


def wire_reason(error: BaseException) -> str:
    """The human text a withdrawal carries to the coordinator (module docstring): the
    exception's own text only where it is built from what the coordinator sent.

    A :class:`BudgetExceeded` names the limit it would cross (the site's declared
    budget or per-release target, its δ) and, where that ε follows from the plan the
    coordinator sent alone (DP statistics, distributed DP-SGD), the release's ε — what
    an operator needs to fix the plan — but never what the site has already spent,
    which is its history in other releases and federations. Local DP-SGD's ε follows
    the site's example count (its sampling rate is ``1/⌈n/b⌉``), so its refusal names
    the limit alone (:mod:`spherecal.participant.dpsgd_round`)."""
    if isinstance(error, BudgetExceeded):
        if error.release_kind in DATA_DEPENDENT_CHARGES:
            return (
                f"refusing {error.release_kind} for this federation: its plan's rounds "
                f"would exceed this site's {error.limit_name} ε = {error.budget_epsilon:g} "
                f"at δ = {error.delta:g}; their ε follows this site's example count, so "
                "it stays in the site's own audit"
            )
        return (
            f"refusing {error.release_kind} release: it would exceed this site's "
            f"{error.limit_name} "
            f"ε = {error.budget_epsilon:g} at δ = {error.delta:g} (this release ε = "
            f"{error.release_epsilon:.4g}); the site's own audit has what it spent"
        )
    for cls, text in LOCAL_REASONS:
        if isinstance(error, cls):
            return text
    if isinstance(error, PUBLIC_TEXT):
        return str(error)
    return LOCAL_WORK_FAILED
