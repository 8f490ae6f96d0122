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
*refusal*: the typed error propagates, the participant wipes its job secrets and
answers all later calls with :class:`JobAborted`. Refusals: overlapping survivor and
dropout sets (:class:`OverlappingReveal`), too few survivors or signatures
(:class:`TooFewSurvivors`), a bad signature (:class:`BadSignature`), a replayed job
id (:class:`JobReplayed`, at construction), a ciphertext or message for someone else
(:class:`WrongRecipient`), a view contradicting an earlier one
(:class:`InconsistentSurvivors`), forged shares (:class:`ForgedShare`). A vector of the
wrong length or out of bound is refused by :meth:`set_input` (:class:`WrongLength`,
:class:`EncodingOverflow`) without failing the job, so the caller can fix it.

Not thread-safe; drive one participant from one task.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from . import shamir
from ._exceptions import (
    BadKey,
    Excluded,
    ForgedShare,
    InconsistentSurvivors,
    InvalidSpec,
    JobAborted,
    OutOfStage,
    OverlappingReveal,
    SecAggError,
    TooFewSurvivors,
    UnknownParticipant,
    WrongJob,
    WrongRecipient,
)
from .channel import (
    ShareKind,
    SharePlaintext,
    commitment_matches,
    open_share,
    seal_share,
    share_aad,
)
from .kdf import channel_key, pairwise_mask_seed, self_mask_seed
from .keys import (
    JobKeys,
    advert_payload,
    agree,
    identity_public_bytes,
    load_identity_public,
    seed_commitment,
    sign,
    survivors_payload,
    verify,
)
from .ledger import JobLedger, default_ledger
from .messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShare,
    KeyRoster,
    MaskedChunk,
    RevealedShare,
    ShareBundle,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
)
from .prg import MaskExpander, MaskSeed
from .ring import RING_DTYPE, add_noise, encode
from .spec import JobSpec

__all__ = ["ParticipantStage", "SecAggParticipant"]


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
        directory: id -> Ed25519 public key (raw 32 bytes or key object) for every
            participant of the job. It must come from the deployment's trust root
            (e.g. certificates issued by the federation's CA), not from the
            coordinator: signatures protect against a malicious coordinator only
            if it cannot choose the keys they are checked with.
        ledger: where job ids are claimed to refuse replays (default: in-memory,
            process-wide; pass a persistent one in production).
    """

    def __init__(
        self,
        spec: JobSpec,
        participant_id: str,
        identity_key: Ed25519PrivateKey,
        directory: Mapping[str, bytes | Ed25519PublicKey],
        *,
        ledger: JobLedger | None = None,
    ) -> None:
        if not isinstance(spec, JobSpec):
            raise InvalidSpec("spec must be a JobSpec")
        spec.validate()
        if participant_id not in spec.participants:
            raise UnknownParticipant(f"{participant_id!r} is not a participant of this job")
        missing = [p for p in spec.participants if p not in directory]
        if missing:
            raise InvalidSpec(
                f"identity directory lacks {len(missing)} participants, e.g. {missing[0]!r}"
            )
        self.spec = spec
        self.participant_id = participant_id
        self._identity = identity_key
        self._directory = {p: load_identity_public(directory[p]) for p in spec.participants}
        if identity_public_bytes(identity_key) != identity_public_bytes(
            self._directory[participant_id]
        ):
            raise BadKey("identity key does not match this participant's directory entry")
        (ledger if ledger is not None else default_ledger()).claim(participant_id, spec.job_id)

        self._graph = spec.masking_graph
        self._stage = ParticipantStage.ADVERTISE
        self._keys: JobKeys | None = JobKeys.generate()
        self._own_advert: AdvertiseKeys | None = None
        self._adverts: dict[str, AdvertiseKeys] = {}
        self._members1: frozenset[str] = frozenset()
        self._members2: frozenset[str] = frozenset()
        self._held: dict[str, tuple[int, SharePlaintext]] = {}
        self._plan: list[tuple[MaskSeed, int]] = []
        self._encoded: npt.NDArray[np.uint64] | None = None
        self._expander: MaskExpander | None = None
        self._work: npt.NDArray[np.uint64] = np.empty(0, dtype=RING_DTYPE)
        self._signed_survivors: tuple[str, ...] | None = None
        self._complete_x: int | None = None

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
        return self._encoded is not None

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

    def _fail(self) -> None:
        self._stage = ParticipantStage.FAILED
        self._wipe()

    def _wipe(self) -> None:
        # Best effort: Python cannot overwrite immutable bytes, but dropping every
        # reference lets the secrets be collected and keeps them out of later calls.
        self._keys = None
        self._held = {}
        self._plan = []
        self._encoded = None
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
            verify(
                self._directory[advert.sender],
                advert.signature,
                advert_payload(
                    spec_digest=spec.digest,
                    job_id=spec.job_id,
                    sender=advert.sender,
                    channel_public=advert.channel_public,
                    masking_public=advert.masking_public,
                    commitment=advert.seed_commitment,
                ),
                what=f"key advertisement of {advert.sender!r}",
            )
            if advert.sender == me and advert != self._own_advert:
                raise BadKey("the roster carries different keys for this participant")
        self._adverts = {a.sender: a for a in roster.adverts}
        self._members1 = members

        mask_key_shares = shamir.split(keys.masking_private_bytes(), spec.threshold, len(holders))
        seed_shares = shamir.split(keys.seed, spec.threshold, len(holders))
        out = []
        for i, holder in enumerate(holders):
            x = i + 1
            plaintext = SharePlaintext.fresh(
                mask_key_share=mask_key_shares[i][1], seed_share=seed_shares[i][1]
            )
            ck = plaintext.commitment(
                ShareKind.MASK_KEY,
                spec_digest=spec.digest,
                job_id=spec.job_id,
                owner=me,
                holder=holder,
                x=x,
            )
            cb = plaintext.commitment(
                ShareKind.SEED,
                spec_digest=spec.digest,
                job_id=spec.job_id,
                owner=me,
                holder=holder,
                x=x,
            )
            key = self._channel_key(holder)
            aad = share_aad(
                spec_digest=spec.digest,
                job_id=spec.job_id,
                sender=me,
                receiver=holder,
                x=x,
                mask_key_commitment=ck,
                seed_commitment=cb,
            )
            nonce, ciphertext = seal_share(key, plaintext, aad)
            out.append(
                EncryptedShare(
                    receiver=holder,
                    x=x,
                    mask_key_commitment=ck,
                    seed_commitment=cb,
                    nonce=nonce,
                    ciphertext=ciphertext,
                )
            )
        self._stage = ParticipantStage.RECEIVE_SHARES
        return ShareKeys(job_id=spec.job_id, sender=me, shares=tuple(out))

    def _channel_key(self, peer: str) -> bytes:
        shared = agree(self._secrets().channel, self._adverts[peer].channel_public)
        return channel_key(
            shared,
            spec_digest=self.spec.digest,
            job_id=self.spec.job_id,
            a=self.participant_id,
            b=peer,
        )

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
            dealer, share = item.sender, item.share
            x = self._position(dealer)
            if share.x != x:
                raise ForgedShare(f"share from {dealer!r} has x={share.x}, expected {x}")
            aad = share_aad(
                spec_digest=spec.digest,
                job_id=spec.job_id,
                sender=dealer,
                receiver=me,
                x=x,
                mask_key_commitment=share.mask_key_commitment,
                seed_commitment=share.seed_commitment,
            )
            plaintext = open_share(
                self._channel_key(dealer),
                share.nonce,
                share.ciphertext,
                aad,
                what=f"share from {dealer!r}",
            )
            for kind, published in (
                (ShareKind.MASK_KEY, share.mask_key_commitment),
                (ShareKind.SEED, share.seed_commitment),
            ):
                actual = plaintext.commitment(
                    kind, spec_digest=spec.digest, job_id=spec.job_id, owner=dealer, holder=me, x=x
                )
                if not commitment_matches(published, actual):
                    raise ForgedShare(f"share from {dealer!r} does not match its commitment")
            held[dealer] = (x, plaintext)

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
        self._plan = plan
        self._members2 = members
        self._expander = MaskExpander(min(spec.chunk_size, spec.length))
        self._work = np.empty(min(spec.chunk_size, spec.length), dtype=RING_DTYPE)
        self._stage = ParticipantStage.MASKED

    def _position(self, dealer: str) -> int:
        """This participant's x-coordinate among ``dealer``'s share holders."""
        if self.spec.graph == "complete":  # the same holder list for every dealer
            if self._complete_x is None:
                self._complete_x = sorted(self._members1).index(self.participant_id) + 1
            return self._complete_x
        return self._graph.holders(dealer, self._members1).index(self.participant_id) + 1

    def set_input(self, vector: npt.ArrayLike, *, noise: npt.ArrayLike | None = None) -> None:
        """Fix this participant's input (float vector of ``spec.length`` entries, each
        ``|x| <= spec.bound``) and optional integer DP noise (ring units,
        ``|noise| <= spec.noise_bound``), added in the ring before masking.

        May be called once, at any stage before unmasking. The input is frozen
        afterwards because re-sending a *different* vector under the same masks
        would reveal the difference of the two inputs to the coordinator.
        """
        if self._stage is ParticipantStage.FAILED:
            raise JobAborted("this participant refused or failed earlier in the job")
        if self._stage in (ParticipantStage.SIGNED, ParticipantStage.DONE):
            raise OutOfStage("too late to set the input")
        if self._encoded is not None:
            raise OutOfStage("the input is already set and cannot change within a job")
        spec = self.spec
        encoded = encode(vector, scale_bits=spec.scale_bits, bound=spec.bound, length=spec.length)
        if noise is not None:
            add_noise(encoded, noise, noise_bound=spec.noise_bound)
        self._encoded = encoded

    def masked_chunk(self, index: int) -> MaskedChunk:
        """Chunk ``index`` of ``y_u``, computed independently of the other chunks
        (CTR seeking), so uploads can stream and be resumed. Calling it again returns
        identical bytes — re-sending a chunk reveals nothing new."""
        self._expect(ParticipantStage.MASKED)
        if self._encoded is None:
            raise OutOfStage("set_input() must be called before masking")
        if self._expander is None:  # pragma: no cover - set with the MASKED stage
            raise JobAborted("mask state is gone")
        start, stop = self.spec.chunk_bounds(index)
        out = self._work[: stop - start]
        np.copyto(out, self._encoded[start:stop])
        for seed, sign_ in self._plan:
            self._expander.apply(out, seed, start, sign_)
        return MaskedChunk(
            job_id=self.spec.job_id, sender=self.participant_id, index=index, payload=out.tobytes()
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
            signature = sign(
                self._identity,
                survivors_payload(
                    spec_digest=self.spec.digest,
                    job_id=self.spec.job_id,
                    survivors=request.survivors,
                ),
            )
            self._signed_survivors = request.survivors
            self._stage = ParticipantStage.SIGNED
            return ConsistencySignature(
                job_id=self.spec.job_id, sender=self.participant_id, signature=signature
            )

    def _check_survivor_view(
        self, survivors: frozenset[str], dropouts: frozenset[str], stage: str
    ) -> None:
        me = self.participant_id
        if survivors & dropouts:
            raise OverlappingReveal(
                f"{len(survivors & dropouts)} participants are listed both as survivors and "
                "as dropouts; revealing both kinds of share would expose their inputs"
            )
        if not (survivors | dropouts) <= self._members2:
            raise InconsistentSurvivors("survivor/dropout sets list participants outside U2")
        if me not in survivors:
            raise InconsistentSurvivors("this participant is alive but not listed as a survivor")
        self._need_survivors(len(survivors), stage)
        group = self._graph.component_of(me, survivors)
        if len(group) < self.spec.min_participants:
            raise TooFewSurvivors(
                needed=self.spec.min_participants,
                remaining=len(group),
                stage=stage,
                what="survivors connected to this participant in the masking graph",
            )

    # ------------------------------------------------------------------ round 4
    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Round 4: reveal ``b``-shares of survivors and ``s_sk``-shares of dropouts,
        then forget every job secret."""
        expected = (
            ParticipantStage.SIGNED if self.spec.consistency_check else ParticipantStage.MASKED
        )
        self._expect(expected)
        with self._refusing():
            response = self._unmask(request)
        self._stage = ParticipantStage.DONE
        self._wipe()
        return response

    def _unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        spec = self.spec
        self._check_job(request.job_id, request.recipient)
        survivors = frozenset(request.survivors)
        dropouts = frozenset(request.dropouts)
        self._check_survivor_view(survivors, dropouts, "unmask")
        if spec.consistency_check:
            self._check_consistency(request, survivors, dropouts)
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

    def _check_consistency(
        self, request: UnmaskRequest, survivors: frozenset[str], dropouts: frozenset[str]
    ) -> None:
        spec = self.spec
        if request.survivors != self._signed_survivors:
            raise InconsistentSurvivors("survivor set differs from the one this participant signed")
        payload = survivors_payload(
            spec_digest=spec.digest, job_id=spec.job_id, survivors=request.survivors
        )
        signers = set()
        for entry in request.signatures:
            if entry.signer not in survivors:
                raise InconsistentSurvivors(
                    f"signature from {entry.signer!r}, who is not a survivor"
                )
            verify(
                self._directory[entry.signer],
                entry.signature,
                payload,
                what=f"survivor-set signature of {entry.signer!r}",
            )
            signers.add(entry.signer)
        if len(signers) < spec.threshold:
            raise TooFewSurvivors(
                needed=spec.threshold,
                remaining=len(signers),
                stage="unmask",
                what="consistency signatures",
            )
        # Per owner (SecAgg+): the holders of that owner's shares must have signed
        # this very set, so no other set can gather t signatures among them (2t > holders).
        for owner in self._held:
            if owner not in survivors and owner not in dropouts:
                continue
            holders = self._graph.holders(owner, self._members1)
            signed = sum(1 for h in holders if h in signers)
            if signed < spec.threshold:
                raise TooFewSurvivors(
                    needed=spec.threshold,
                    remaining=signed,
                    stage="unmask",
                    what=f"consistency signatures among the share holders of {owner!r}",
                )
