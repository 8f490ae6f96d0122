"""The participant's side of secure aggregation, as a message-in/message-out state machine.

Protocol: Bonawitz et al. 2017 ("Practical Secure Aggregation for Privacy-Preserving
Machine Learning", rounds 0-4: AdvertiseKeys, ShareKeys, MaskedInputCollection,
ConsistencyCheck, Unmasking) with the sparse neighbour graph of Bell et al. 2020
(SecAgg+). The participant

1. makes fresh per-job keys and advertises them, signed (round 0);
2. Shamir-shares its mask key ``s_sk`` and self-mask seed ``b_u`` among its share
   holders ``N(u) ∪ {u}`` and sends them AES-GCM-encrypted (round 1);
3. uploads ``y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u)∩U2} ±PRG(s_uv)`` in chunks (round 2);
4. optionally signs the survivor set (round 3, active-adversary variant);
5. reveals seed shares for survivors and mask-key shares for dropouts — never both
   kinds for one participant — and forgets its secrets (round 4).

Every coordinator message is checked before it is used; any violation is a
*refusal*: the typed error (tree in :mod:`spherecal.crypto._exceptions`) propagates, the
participant wipes its job secrets and answers all later calls with
:class:`JobAborted`. The participant's privacy policy (:mod:`spherecal.crypto.policy`) is
enforced here: spec rules at construction, key, reveal and input-count rules when
the roster and the unmask request arrive. A share that fails authentication yields a
signed complaint naming its dealer (:attr:`SecAggParticipant.complaints`). A vector
of the wrong length or out of bound is refused by :meth:`set_input` without failing
the job, so the caller can fix it.

Not thread-safe; drive one participant from one task. Each round checks what the
previous rounds left in the same state (which keys were advertised and signed, which
shares were dealt, revealed or complained about).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from spherecal.crypto import policy as _policy
from spherecal.crypto._exceptions import (
    BadKey,
    Excluded,
    ForgedShare,
    InconsistentSurvivors,
    InvalidSpec,
    JobAborted,
    OutOfStage,
    SecAggError,
    TooFewSurvivors,
    UnknownParticipant,
    WrongJob,
    WrongLength,
    WrongRecipient,
)
from spherecal.crypto.channel import (
    ShareKind,
    SharePlaintext,
)
from spherecal.crypto.complaints import sign_complaint
from spherecal.crypto.consistency import verify_signed_view
from spherecal.crypto.dealing import deal_shares, open_dealt_share
from spherecal.crypto.held_state import HeldStage, HeldState
from spherecal.crypto.kdf import channel_key, pairwise_mask_seed, self_mask_seed
from spherecal.crypto.keys import (
    JobKeys,
    advert_payload,
    agree,
    identity_public_bytes,
    load_identity_public,
    seed_commitment,
    sign,
    survivors_payload,
)
from spherecal.crypto.messages import (
    AdvertiseKeys,
    ComplaintReason,
    ConsistencyRequest,
    ConsistencySignature,
    KeyRoster,
    MaskedChunk,
    RevealedShare,
    ShareBundle,
    ShareComplaint,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
)
from spherecal.crypto.policy import SecAggPolicy
from spherecal.crypto.prg import MaskExpander, MaskSeed
from spherecal.crypto.replay import JobLedger, default_ledger
from spherecal.crypto.ring import add_noise, adopt, borrow, encode_into, give_back
from spherecal.crypto.spec import JobSpec, keys_needed

__all__ = ["ParticipantStage", "SecAggParticipant"]


def _raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


class ParticipantStage(enum.Enum):
    """What the participant does next."""

    ADVERTISE = "advertise"  # call advertise_keys()
    SHARE = "share"  # waiting for a KeyRoster -> share_keys()
    RECEIVE_SHARES = "receive_shares"  # waiting for a ShareBundle -> receive_shares()
    MASKED = "masked"  # produce masked_chunk(i); then consistency or unmask
    SIGNED = "signed"  # signed the survivor set; waiting for UnmaskRequest
    DONE = "done"
    FAILED = "failed"


class SecAggParticipant:
    """One participant of one secure-aggregation job.

    Args:
        spec: the job, as received from the coordinator (validated on construction).
        participant_id: this participant's id; must be in ``spec.participants``.
        identity_key: the participant's long-term Ed25519 key.
        directory: id -> Ed25519 public key (raw 32 bytes or key object), at least
            for every participant in :func:`spherecal.crypto.spec.keys_needed` (this
            participant, its masking-graph neighbours and, with the consistency
            round, their neighbours; everyone on the complete graph); other entries
            are ignored. It must come from the deployment's trust root (e.g.
            certificates issued by the federation's CA), not from the coordinator:
            signatures protect against a malicious coordinator only if it cannot
            choose the keys they are checked with.
        ledger: where job ids are claimed to refuse replays (default: in-memory,
            process-wide; pass a persistent one in production).
        policy: what this participant demands of the job (default: the safe
            :class:`~spherecal.crypto.policy.SecAggPolicy`); the spec-time rules run here, so a
            refused job raises a :class:`PolicyViolation` before any key is made.
    """

    def __init__(
        self,
        spec: JobSpec,
        participant_id: str,
        identity_key: Ed25519PrivateKey,
        directory: Mapping[str, bytes | Ed25519PublicKey],
        *,
        ledger: JobLedger | None = None,
        policy: SecAggPolicy | None = None,
    ) -> None:
        self._setup(spec, participant_id, identity_key, directory, policy)
        (ledger if ledger is not None else default_ledger()).claim(participant_id, spec.job_id)
        self._keys: JobKeys | None = JobKeys.generate()

    def _setup(
        self,
        spec: JobSpec,
        participant_id: str,
        identity_key: Ed25519PrivateKey,
        directory: Mapping[str, bytes | Ed25519PublicKey],
        policy: SecAggPolicy | None,
    ) -> None:
        """The checks and empty state every participant starts from (new or resumed)."""
        if not isinstance(spec, JobSpec):
            raise InvalidSpec("spec must be a JobSpec")
        spec.validate()
        if participant_id not in spec.participants:
            raise UnknownParticipant(f"{participant_id!r} is not a participant of this job")
        needed = sorted(keys_needed(spec, participant_id))
        missing = [p for p in needed if p not in directory]
        if missing:
            raise InvalidSpec(
                f"identity directory lacks {len(missing)} of the {len(needed)} participants "
                f"whose signatures {participant_id!r} checks in this job, e.g. {missing[0]!r}"
            )
        self.policy = policy if policy is not None else SecAggPolicy()
        _policy.check_spec(self.policy, spec)
        self.spec = spec
        self.participant_id = participant_id
        self._identity = identity_key
        # Only the keys this participant checks signatures with (its neighbours, and
        # with the consistency round its 2-hop neighbourhood): O(k), not n. Entries
        # for anyone else are not loaded; a signature from them is refused.
        self._directory = {p: load_identity_public(directory[p]) for p in needed}
        if identity_public_bytes(identity_key) != identity_public_bytes(
            self._directory[participant_id]
        ):
            raise BadKey("identity key does not match this participant's directory entry")
        self._graph = spec.masking_graph
        self._stage = ParticipantStage.ADVERTISE
        self._keys = None
        self._input_left = False
        """Resumed after a restart: the masked input left earlier; it is never
        computed again (no input, no masks are kept)."""
        self._own_advert: AdvertiseKeys | None = None
        self._adverts: dict[str, AdvertiseKeys] = {}
        self._members1: frozenset[str] = frozenset()
        self._members2: frozenset[str] = frozenset()
        self._held: dict[str, tuple[int, SharePlaintext]] = {}
        self._channel_keys: dict[str, bytes] = {}
        self._plan: list[tuple[MaskSeed, int]] = []
        self._encoded: npt.NDArray[np.unsignedinteger] | None = None
        self._loan: npt.NDArray[np.unsignedinteger] | None = None
        """The input's buffer (:func:`~spherecal.crypto.ring.borrow`): borrowed by
        :meth:`prepare_input` (empty, ``_encoded`` None) or by ``set_input``, which
        encodes into it; given back once — when the job's secrets go, or when
        ``set_input`` refuses an input; ``_encoded`` is read through, never returned."""
        self._expander: MaskExpander | None = None
        self._signed_survivors: tuple[str, ...] | None = None
        self._signed_payload: bytes | None = None
        """The bytes the consistency signature covers (O(n): encoded once per job)."""
        self._own_signature: bytes | None = None
        """This participant's consistency signature: its own entry in the unmask request
        must equal it, instead of being verified (not kept across a restart)."""
        self._holders_of: dict[str, tuple[str, ...]] = {}
        """``graph.holders(owner, U1)`` per owner, computed once per job."""
        self._complete_x: int | None = None
        self._answered: tuple[UnmaskRequest, UnmaskResponse] | None = None
        self.complaints: list[ShareComplaint] = []
        """Signed complaints about dealers whose shares failed authentication."""

    def __repr__(self) -> str:
        return (
            f"SecAggParticipant(id={self.participant_id!r}, job={self.spec.job_id.hex()[:16]}, "
            f"stage={self._stage.value})"
        )

    # ----------------------------------------------------------------- plumbing
    @property
    def stage(self) -> ParticipantStage:
        return self._stage

    @property
    def has_input(self) -> bool:
        """The input is fixed: set in this process, or sent before a restart."""
        return self._encoded is not None or self._input_left

    # ----------------------------------------------------------------- restart
    def held_state(self) -> HeldState:
        """What a restarted process needs to go on with this job
        (:mod:`spherecal.crypto.held_state`), taken before each message it prepares is
        sent, so no restart can make it advertise other keys, deal other shares, sign
        or reveal twice. Before the masked stage (advertised, shares dealt) it holds
        the job keys; from the masked stage on it never does (the masked input is
        computed once, and stored by the caller before it leaves)."""
        stages = {
            ParticipantStage.SHARE: HeldStage.ADVERTISED,
            ParticipantStage.RECEIVE_SHARES: HeldStage.SHARED,
            ParticipantStage.MASKED: HeldStage.MASKED,
            ParticipantStage.SIGNED: HeldStage.SIGNED,
            ParticipantStage.DONE: HeldStage.DONE,
        }
        if self._stage not in stages:
            raise OutOfStage(f"no state to keep at stage {self._stage.value!r}")
        stage = stages[self._stage]
        early = stage in (HeldStage.ADVERTISED, HeldStage.SHARED)
        keys = self._secrets() if early else None
        own = self._own_advert if early else None
        return HeldState(
            job_id=self.spec.job_id,
            participant_id=self.participant_id,
            stage=stage,
            members1=tuple(sorted(self._members1)),
            members2=tuple(sorted(self._members2)),
            held=tuple((d, x, p.to_bytes()) for d, (x, p) in sorted(self._held.items())),
            signed_survivors=self._signed_survivors,
            answered=None
            if self._answered is None
            else (self._answered[0].to_bytes(), self._answered[1].to_bytes()),
            keys=None
            if keys is None
            else (_raw_private(keys.channel), keys.masking_private_bytes(), keys.seed),
            own_advert=None if own is None else own.to_bytes(),
            adverts=tuple(a.to_bytes() for _, a in sorted(self._adverts.items()))
            if stage is HeldStage.SHARED
            else (),
        )

    @property
    def input_left(self) -> bool:
        """Resumed after its masked input left (or was stored to leave): it is never
        computed again."""
        return self._input_left

    @classmethod
    def resume(
        cls,
        spec: JobSpec,
        participant_id: str,
        identity_key: Ed25519PrivateKey,
        directory: Mapping[str, bytes | Ed25519PublicKey],
        state: HeldState,
        *,
        policy: SecAggPolicy | None = None,
    ) -> SecAggParticipant:
        """The participant of a job this site took part in before this process
        started, rebuilt from its :meth:`held_state`. Taken before the masked stage,
        it goes on with the *same* keys (its advertisement and the shares it dealt
        stay valid) and masks its input once that is set; taken after, it answers the
        consistency and unmask rounds exactly as the first process would have and
        refuses to mask again (it holds neither input nor masks). The job id is not
        claimed again (it was, by the first process); spec, directory and policy are
        checked as for a new job."""
        self = cls.__new__(cls)
        self._setup(spec, participant_id, identity_key, directory, policy)
        if state.job_id != spec.job_id:
            raise WrongJob("the held state belongs to another job")
        if state.participant_id != participant_id:
            raise WrongRecipient("the held state belongs to another participant")
        state.check()
        members1 = frozenset(state.members1)
        if not members1 <= set(spec.participants):
            raise UnknownParticipant("the held state lists ids that are not in the job")
        self._members1 = members1
        self._holders_of = {}
        if state.keys is not None:
            self._resume_keys(state)
            return self
        self._members2 = frozenset(state.members2)
        held: dict[str, tuple[int, SharePlaintext]] = {}
        for dealer, x, plaintext in state.held:
            try:
                position = self._position(dealer)
            except ValueError:
                position = 0  # not one of the dealer's holders
            if x != position:
                raise InconsistentSurvivors(f"held share of {dealer!r} is at the wrong position")
            held[dealer] = (x, SharePlaintext.from_bytes(plaintext))
        self._held = held
        self._signed_survivors = state.signed_survivors
        self._input_left = True
        if state.answered is not None:
            self._answered = (
                UnmaskRequest.from_bytes(state.answered[0]),
                UnmaskResponse.from_bytes(state.answered[1]),
            )
        self._stage = {
            HeldStage.MASKED: ParticipantStage.MASKED,
            HeldStage.SIGNED: ParticipantStage.SIGNED,
            HeldStage.DONE: ParticipantStage.DONE,
        }[state.stage]
        return self

    def _resume_keys(self, state: HeldState) -> None:
        """The advertised or shared stage, with the job keys of the first process:
        its own advertisement must be exactly the one those keys sign (a state whose
        keys and advertisement disagree is refused), and the roster's advertisements
        are checked against the directory again, as when the roster arrived."""
        assert state.keys is not None and state.own_advert is not None
        channel, masking, seed = state.keys
        keys = JobKeys(
            channel=X25519PrivateKey.from_private_bytes(channel),
            masking=X25519PrivateKey.from_private_bytes(masking),
            seed=seed,
        )
        own = AdvertiseKeys.from_bytes(state.own_advert)
        self._keys = keys
        self._stage = ParticipantStage.ADVERTISE
        if self.advertise_keys() != own:  # Ed25519 is deterministic: the same bytes
            raise BadKey("the held job keys do not match the advertisement this site sent")
        if state.stage is HeldStage.ADVERTISED:
            return
        adverts = tuple(AdvertiseKeys.from_bytes(a) for a in state.adverts)
        holders = self._graph.holders(self.participant_id, self._members1)
        if tuple(sorted(a.sender for a in adverts)) != tuple(sorted(holders)):
            raise InconsistentSurvivors("the held roster is not this participant's neighbours")
        for advert in adverts:
            self._check_job(advert.job_id)
        _policy.check_roster_keys(
            self.spec, adverts, self._directory, me=self.participant_id, own=own
        )
        self._adverts = {a.sender: a for a in adverts}
        self._stage = ParticipantStage.RECEIVE_SHARES

    def _expect(self, *stages: ParticipantStage) -> None:
        if self._stage is ParticipantStage.FAILED:
            raise JobAborted("this participant refused or failed earlier in the job")
        if self._stage not in stages:
            wanted = " or ".join(s.value for s in stages)
            raise OutOfStage(f"participant is at stage {self._stage.value!r}, not {wanted!r}")

    @contextmanager
    def _refusing(self) -> Iterator[None]:
        """Any protocol error while handling a coordinator message ends the job."""
        try:
            yield
        except SecAggError:
            self._fail()
            raise

    def close(self) -> None:
        """Leave the job without another message: the keys, shares and input go, and
        the input buffer is zeroed and kept for this process's next job
        (:func:`~spherecal.crypto.ring.give_back`). Later calls raise as after a
        refusal; a second call, or one after the unmask answer, does nothing.

        Why (issue #24): a site forgets a job the coordinator moved on from, or whose
        local work failed, after :meth:`prepare_input` faulted its buffer in. Dropped
        with the participant, that buffer was freed, and the site's next job faulted in
        a new one on its float → upload path. Call it from the thread that runs the
        job's steps (as every other method)."""
        if self._stage not in (ParticipantStage.DONE, ParticipantStage.FAILED):
            self._fail()

    def _fail(self) -> None:
        self._stage = ParticipantStage.FAILED
        self._wipe()

    def _wipe(self) -> None:
        # Best effort: Python cannot overwrite immutable bytes, but dropping every
        # reference lets the secrets be collected and keeps them out of later calls.
        self._keys = None
        self._held = {}
        self._channel_keys = {}
        self._plan = []
        if self._loan is not None:  # zeroed, and reused by this process's next job
            give_back(self._loan)
        self._loan = self._encoded = None
        if self._expander is not None:
            self._expander.clear()
            self._expander = None

    def _check_job(self, job_id: bytes, recipient: str | None = None) -> None:
        if job_id != self.spec.job_id:
            raise WrongJob("message belongs to another job")
        if recipient is not None and recipient != self.participant_id:
            raise WrongRecipient(f"message is addressed to {recipient!r}, not to this participant")

    def _secrets(self) -> JobKeys:
        if self._keys is None:  # pragma: no cover - guarded by the stage machine
            raise JobAborted("job secrets are gone")
        return self._keys

    def _need_survivors(self, count: int, stage: str) -> None:
        needed = max(self.spec.threshold, self.spec.min_participants)
        if count < needed:
            raise TooFewSurvivors(needed=needed, remaining=count, stage=stage)

    # ------------------------------------------------------------------ round 0
    def advertise_keys(self) -> AdvertiseKeys:
        """Round 0: this participant's signed job public keys."""
        self._expect(ParticipantStage.ADVERTISE)
        keys = self._secrets()
        spec = self.spec
        commitment = seed_commitment(spec.digest, self.participant_id, keys.seed)
        payload = advert_payload(
            spec_digest=spec.digest,
            job_id=spec.job_id,
            sender=self.participant_id,
            channel_public=keys.channel_public,
            masking_public=keys.masking_public,
            commitment=commitment,
        )
        advert = AdvertiseKeys(
            job_id=spec.job_id,
            sender=self.participant_id,
            channel_public=keys.channel_public,
            masking_public=keys.masking_public,
            seed_commitment=commitment,
            signature=sign(self._identity, payload),
        )
        self._own_advert = advert
        self._stage = ParticipantStage.SHARE
        return advert

    # ------------------------------------------------------------------ round 1
    def share_keys(self, roster: KeyRoster) -> ShareKeys:
        """Round 1: verify the neighbours' signed keys, then deal encrypted shares of
        ``s_sk`` and ``b_u`` to every holder in ``N(u) ∪ {u}`` among ``U1``."""
        self._expect(ParticipantStage.SHARE)
        with self._refusing():
            return self._share_keys(roster)

    def _share_keys(self, roster: KeyRoster) -> ShareKeys:
        spec, me, keys = self.spec, self.participant_id, self._secrets()
        self._check_job(roster.job_id, roster.recipient)
        members = frozenset(roster.members)
        strangers = members - set(spec.participants)
        if strangers:
            raise UnknownParticipant(f"roster lists {len(strangers)} ids that are not in the job")
        if me not in members:
            raise Excluded("the roster leaves this participant out")
        self._need_survivors(len(members), "share")
        holders = self._graph.holders(me, members)
        if tuple(a.sender for a in roster.adverts) != holders:
            raise InconsistentSurvivors(
                "roster must carry exactly the advertisements of this participant's "
                "neighbours in U1 and its own"
            )
        if len(holders) < spec.threshold:
            raise TooFewSurvivors(
                needed=spec.threshold,
                remaining=len(holders),
                stage="share",
                what="share holders among this participant's neighbours",
            )
        for advert in roster.adverts:
            self._check_job(advert.job_id)
        _policy.check_roster_keys(
            spec, roster.adverts, self._directory, me=me, own=self._own_advert
        )
        self._adverts = {a.sender: a for a in roster.adverts}
        self._members1 = members
        self._holders_of = {}

        out = deal_shares(
            spec,
            owner=me,
            holders=holders,
            mask_key=keys.masking_private_bytes(),
            seed=keys.seed,
            channel_key=self._channel_key,
        )
        self._stage = ParticipantStage.RECEIVE_SHARES
        return ShareKeys(job_id=spec.job_id, sender=me, shares=out)

    def _channel_key(self, peer: str) -> bytes:
        """The share-channel key with ``peer``, derived once per job: round 1 seals a
        share to each holder and round 2 opens one from each dealer — the same peers —
        so the X25519 agreement and HKDF run once per neighbour, not twice."""
        cached = self._channel_keys.get(peer)
        if cached is not None:
            return cached
        shared = agree(self._secrets().channel, self._adverts[peer].channel_public)
        key = self._channel_keys[peer] = channel_key(
            shared,
            spec_digest=self.spec.digest,
            job_id=self.spec.job_id,
            a=self.participant_id,
            b=peer,
        )
        return key

    # ------------------------------------------------------------------ round 2
    def receive_shares(self, bundle: ShareBundle) -> None:
        """Round 2 (input side): decrypt and check the shares addressed to this
        participant; fix the set ``U2`` it masks against."""
        self._expect(ParticipantStage.RECEIVE_SHARES)
        with self._refusing():
            self._receive_shares(bundle)

    def _receive_shares(self, bundle: ShareBundle) -> None:
        spec, me, keys = self.spec, self.participant_id, self._secrets()
        self._check_job(bundle.job_id, bundle.recipient)
        members = frozenset(bundle.members)
        if not members <= self._members1:
            raise InconsistentSurvivors("U2 lists participants that never advertised keys")
        if me not in members:
            raise Excluded("the share bundle leaves this participant out")
        self._need_survivors(len(members), "masked")
        expected = self._graph.holders(me, members)
        if len(expected) < spec.threshold:
            raise TooFewSurvivors(
                needed=spec.threshold,
                remaining=len(expected),
                stage="masked",
                what="share holders among this participant's neighbours",
            )
        for item in bundle.items:
            if item.share.receiver != me:
                raise WrongRecipient(
                    f"share from {item.sender!r} is addressed to {item.share.receiver!r}"
                )
        if tuple(i.sender for i in bundle.items) != expected:
            raise InconsistentSurvivors(
                "the bundle must carry exactly one share from each neighbour in U2 "
                "(and this participant's own)"
            )
        held: dict[str, tuple[int, SharePlaintext]] = {}
        for item in bundle.items:
            dealer, x = item.sender, self._position(item.sender)
            opened = open_dealt_share(
                spec, item.share, dealer=dealer, holder=me, x=x, key=self._channel_key(dealer)
            )
            if isinstance(opened, ComplaintReason):
                raise self._complain(dealer, opened)
            held[dealer] = (x, opened)

        plan: list[tuple[MaskSeed, int]] = [
            (self_mask_seed(keys.seed, spec_digest=spec.digest, job_id=spec.job_id, owner=me), +1)
        ]
        for peer in sorted(self._graph.neighbours(me) & members):
            shared = agree(keys.masking, self._adverts[peer].masking_public)
            seed = pairwise_mask_seed(
                shared, spec_digest=spec.digest, job_id=spec.job_id, a=me, b=peer
            )
            # Bonawitz's sign convention: the smaller id adds, the larger subtracts,
            # so the pair's masks cancel in the sum.
            plan.append((seed, +1 if me < peer else -1))
        self._held = held
        self._channel_keys = {}  # no share travels after this round
        self._plan = plan
        self._members2 = members
        self._expander = MaskExpander(min(spec.chunk_size, spec.length), spec.dtype)
        self._stage = ParticipantStage.MASKED

    def _complain(self, dealer: str, reason: ComplaintReason) -> ForgedShare:
        """A :class:`ForgedShare` carrying this participant's signed complaint naming
        ``dealer`` (none for its own share: only the coordinator can have altered it)."""
        text = f"share from {dealer!r} failed authentication ({reason.name.lower()})"
        if dealer == self.participant_id:
            return ForgedShare(text + "; it is this participant's own share")
        complaint = sign_complaint(
            self._identity, self.spec, complainant=self.participant_id, dealer=dealer, reason=reason
        )
        self.complaints.append(complaint)
        return ForgedShare(text, complaint=complaint)

    def _position(self, dealer: str) -> int:
        """This participant's x-coordinate among ``dealer``'s share holders."""
        if self.spec.graph == "complete":  # the same holder list for every dealer
            if self._complete_x is None:
                self._complete_x = sorted(self._members1).index(self.participant_id) + 1
            return self._complete_x
        return self._holders(dealer).index(self.participant_id) + 1

    def _holders(self, owner: str) -> tuple[str, ...]:
        """``owner``'s share holders among ``U1`` (fixed from round 1 on), once per owner:
        round 2 places this participant among each dealer's holders and round 4 counts
        signatures among each owner's holders — the same sets."""
        cached = self._holders_of.get(owner)
        if cached is None:
            cached = self._holders_of[owner] = self._graph.holders(owner, self._members1)
        return cached

    def _check_input_open(self, verb: str) -> None:
        """The refusals :meth:`prepare_input` and :meth:`set_input` share: after a
        refusal, from the consistency signature on, and once the input is set (or
        left before a restart)."""
        if self._stage is ParticipantStage.FAILED:
            raise JobAborted("this participant refused or failed earlier in the job")
        if self._stage in (ParticipantStage.SIGNED, ParticipantStage.DONE):
            raise OutOfStage(f"too late to {verb} the input")
        if self._encoded is not None or self._input_left:
            raise OutOfStage("the input is already set and cannot change within a job")

    @property
    def input_can_be_donated(self) -> bool:
        """Whether :meth:`set_input` with ``donate`` can encode an input in its own
        memory in this job: a ring word the size of a float64 (64-bit ring). A caller
        that will donate its input then has no buffer to prepare (:meth:`prepare_input`
        would borrow one that :meth:`set_input` uses instead of the donated memory)."""
        return self.spec.ring_bits == 64

    def prepare_input(self) -> None:
        """Borrow the buffer :meth:`set_input` will encode into now, and make its memory
        resident (a write per page when it is new): callable once the advertisement is
        produced and before the input is set; a second call does nothing.

        Why (issue #24): a process's first full-size job encodes its input into fresh
        memory, and the first write faults in every page (first touch of 14 MB: 2–4 ms
        on the development machine, up to ~45 ms for memory the machine never touched) —
        on the float → upload path, between the input and the upload. A caller that has
        a moment no message waits on (the service: once its share answer has left,
        :mod:`spherecal.participant.secure_jobs`) pays them there instead. Not done inside
        :meth:`advertise_keys`: there it delayed every site's advertisement, and with it
        the stage, when the sites share a processor. Nothing on the wire changes; the
        loan is given back exactly as the one :meth:`set_input` makes (when the job's
        secrets go, on every refusal and at the end; a participant dropped without that
        takes its buffer with it, :func:`~spherecal.crypto.ring.borrow`).

        Raises :class:`JobAborted` after a refusal, :class:`OutOfStage` before the
        advertisement, after the input is set (or left before a restart), and from the
        consistency signature on.
        """
        if self._stage is ParticipantStage.ADVERTISE:
            raise OutOfStage("advertise the keys before preparing the input")
        self._check_input_open("prepare")
        if self._loan is None:
            self._loan = borrow(self.spec.length, self.spec.ring_bits, prefault=True)

    def set_input(
        self,
        vector: npt.ArrayLike,
        *,
        noise: npt.ArrayLike | None = None,
        donate: bool = False,
    ) -> None:
        """Fix this participant's input (float vector of ``spec.length`` entries, each
        ``|x| <= spec.bound``) and optional integer DP noise (ring units,
        ``|noise| <= spec.noise_bound``), added in the ring before masking.

        May be called once, at any stage before unmasking. The input is frozen
        afterwards because re-sending a *different* vector under the same masks
        would reveal the difference of the two inputs to the coordinator.

        ``donate``: the caller gives ``vector`` up, and in a 64-bit ring with no buffer
        prepared (:meth:`prepare_input`) it is encoded in place, in its own memory
        (:func:`~spherecal.crypto.ring.adopt`; issue #24: no second buffer of the
        input's size to fault in) — the same words, masks and bytes on the wire. Its
        contents are then unspecified: the encoding while the job runs, zeros after
        (or after a refusal); its memory is never lent to another job. A vector that
        cannot host the encoding (not a writeable C-contiguous float64 ndarray) is
        copied as without ``donate``.
        """
        self._check_input_open("set")
        spec = self.spec
        # Into the buffer prepare_input() made resident, else (donated) the vector's own
        # memory, else an earlier job's array when this process has one (no page faults
        # in any of the three).
        encoded = self._loan
        donated = donate and self.input_can_be_donated
        if encoded is None and donated and isinstance(vector, np.ndarray):
            if vector.shape != (spec.length,):  # the loan must be the job's length
                raise WrongLength(
                    f"expected a vector of length {spec.length}, got shape {vector.shape}"
                )
            encoded = adopt(vector)
        if encoded is None:
            encoded = borrow(spec.length, spec.ring_bits)
        self._loan = None
        try:
            encode_into(encoded, vector, scale_bits=spec.scale_bits, bound=spec.bound, scratch=True)
            if noise is not None:
                add_noise(encoded, noise, noise_bound=spec.noise_bound)
        except BaseException:  # refused: the input stays unset (the buffer goes back zeroed)
            give_back(encoded)
            raise
        self._encoded = self._loan = encoded

    def masked_chunk(self, index: int) -> MaskedChunk:
        """Chunk ``index`` of ``y_u``, computed independently of the other chunks
        (CTR seeking), so uploads can stream and be resumed. Calling it again returns
        identical bytes — re-sending a chunk reveals nothing new."""
        self._expect(ParticipantStage.MASKED)
        if self._input_left:
            raise OutOfStage(
                "this participant's masked input left before it restarted; "
                "a job's masked input is never computed twice"
            )
        if self._encoded is None:
            raise OutOfStage("set_input() must be called before masking")
        if self._expander is None:  # pragma: no cover - set with the MASKED stage
            raise JobAborted("mask state is gone")
        start, stop = self.spec.chunk_bounds(index)
        expander, plan, source = self._expander, self._plan, self._encoded[start:stop]
        # Every mask is added into one cache-resident block of the input before the next,
        # straight into the message's bytes (one pass over the input, no copy of the
        # payload for framing).
        return MaskedChunk.framed(
            self.spec.job_id,
            self.participant_id,
            index,
            source.nbytes,
            lambda prefix: expander.masked_bytes(prefix, plan, start, source),
        )

    def masked_chunks(self) -> Iterator[MaskedChunk]:
        """All chunks of ``y_u`` in order."""
        for index in range(self.spec.n_chunks):
            yield self.masked_chunk(index)

    # ------------------------------------------------------------------ round 3
    def consistency_signature(self, request: ConsistencyRequest) -> ConsistencySignature:
        """Round 3 (only with ``spec.consistency_check``): sign the survivor set."""
        self._expect(ParticipantStage.MASKED)
        with self._refusing():
            if not self.spec.consistency_check:
                raise OutOfStage("this job has no consistency-check round")
            self._check_job(request.job_id)
            survivors = frozenset(request.survivors)
            self._check_survivor_view(survivors, frozenset(), "consistency")
            payload = survivors_payload(
                spec_digest=self.spec.digest, job_id=self.spec.job_id, survivors=request.survivors
            )
            signature = sign(self._identity, payload)
            self._signed_survivors = request.survivors
            self._signed_payload, self._own_signature = payload, signature
            self._stage = ParticipantStage.SIGNED
            return ConsistencySignature(
                job_id=self.spec.job_id, sender=self.participant_id, signature=signature
            )

    def _check_survivor_view(
        self, survivors: frozenset[str], dropouts: frozenset[str], stage: str
    ) -> None:
        me = self.participant_id
        _policy.check_one_kind_per_peer(survivors, dropouts)
        if not (survivors | dropouts) <= self._members2:
            raise InconsistentSurvivors("survivor/dropout sets list participants outside U2")
        if me not in survivors:
            raise InconsistentSurvivors("this participant is alive but not listed as a survivor")
        self._need_survivors(len(survivors), stage)
        # the group's size, counted up to what the checks below need (O(k), not O(n))
        needed = self.spec.min_participants
        if stage == "unmask":
            needed = max(needed, self.policy.min_inputs)
        group = self._graph.reach(me, survivors, needed)
        if group < self.spec.min_participants:
            raise TooFewSurvivors(
                needed=self.spec.min_participants,
                remaining=group,
                stage=stage,
                what="survivors connected to this participant in the masking graph",
            )
        if stage == "unmask":
            _policy.check_inputs(self.policy, inputs=group)

    # ------------------------------------------------------------------ round 4
    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Round 4: reveal ``b``-shares of survivors and ``s_sk``-shares of dropouts,
        then forget every job secret. An identical repeat of the request gets the same
        answer (a lost response can be retried; nothing new is revealed); any other
        second request is refused (:class:`DoubleReveal`)."""
        if self._answered is not None:
            _policy.check_no_double_reveal(self._answered[0], request)
            return self._answered[1]
        expected = (
            ParticipantStage.SIGNED if self.spec.consistency_check else ParticipantStage.MASKED
        )
        self._expect(expected)
        with self._refusing():
            response = self._unmask(request)
        self._answered = (request, response)
        self._stage = ParticipantStage.DONE
        self._wipe()
        return response

    def _unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        spec = self.spec
        self._check_job(request.job_id, request.recipient)
        survivors = frozenset(request.survivors)
        dropouts = frozenset(request.dropouts)
        self._check_survivor_view(survivors, dropouts, "unmask")
        _policy.check_consistency_round(
            self.policy, spec, signed=self._signed_survivors is not None
        )
        if spec.consistency_check:
            verify_signed_view(
                spec,
                self._graph,
                self._directory,
                request,
                signed=self._signed_survivors,
                owners=frozenset(o for o in self._held if o in survivors or o in dropouts),
                members1=self._members1,
                me=self.participant_id,
                own_signature=self._own_signature,
                payload=self._signed_payload,
                holders_cache=self._holders,
            )
        shares = []
        for owner in sorted(self._held):
            x, plaintext = self._held[owner]
            if owner in survivors:
                kind = ShareKind.SEED
            elif owner in dropouts:
                kind = ShareKind.MASK_KEY
            else:
                continue
            share, salt = plaintext.share(kind)
            shares.append(RevealedShare(owner=owner, kind=kind, x=x, share=share, salt=salt))
        return UnmaskResponse(job_id=spec.job_id, sender=self.participant_id, shares=tuple(shares))
