"""Typed errors of the secure-aggregation package.

Every error raised on purpose by ``crypto`` derives from :class:`SecAggError`, and
the names are flat and say *what happened*, so that the service can map each one
to a protocol answer (reject this message / abort the job / retry later) without
parsing strings::

    SecAggError
    ├── InvalidSpec          a JobSpec that is inconsistent or unsafe (bad threshold,
    │                        degree, scale that could overflow, ...)
    ├── MalformedMessage     bytes that are not a canonical encoding of the expected
    │                        message type (truncated, trailing data, bad magic, ...)
    ├── WrongLength          a vector, noise vector or chunk of the wrong length
    ├── EncodingOverflow     inputs outside the declared bound, NaN/Inf, or noise
    │                        larger than the declared noise bound
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
    │                        what its owner committed to
    ├── UnexpectedShare      a revealed share the server did not ask for (wrong kind
    │                        for that owner, or from someone who does not hold it)
    ├── OverlappingReveal    an unmask request whose survivor and dropout sets overlap
    ├── InconsistentSurvivors a survivor/dropout view that contradicts what this
    │                        participant saw or signed earlier
    ├── JobReplayed          a second run of a job id this participant already ran
    ├── TooFewSurvivors      fewer than the threshold ``t`` (or ``min_participants``)
    │                        remain; carries ``needed``, ``remaining`` and ``stage``
    └── JobAborted           any call on a job that has already failed

How the state machines use them:

* :class:`~crypto.server.SecAggServer` — every error raised by a ``receive_*`` /
  ``absorb*`` method means *that message was rejected and nothing was stored*: the
  job stays alive for everyone else. Only :class:`TooFewSurvivors` (from
  ``close_stage``/``finish``) and :class:`ForgedShare` from ``finish`` (a secret that
  cannot be reconstructed consistently) abort the job.
* :class:`~crypto.participant.SecAggParticipant` — an error raised while processing
  a message from the coordinator is a *refusal*: the participant wipes its job
  secrets and answers every later call with :class:`JobAborted`. A participant that
  has seen the coordinator misbehave must not keep talking to it. Errors caused by
  the local caller (``set_input`` with a wrong length, out-of-bound values) do not
  poison the job.

Messages never contain key material or plaintext values: it is safe to log them.
"""

from __future__ import annotations

__all__ = [
    "BadKey",
    "BadSignature",
    "DuplicateMessage",
    "EncodingOverflow",
    "Excluded",
    "ForgedShare",
    "InconsistentSurvivors",
    "InvalidSpec",
    "JobAborted",
    "JobReplayed",
    "MalformedMessage",
    "OutOfStage",
    "OverlappingReveal",
    "SecAggError",
    "SenderMismatch",
    "TooFewSurvivors",
    "UnexpectedShare",
    "UnknownParticipant",
    "UploadSlotsBusy",
    "WrongJob",
    "WrongLength",
    "WrongRecipient",
]


class SecAggError(Exception):
    """Base of every deliberate error of the secure-aggregation package."""


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
    """A share failed authentication, its commitment, or consistent reconstruction."""


class UnexpectedShare(SecAggError):
    """A revealed share that was not requested from that sender."""


class OverlappingReveal(SecAggError):
    """Survivor and dropout sets overlap: revealing both would expose an input."""


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
