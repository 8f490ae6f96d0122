"""Typed errors of the secure-aggregation package.

Every error raised on purpose by ``crypto`` derives from :class:`SecAggError`, and
the names are flat and say *what happened*, so that the service can map each one
to a protocol answer (reject this message / abort the job / retry later) without
parsing strings::

    SecAggError
    ├── InvalidSpec          a JobSpec that is inconsistent or unsafe (bad threshold,
    │   │                    degree, scale that could overflow, ...)
    │   ├── RingOverflowRisk the noisy sum could wrap the 64-bit ring (DP sizing)
    │   └── NoiseTooLarge    per-participant noise beyond what the exact samplers support
    ├── MalformedMessage     bytes that are not a canonical encoding of the expected
    │                        message type (truncated, trailing data, bad magic, ...)
    ├── WrongLength          a vector, noise vector or chunk of the wrong length
    ├── EncodingOverflow     inputs outside the declared bound, NaN/Inf, or noise
    │                        larger than the declared noise bound
    ├── AggregateOutOfRange  a decoded sum outside ``n_inputs × (bound + noise bound)``:
    │                        some contributor uploaded an out-of-bound input
    ├── WrongJob             a message that belongs to another job id
    ├── WrongRecipient       a message or ciphertext addressed to someone else
    ├── SenderMismatch       the authenticated transport identity is not the sender
    │                        named inside the message
    ├── UnknownParticipant   a sender that is not part of the job at all
    ├── Excluded             a sender that was part of the job but was left out at
    │                        an earlier stage (e.g. never advertised its keys)
    ├── OutOfStage           a message or call that does not belong to the current
    │                        stage of the state machine
    ├── DuplicateMessage     a second message of a kind that may be sent only once
    │                        (including a duplicate chunk index from one sender)
    ├── UploadSlotsBusy      all in-flight upload slots of the server are taken;
    │                        retry the upload later (nothing was stored)
    ├── BadSignature         an Ed25519 signature that does not verify
    ├── BadKey               a public key that is malformed, of low order, or not
    │                        the key the participant advertised
    ├── ForgedShare          a Shamir share that fails its AES-GCM tag or its
    │                        commitment, or reconstructs a secret that does not match
    │                        what its owner committed to (a participant attaches a
    │                        signed ``ShareComplaint`` naming the dealer)
    ├── BadComplaint         a share complaint naming no share its signer received
    ├── UnexpectedShare      a revealed share the server did not ask for (wrong kind
    │                        for that owner, or from someone who does not hold it)
    ├── InconsistentSurvivors a survivor/dropout view that contradicts what this
    │                        participant saw or signed earlier
    ├── JobReplayed          a second run of a job id this participant already ran
    ├── TooFewSurvivors      fewer than the threshold ``t`` (or ``min_participants``)
    │                        remain; carries ``needed``, ``remaining`` and ``stage``
    ├── JobAborted           any call on a job that has already failed
    └── PolicyViolation      the participant's own privacy policy
        │                    (:class:`spherecal.crypto.policy.SecAggPolicy`) refuses the job
        ├── ConsistencyRoundRequired  a spec without the signed survivor-set round,
        │                    or an unmask request before this participant signed
        ├── ThresholdTooLow  ``2t <=`` share holders: two disjoint holder groups
        │                    could each reveal one kind of a participant's secrets
        ├── TooFewParticipants  fewer participants in the job than the policy's minimum
        ├── TooFewInputs     fewer inputs in the sum than the policy's minimum
        ├── DoubleReveal     a second, different unmask request in the same job
        ├── OverlappingReveal  an unmask request asking for both share kinds of one
        │                    peer (survivor and dropout sets overlap)
        └── KeySubstitution  roster keys not signed by the peer's pinned identity
                             (or from a peer it holds no pinned key for), this
                             participant's own keys altered, or one key listed twice

Every class has a stable ``kind`` string (its name in snake_case, e.g.
``"threshold_too_low"``): the wire layer maps it to a protocol enum, so callers never
parse messages. Kinds never change once released.

How the state machines use them:

* :class:`~spherecal.crypto.server.SecAggServer` — every error raised by a ``receive_*`` /
  ``absorb*`` method means *that message was rejected and nothing was stored*: the
  job stays alive for everyone else. Only :class:`TooFewSurvivors` (from
  ``close_stage``/``finish``), :class:`ForgedShare` from ``finish`` (a secret that
  cannot be reconstructed consistently) and :class:`AggregateOutOfRange` from
  ``finish`` abort the job.
* :class:`~spherecal.crypto.participant.SecAggParticipant` — an error raised while processing
  a message from the coordinator is a *refusal*: the participant wipes its job
  secrets and answers every later call with :class:`JobAborted`. A participant that
  has seen the coordinator misbehave must not keep talking to it. A
  :class:`PolicyViolation` raised by the constructor means the job was refused
  before any key was made or any job id claimed. Errors caused by the local caller
  (``set_input`` with a wrong length, out-of-bound values) do not poison the job.

Messages never contain key material or plaintext values: it is safe to log them.
"""

from __future__ import annotations

import math
import re

_MAX_SIGNED = (1 << 63) - 1  # spherecal.crypto.ring.MAX_SIGNED (not imported: ring imports us)

__all__ = [
    "AggregateOutOfRange",
    "BadComplaint",
    "BadKey",
    "BadSignature",
    "ConsistencyRoundRequired",
    "DoubleReveal",
    "DuplicateMessage",
    "EncodingOverflow",
    "Excluded",
    "ForgedShare",
    "InconsistentSurvivors",
    "InvalidSpec",
    "JobAborted",
    "JobReplayed",
    "KeySubstitution",
    "MalformedMessage",
    "NoiseTooLarge",
    "OutOfStage",
    "OverlappingReveal",
    "PolicyViolation",
    "RingOverflowRisk",
    "SecAggError",
    "SenderMismatch",
    "ThresholdTooLow",
    "TooFewInputs",
    "TooFewParticipants",
    "TooFewSurvivors",
    "UnexpectedShare",
    "UnknownParticipant",
    "UploadSlotsBusy",
    "WrongJob",
    "WrongLength",
    "WrongRecipient",
]


class SecAggError(Exception):
    """Base of every deliberate error of the secure-aggregation package.

    ``kind`` is a stable machine-readable name (the class name in snake_case), set
    for every subclass, so the service maps errors to protocol enums without
    parsing messages."""

    kind: str = "sec_agg_error"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" not in cls.__dict__:
            cls.kind = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


class InvalidSpec(SecAggError):
    """The job specification is inconsistent or unsafe."""


class MalformedMessage(SecAggError):
    """Bytes that are not the canonical encoding of the expected message."""


class WrongLength(SecAggError):
    """A vector, noise vector or chunk does not have the length the job declares."""


class EncodingOverflow(SecAggError):
    """An input could make the ring sum wrap around (or is NaN/Inf)."""


class WrongJob(SecAggError):
    """A message carries a different job id."""


class WrongRecipient(SecAggError):
    """A message or share ciphertext is addressed to another participant."""


class SenderMismatch(SecAggError):
    """The transport-authenticated sender differs from the sender in the message."""


class UnknownParticipant(SecAggError):
    """The sender is not one of the job's participants."""


class Excluded(SecAggError):
    """The sender is in the job but was left out at an earlier stage."""


class OutOfStage(SecAggError):
    """A message or call that the current stage does not accept."""


class DuplicateMessage(SecAggError):
    """A message that may be sent once arrived a second time."""


class UploadSlotsBusy(SecAggError):
    """Every in-flight upload slot is taken; retry later. Nothing was stored."""


class BadSignature(SecAggError):
    """An Ed25519 signature did not verify."""


class BadKey(SecAggError):
    """A public key is malformed, of low order, or not the one that was advertised."""


class ForgedShare(SecAggError):
    """A share failed authentication, its commitment, or consistent reconstruction.

    When a participant detects it on a share addressed to it, ``complaint`` is the
    signed :class:`spherecal.crypto.messages.ShareComplaint` naming the dealer (send it to the
    coordinator so it can exclude the dealer on retry); otherwise ``None``."""

    def __init__(self, message: str, *, complaint: object | None = None) -> None:
        super().__init__(message)
        self.complaint = complaint

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_forged, (str(self), self.complaint))


def _rebuild_forged(message: str, complaint: object | None) -> ForgedShare:
    return ForgedShare(message, complaint=complaint)


class BadComplaint(SecAggError):
    """A share complaint that names no share its signer received from that dealer."""


class AggregateOutOfRange(SecAggError):
    """The decoded sum lies outside ``n_inputs × (bound + noise bound)``: at least one
    contributor uploaded a well-formed but out-of-bound input. The job is aborted
    and the sum is not returned."""


class UnexpectedShare(SecAggError):
    """A revealed share that was not requested from that sender."""


class InconsistentSurvivors(SecAggError):
    """The coordinator's survivor view contradicts what this participant saw."""


class JobReplayed(SecAggError):
    """This participant already ran (or started) a job with this id."""


class JobAborted(SecAggError):
    """The job has failed earlier; the state machine accepts no further calls."""


class TooFewSurvivors(SecAggError):
    """Fewer participants remain than the protocol needs.

    Attributes ``needed`` and ``remaining`` are the two counts and ``stage`` names
    where the shortfall was detected, so the caller can report it precisely.
    """

    def __init__(self, *, needed: int, remaining: int, stage: str, what: str = "survivors"):
        self.needed = needed
        self.remaining = remaining
        self.stage = stage
        self.what = what
        super().__init__(
            f"too few {what} at stage {stage!r}: needed at least {needed}, "
            f"only {remaining} remained"
        )

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only __init__: tell copy/pickle-based tooling how to rebuild us.
        return (_rebuild_too_few, (self.needed, self.remaining, self.stage, self.what))


def _rebuild_too_few(needed: int, remaining: int, stage: str, what: str) -> TooFewSurvivors:
    return TooFewSurvivors(needed=needed, remaining=remaining, stage=stage, what=what)


# ------------------------------------------------------------------ DP sizing
class RingOverflowRisk(InvalidSpec):
    """The noisy sum could wrap the 64-bit ring. ``cause`` is ``"values"``, ``"noise"``
    or ``"values and noise"``; the counts and bounds are attributes."""

    def __init__(
        self, *, participants: int, bound: float, scale_bits: int, noise_bound: int
    ) -> None:
        self.participants = participants
        self.bound = bound
        self.scale_bits = scale_bits
        self.noise_bound = noise_bound
        values = participants * math.ceil(math.ldexp(bound, scale_bits))
        noise = participants * noise_bound
        if values > _MAX_SIGNED:
            self.cause = "values"
        elif noise > _MAX_SIGNED:
            self.cause = "noise"
        else:
            self.cause = "values and noise"
        super().__init__(
            f"refusing the job: the noisy sum could overflow the 64-bit ring ({self.cause}): "
            f"{participants} participants × (values |x| <= {bound!r} at scale 2^{scale_bits} "
            f"= {values // participants} units + noise bound {noise_bound}) = {values + noise} "
            f"> 2^63 - 1. Lower scale_bits, the value bound or the noise (raise ε), or "
            "split the federation"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_overflow,
            (self.participants, self.bound, self.scale_bits, self.noise_bound),
        )


def _rebuild_overflow(n: int, bound: float, scale_bits: int, noise: int) -> RingOverflowRisk:
    return RingOverflowRisk(participants=n, bound=bound, scale_bits=scale_bits, noise_bound=noise)


class NoiseTooLarge(InvalidSpec):
    """The per-participant noise exceeds what the exact samplers support
    (Skellam ``μ <= 2^50``, discrete Gaussian ``σ <= 2^26``): use a coarser scale."""


# ------------------------------------------------------------- participant policy
class PolicyViolation(SecAggError):
    """The participant's privacy policy (:class:`spherecal.crypto.policy.SecAggPolicy`) refuses.

    Raised by :class:`crypto.SecAggParticipant`, the party whose data is at stake;
    ``kind`` says which rule (see ``docs/privacy.md``, "Participant policy")."""


class ConsistencyRoundRequired(PolicyViolation):
    """The job has no signed survivor-set round, or an unmask request came before this
    participant signed and verified one consistent survivor view."""


class ThresholdTooLow(PolicyViolation):
    """``2t <=`` the number of share holders of some participant."""


class TooFewParticipants(PolicyViolation):
    """The job has fewer participants than the policy's ``min_participants``."""


class TooFewInputs(PolicyViolation):
    """The unmask request would reveal a sum of fewer inputs than ``min_inputs``."""


class DoubleReveal(PolicyViolation):
    """A second unmask request, different from the one already answered, in one job."""


class OverlappingReveal(PolicyViolation):
    """Survivor and dropout sets overlap: revealing both share kinds of one peer
    would expose its input."""

    kind = "both_share_kinds"


class KeySubstitution(PolicyViolation):
    """A roster key not signed by its owner's pinned identity key (or a signature to
    check from a party this participant holds no pinned key for — it holds only
    :func:`spherecal.crypto.spec.keys_needed`'s), this participant's own advertisement
    altered, or one public key listed for two roles or peers."""
