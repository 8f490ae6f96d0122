"""The participant's own privacy policy: what it refuses, whatever the coordinator asks.

Why on the participant: the participant is the party whose data is at stake, and a
malicious coordinator chooses the job spec and every survivor view. Each rule below
is a check the participant runs itself in :class:`crypto.SecAggParticipant`; the
defaults are the safe setting, so a library user who configures nothing is
protected. Weakening a rule is explicit (a keyword argument) and
:meth:`SecAggPolicy.relaxations` lists what was weakened, for the caller to log
(``crypto`` does no I/O). See ``docs/privacy.md``, "Participant policy".

The rules, each one function called through this module (so a test can disable
exactly one and watch the matching attack succeed — ``tests/security/
test_malicious_coordinator.py``); :data:`CHECKS` lists them:

``check_consistency_round``  Bonawitz et al. 2017, round 3 (ConsistencyCheck): the job
    must carry the signed survivor-set round, and the participant unmasks only after
    signing and verifying one survivor view. Without it a coordinator that shows
    different survivor sets to different holders rebuilds one input alone.
``check_threshold``  ``2t >`` the largest share-holder set ``h`` (``n`` for the complete
    graph, ``k+1`` or ``k+2`` for Harary) plus the members assumed to collude with the
    coordinator (``colluders``, default 0): otherwise two groups of holders, each of
    ``t`` with the colluders counted in both, could each sign a survivor set and reveal
    one kind of a participant's secrets (``b_u`` and ``s_u^SK``), which together strip
    all its masks. A colluder signs both sets and hands over both kinds, so the honest
    holders split in two exactly when ``2(t − c) ≤ h − c`` (Bonawitz et al. 2017,
    Theorem 6.5: ``t > (h + c)/2``).
``check_participants``  at least ``min_participants`` in the job (default 3): three
    2-party jobs over the same inputs give each input by differencing.
``check_inputs``  the unmask request must put at least ``min_inputs`` inputs (default
    3) in the sum this participant helps reveal (its connected group of survivors).
``check_no_double_reveal``  one unmask answer per job; an identical repeat gets the
    same answer (a lost response can be retried), a different one is refused.
``check_one_kind_per_peer``  never both share kinds of one peer in one request.
``check_roster_keys``  every key in the roster is signed by its owner's *pinned*
    identity key (from the deployment's trust root, never from the coordinator),
    this participant's own advertisement is unchanged, and no public key appears
    twice (a copied key would make two peers share a mask or a channel).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from spherecal.crypto._exceptions import (
    BadSignature,
    ConsistencyRoundRequired,
    DoubleReveal,
    InvalidSpec,
    KeySubstitution,
    OverlappingReveal,
    ThresholdTooLow,
    TooFewInputs,
    TooFewParticipants,
)
from spherecal.crypto.graph import max_closed_size
from spherecal.crypto.keys import advert_payload, pinned_key, verify
from spherecal.crypto.messages import AdvertiseKeys, UnmaskRequest
from spherecal.crypto.spec import JobSpec

DEFAULT_MIN_PARTICIPANTS = 3
DEFAULT_MIN_INPUTS = 3

CHECKS = (
    "check_consistency_round",
    "check_threshold",
    "check_participants",
    "check_inputs",
    "check_no_double_reveal",
    "check_one_kind_per_peer",
    "check_roster_keys",
)
"""Every policy check, by function name in this module (the mutation test covers each)."""

__all__ = [
    "CHECKS",
    "DEFAULT_MIN_INPUTS",
    "DEFAULT_MIN_PARTICIPANTS",
    "SecAggPolicy",
    "check_consistency_round",
    "check_inputs",
    "check_no_double_reveal",
    "check_one_kind_per_peer",
    "check_participants",
    "check_roster_keys",
    "check_spec",
    "check_threshold",
]


@dataclass(frozen=True, kw_only=True)
class SecAggPolicy:
    """What a participant demands of every job (defaults: the safe setting).

    Args:
        require_consistency_round: refuse a spec without the signed survivor-set
            round, and refuse to unmask before signing one survivor view.
        require_majority_threshold: refuse ``2t <=`` share holders ``+ colluders``.
        min_participants: refuse a job with fewer participants (>= 2).
        min_inputs: refuse to reveal unmask shares for a sum of fewer inputs (>= 2).
        colluders: members of a job this participant assumes collude with the
            coordinator (>= 0). The majority rule counts them on both sides of a split:
            a coordinator with ``c`` colluding members reads an input from a job at
            ``2t <= h + c`` (``tests/security/test_colluding_holders.py``); 0, the
            default, protects against the coordinator alone.
    """

    require_consistency_round: bool = True
    require_majority_threshold: bool = True
    min_participants: int = DEFAULT_MIN_PARTICIPANTS
    min_inputs: int = DEFAULT_MIN_INPUTS
    colluders: int = 0

    def __post_init__(self) -> None:
        for name in ("require_consistency_round", "require_majority_threshold"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidSpec(f"policy {name} must be true or false")
        c = self.colluders
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise InvalidSpec(f"policy colluders must be an integer >= 0, got {c!r}")
        for name in ("min_participants", "min_inputs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise InvalidSpec(
                    f"policy {name} must be an integer >= 2 (an aggregate of one input "
                    f"is that input), got {value!r}"
                )

    def relaxations(self) -> tuple[str, ...]:
        """Human-readable list of every rule weaker than the default (empty when safe):
        what the participant process logs at start."""
        out = []
        if not self.require_consistency_round:
            out.append(
                "require_consistency_round = false: a malicious coordinator can "
                "recover one input with inconsistent survivor views"
            )
        if not self.require_majority_threshold:
            out.append(
                "require_majority_threshold = false: thresholds 2t <= share holders are accepted"
            )
        if self.min_participants < DEFAULT_MIN_PARTICIPANTS:
            out.append(
                f"min_participants = {self.min_participants} (default {DEFAULT_MIN_PARTICIPANTS})"
            )
        if self.min_inputs < DEFAULT_MIN_INPUTS:
            out.append(f"min_inputs = {self.min_inputs} (default {DEFAULT_MIN_INPUTS})")
        return tuple(out)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> SecAggPolicy:
        """Build from a TOML ``[policy]`` table; unknown keys are refused."""
        known = {
            "require_consistency_round",
            "require_majority_threshold",
            "min_participants",
            "min_inputs",
            "colluders",
        }
        unknown = sorted(set(values) - known)
        if unknown:
            raise InvalidSpec(f"unknown policy keys {unknown}; known: {sorted(known)}")
        return cls(**values)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- spec time
def check_consistency_round(policy: SecAggPolicy, spec: JobSpec, *, signed: bool = True) -> None:
    """At spec time (``signed`` left True) and again before unmasking (``signed`` =
    whether this participant signed a survivor view)."""
    if not policy.require_consistency_round:
        return
    if not spec.consistency_check:
        raise ConsistencyRoundRequired(
            "the job has no signed survivor-set round (consistency_check); this "
            "participant's policy requires it"
        )
    if not signed:
        raise ConsistencyRoundRequired(
            "unmask requested before this participant signed a survivor view"
        )


def check_threshold(policy: SecAggPolicy, spec: JobSpec) -> None:
    """``2t > h + c`` (module docstring): no two survivor sets can then each gather
    ``t`` signatures among one participant's holders, with ``c`` of them signing both."""
    if not policy.require_majority_threshold:
        return
    holders = max_closed_size(spec.graph, spec.n, spec.degree)
    c = policy.colluders
    if 2 * spec.threshold <= holders + c:
        needed = f"2t > {holders}" if c == 0 else f"2t > {holders} + {c} (assumed colluders)"
        raise ThresholdTooLow(
            f"threshold t={spec.threshold} with up to {holders} share holders per "
            f"participant: the policy needs {needed}"
        )


def check_participants(policy: SecAggPolicy, spec: JobSpec) -> None:
    if spec.n < policy.min_participants:
        raise TooFewParticipants(
            f"the job has {spec.n} participants; this participant's policy needs at "
            f"least {policy.min_participants}"
        )


def check_spec(policy: SecAggPolicy, spec: JobSpec) -> None:
    """Every spec-time rule, in order (the participant's constructor runs this)."""
    check_participants(policy, spec)
    check_threshold(policy, spec)
    check_consistency_round(policy, spec)


# ---------------------------------------------------------------------- keys
def check_roster_keys(
    spec: JobSpec,
    adverts: tuple[AdvertiseKeys, ...],
    directory: Mapping[str, Ed25519PublicKey],
    *,
    me: str,
    own: AdvertiseKeys | None,
) -> None:
    """Every advertisement signed by its sender's pinned key; ours unchanged; no key
    used twice (raises :class:`KeySubstitution`). ``directory`` holds only the keys
    this participant needs (:func:`spherecal.crypto.spec.keys_needed`); an advertisement from
    anyone else has no pinned key to check it with and is refused the same way."""
    seen: set[bytes] = set()
    for advert in adverts:
        what = f"key advertisement of {advert.sender!r}"
        # Our own advertisement is not verified: it must equal, signature included, the
        # one this participant signed (refused below otherwise) — a stronger check than
        # the signature, one Ed25519 verification less per participant (issue #24).
        if advert.sender != me or own is None:
            try:
                verify(
                    pinned_key(directory, advert.sender, what=what),
                    advert.signature,
                    advert_payload(
                        spec_digest=spec.digest,
                        job_id=spec.job_id,
                        sender=advert.sender,
                        channel_public=advert.channel_public,
                        masking_public=advert.masking_public,
                        commitment=advert.seed_commitment,
                    ),
                    what=what,
                )
            except BadSignature as exc:
                raise KeySubstitution(
                    f"the keys listed for {advert.sender!r} are not signed by its pinned "
                    "identity key"
                ) from exc
        if advert.sender == me and advert != own:
            raise KeySubstitution("the roster carries different keys for this participant")
        keys = {advert.channel_public, advert.masking_public}
        if len(keys) != 2 or keys & seen:
            raise KeySubstitution(f"{advert.sender!r} lists a public key already in use")
        seen |= keys


# ---------------------------------------------------------------------- unmask time
def check_inputs(policy: SecAggPolicy, *, inputs: int) -> None:
    """``inputs``: survivors in this participant's connected group (whose inputs are
    in the sum the requested shares reveal)."""
    if inputs < policy.min_inputs:
        raise TooFewInputs(
            f"the unmask request would reveal a sum of {inputs} inputs; this "
            f"participant's policy needs at least {policy.min_inputs}"
        )


def check_no_double_reveal(answered: UnmaskRequest | None, request: UnmaskRequest) -> None:
    if answered is not None and answered != request:
        raise DoubleReveal(
            "this participant already answered a different unmask request in this job"
        )


def check_one_kind_per_peer(survivors: frozenset[str], dropouts: frozenset[str]) -> None:
    both = survivors & dropouts
    if both:
        raise OverlappingReveal(
            f"{len(both)} participants are listed both as survivors and as dropouts; "
            "revealing both kinds of share would expose their inputs"
        )
