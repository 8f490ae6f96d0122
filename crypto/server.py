"""The coordinator's side of secure aggregation, as a message-in/message-out state machine.

Protocol: Bonawitz et al. 2017 (rounds 0-4) with the SecAgg+ neighbour graph of Bell
et al. 2020. The server routes keys and encrypted shares, sums masked inputs, and at
the end reconstructs exactly the secrets needed to cancel the masks: self-mask seeds
``b_u`` of survivors and mask keys ``s_sk`` of participants that dropped after
sharing. It learns the sum of the survivors' inputs and nothing else (see
``docs/threat_model.md``).

Driving it (the service does this over gRPC; :mod:`crypto.inprocess` does it
in-process)::

    stage ADVERTISE   receive_advertise(msg) from each participant ... close_stage()
    stage SHARE       roster_for(p) to each p in U1; receive_share_keys(msg) ... close_stage()
    stage MASKED      bundle_for(p) to each p in U2; absorb_chunk(p, i, bytes) ... close_stage()
    stage CONSISTENCY consistency_request() to U3; receive_consistency(msg) ... close_stage()
                      (only with spec.consistency_check)
    stage UNMASK      unmask_request_for(p) to each responder; receive_unmask(msg) ...
                      finish() -> AggregateResult          (when can_finish() or at deadline)
    any stage after share routing: receive_complaint(msg); accused() -> dealer -> complainants

``finish`` range-checks the decoded sum: every entry must lie within
``n_inputs × (⌈bound·2^f⌉ + noise_bound)`` ring units, which any sum of in-bound
inputs (plus declared DP noise) satisfies; otherwise :class:`AggregateOutOfRange`
aborts the job and no sum is returned (a contributor uploaded a well-formed but
out-of-bound vector).

``close_stage`` is called at the stage deadline, or earlier when ``pending()`` is
empty. Whoever has not sent by then is a dropout of that stage, and dropouts are
handled at every stage: before sharing they are left out; after sharing they are
recovered from shares. Only a shortfall below the threshold aborts, with
:class:`TooFewSurvivors` naming how many were needed and how many remained.

Rules: every ``receive_*``/``absorb*`` either stores the whole message or raises a
typed error and stores nothing, so one bad or duplicate message never harms the
job for the others. The server never outputs an aggregate of fewer than
``min_participants`` inputs, nor one where a connected group of survivors in the
masking graph has fewer than ``min_participants`` members (its partial sum would be
exposed).

Streaming and memory. Masked chunks are added in place into one preallocated
``uint64`` accumulator, so memory is O(vector length), not O(participants × length).
A participant whose upload is incomplete at the deadline is a dropout, and its
partial chunks must not stay in the sum — but they cannot be subtracted later
without its input. So each uploading participant is given one of ``max_in_flight``
staging slots (a vector each); chunks are written there (any order) and the slot is
added into the accumulator only when the upload is complete. An abandoned upload
just frees its slot. Total memory is ``(1 + max_in_flight) × 8 × length`` bytes; when
all slots are busy a new upload is refused with :class:`UploadSlotsBusy` (retry
later, nothing stored). Re-uploading after an abandoned attempt is safe: the
participant's chunks are deterministic, so the server sees identical bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from . import shamir
from ._exceptions import (
    AggregateOutOfRange,
    BadComplaint,
    BadKey,
    DuplicateMessage,
    Excluded,
    ForgedShare,
    InvalidSpec,
    JobAborted,
    MalformedMessage,
    OutOfStage,
    SecAggError,
    SenderMismatch,
    TooFewSurvivors,
    UnexpectedShare,
    UnknownParticipant,
    UploadSlotsBusy,
    WrongJob,
    WrongLength,
    WrongRecipient,
)
from .channel import ShareKind, commitment, commitment_matches
from .complaints import ComplaintRecord, verify_complaint
from .kdf import pairwise_mask_seed, self_mask_seed
from .keys import (
    advert_payload,
    agree,
    check_public_key,
    digests_equal,
    load_identity_public,
    seed_commitment,
    survivors_payload,
    verify,
    x25519_public_from_private,
)
from .messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShare,
    KeyRoster,
    MaskedChunk,
    Message,
    RoutedShare,
    ShareBundle,
    ShareComplaint,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
    decode_message,
)
from .prg import MaskExpander, MaskSeed
from .ring import RING_DTYPE, decode, entries_out_of_range
from .spec import JobSpec

__all__ = ["AggregateResult", "SecAggServer", "Stage"]


class Stage(enum.Enum):
    """The server's current stage (what it accepts now)."""

    ADVERTISE = "advertise"
    SHARE = "share"
    MASKED = "masked"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    DONE = "done"
    ABORTED = "aborted"


@dataclass(frozen=True)
class AggregateResult:
    """The output of a job: the decoded sum and who is in it.

    ``ring_sum`` is the exact sum in ``Z_{2^64}`` (fixed point, DP noise included) for
    callers that need integers, e.g. privacy accounting. ``values`` is
    ``ring_sum`` decoded to float64 with ``2^-scale_bits`` per unit.
    """

    values: npt.NDArray[np.float64] = field(repr=False)
    ring_sum: npt.NDArray[np.uint64] = field(repr=False)
    contributors: tuple[str, ...]
    dropouts: tuple[str, ...]
    excluded: tuple[str, ...]
    scale_bits: int


@dataclass
class _Upload:
    slot: int
    received: npt.NDArray[np.bool_]
    count: int = 0


class SecAggServer:
    """The coordinator's state machine for one job.

    Args:
        spec: the job specification (the same object/bytes the participants get).
        directory: id -> Ed25519 public identity key of every participant; used to
            reject forged advertisements and consistency signatures early.
        max_in_flight: how many participants may upload concurrently (each costs one
            vector of staging memory; see the module docstring).
    """

    def __init__(
        self,
        spec: JobSpec,
        directory: Mapping[str, bytes | Ed25519PublicKey],
        *,
        max_in_flight: int = 2,
    ) -> None:
        if not isinstance(spec, JobSpec):
            raise InvalidSpec("spec must be a JobSpec")
        spec.validate()
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        missing = [p for p in spec.participants if p not in directory]
        if missing:
            raise InvalidSpec(
                f"identity directory lacks {len(missing)} participants, e.g. {missing[0]!r}"
            )
        self.spec = spec
        self.max_in_flight = max_in_flight
        self._directory = {p: load_identity_public(directory[p]) for p in spec.participants}
        self._graph = spec.masking_graph
        self._participants = frozenset(spec.participants)
        self._stage = Stage.ADVERTISE

        self._adverts: dict[str, AdvertiseKeys] = {}
        self._public_keys: set[bytes] = set()
        self._u1: frozenset[str] = frozenset()
        self._share_msgs: dict[str, ShareKeys] = {}
        self._share_index: dict[tuple[str, str], EncryptedShare] = {}  # (dealer, holder)
        # (owner, holder) -> (x, mask-key commitment, seed commitment)
        self._commitments: dict[tuple[str, str], tuple[int, bytes, bytes]] = {}
        self._u2: frozenset[str] = frozenset()

        self._acc: npt.NDArray[np.uint64] | None = None
        self._slots: list[npt.NDArray[np.uint64] | None] = []
        self._free_slots: list[int] = []
        self._uploads: dict[str, _Upload] = {}
        self._completed: set[str] = set()
        self._u3: frozenset[str] = frozenset()
        self._needed_keys: frozenset[str] = frozenset()  # dropouts whose s_sk is needed

        self._signatures: dict[str, bytes] = {}
        self._responders: frozenset[str] = frozenset()
        self._responded: set[str] = set()
        # (owner, kind) -> holder -> (x, share)
        self._reveals: dict[tuple[str, ShareKind], dict[str, tuple[int, bytes]]] = {}
        self._result: AggregateResult | None = None
        self._complaints = ComplaintRecord()

    def __repr__(self) -> str:
        return f"SecAggServer(job={self.spec.job_id.hex()[:16]}, stage={self._stage.value})"

    # ------------------------------------------------------------- inspection
    @property
    def stage(self) -> Stage:
        return self._stage

    @property
    def advertised(self) -> frozenset[str]:
        """``U1`` once the advertise stage is closed."""
        return self._u1

    @property
    def shared(self) -> frozenset[str]:
        """``U2``: participants whose shares were routed (they are masked against)."""
        return self._u2

    @property
    def survivors(self) -> frozenset[str]:
        """``U3``: participants whose complete masked input is in the sum."""
        return self._u3

    def pending(self) -> frozenset[str]:
        """Participants the current stage still waits for."""
        if self._stage is Stage.ADVERTISE:
            return self._participants - set(self._adverts)
        if self._stage is Stage.SHARE:
            return self._u1 - set(self._share_msgs)
        if self._stage is Stage.MASKED:
            return self._u2 - self._completed
        if self._stage is Stage.CONSISTENCY:
            return self._u3 - set(self._signatures)
        if self._stage is Stage.UNMASK:
            return self._responders - self._responded
        return frozenset()

    def memory_bytes(self) -> int:
        """Bytes held in vectors (accumulator + staging slots)."""
        arrays = [self._acc, *self._slots]
        return sum(a.nbytes for a in arrays if a is not None)

    # ------------------------------------------------------------- plumbing
    def _expect(self, stage: Stage) -> None:
        if self._stage is Stage.ABORTED:
            raise JobAborted("this job was aborted")
        if self._stage is not stage:
            raise OutOfStage(f"server is at stage {self._stage.value!r}, not {stage.value!r}")

    def _check_sender(
        self, job_id: bytes, sender: str, transport_sender: str | None, eligible: Iterable[str]
    ) -> None:
        if job_id != self.spec.job_id:
            raise WrongJob("message belongs to another job")
        if transport_sender is not None and transport_sender != sender:
            raise SenderMismatch(
                f"message names sender {sender!r} but arrived from {transport_sender!r}"
            )
        if sender not in self._participants:
            raise UnknownParticipant(f"{sender!r} is not a participant of this job")
        if sender not in eligible:
            raise Excluded(f"{sender!r} was left out of this job at an earlier stage")

    def _abort(self, error: SecAggError) -> SecAggError:
        self._stage = Stage.ABORTED
        self._acc = None
        self._slots = []
        self._uploads = {}
        self._reveals = {}
        return error

    def _need(self, count: int, needed: int, stage: str, what: str = "survivors") -> None:
        if count < needed:
            raise self._abort(
                TooFewSurvivors(needed=needed, remaining=count, stage=stage, what=what)
            )

    def _prune(self, live: Iterable[str]) -> frozenset[str]:
        """Drop participants with fewer than ``t`` live share holders, until stable:
        their secrets could not be recovered, and before any input is masked against
        them leaving them out costs nothing."""
        current = set(live)
        if self.spec.graph == "complete":  # every participant holds everyone's shares
            return frozenset(current) if len(current) >= self.spec.threshold else frozenset()
        changed = True
        while changed:
            changed = False
            for p in sorted(current):
                if len(self._graph.holders(p, current)) < self.spec.threshold:
                    current.discard(p)
                    changed = True
        return frozenset(current)

    # ------------------------------------------------------------- dispatch
    def receive(self, message: Message, *, sender: str | None = None) -> None:
        """Accept any participant-to-server message. ``sender`` is the identity the
        transport authenticated (mTLS); when given it must match the message."""
        if isinstance(message, AdvertiseKeys):
            self.receive_advertise(message, sender=sender)
        elif isinstance(message, ShareKeys):
            self.receive_share_keys(message, sender=sender)
        elif isinstance(message, MaskedChunk):
            self.absorb(message, sender=sender)
        elif isinstance(message, ConsistencySignature):
            self.receive_consistency(message, sender=sender)
        elif isinstance(message, UnmaskResponse):
            self.receive_unmask(message, sender=sender)
        elif isinstance(message, ShareComplaint):
            self.receive_complaint(message, sender=sender)
        else:
            raise OutOfStage(f"the server does not accept {type(message).__name__} messages")

    def receive_bytes(
        self, data: bytes | bytearray | memoryview, *, sender: str | None = None
    ) -> None:
        """Decode (strictly) and :meth:`receive`."""
        self.receive(decode_message(data), sender=sender)

    def close_stage(self) -> Stage:
        """End the current stage (deadline reached or nobody pending); returns the new
        stage. Raises :class:`TooFewSurvivors` (and aborts) on a shortfall."""
        if self._stage is Stage.ADVERTISE:
            self._close_advertise()
        elif self._stage is Stage.SHARE:
            self._close_share()
        elif self._stage is Stage.MASKED:
            self._close_masked()
        elif self._stage is Stage.CONSISTENCY:
            self._close_consistency()
        elif self._stage is Stage.ABORTED:
            raise JobAborted("this job was aborted")
        else:
            raise OutOfStage(
                f"stage {self._stage.value!r} is closed by finish(), not close_stage()"
            )
        return self._stage

    # ------------------------------------------------------------- round 0
    def receive_advertise(self, msg: AdvertiseKeys, *, sender: str | None = None) -> None:
        self._expect(Stage.ADVERTISE)
        self._check_sender(msg.job_id, msg.sender, sender, self._participants)
        if msg.sender in self._adverts:
            raise DuplicateMessage(f"{msg.sender!r} already advertised keys")
        verify(
            self._directory[msg.sender],
            msg.signature,
            advert_payload(
                spec_digest=self.spec.digest,
                job_id=self.spec.job_id,
                sender=msg.sender,
                channel_public=msg.channel_public,
                masking_public=msg.masking_public,
                commitment=msg.seed_commitment,
            ),
            what=f"key advertisement of {msg.sender!r}",
        )
        check_public_key(msg.channel_public)
        check_public_key(msg.masking_public)
        keys = {msg.channel_public, msg.masking_public}
        if len(keys) != 2 or keys & self._public_keys:
            # Honest keys are fresh random points; a repeat means a copied key.
            raise BadKey(f"{msg.sender!r} advertised a public key that is already in use")
        self._public_keys |= keys
        self._adverts[msg.sender] = msg

    def _close_advertise(self) -> None:
        spec = self.spec
        needed = max(spec.threshold, spec.min_participants)
        self._need(len(self._adverts), needed, "advertise")
        self._u1 = self._prune(self._adverts)
        self._need(len(self._u1), needed, "advertise", "survivors with enough live neighbours")
        self._stage = Stage.SHARE

    def roster_for(self, participant: str) -> KeyRoster:
        """The key roster for one participant of ``U1``."""
        self._expect(Stage.SHARE)
        if participant not in self._u1:
            raise Excluded(f"{participant!r} is not in U1")
        holders = self._graph.holders(participant, self._u1)
        return KeyRoster(
            job_id=self.spec.job_id,
            recipient=participant,
            members=tuple(sorted(self._u1)),
            adverts=tuple(self._adverts[h] for h in holders),
        )

    # ------------------------------------------------------------- round 1
    def receive_share_keys(self, msg: ShareKeys, *, sender: str | None = None) -> None:
        self._expect(Stage.SHARE)
        self._check_sender(msg.job_id, msg.sender, sender, self._u1)
        if msg.sender in self._share_msgs:
            raise DuplicateMessage(f"{msg.sender!r} already shared its keys")
        holders = self._graph.holders(msg.sender, self._u1)
        if tuple(s.receiver for s in msg.shares) != holders:
            raise WrongRecipient(
                f"{msg.sender!r} must send one share to each of its {len(holders)} holders in U1"
            )
        if [s.x for s in msg.shares] != list(range(1, len(holders) + 1)):
            raise MalformedMessage("share x-coordinates must be 1..holders in holder order")
        self._share_msgs[msg.sender] = msg
        for s in msg.shares:
            self._share_index[(msg.sender, s.receiver)] = s
            self._commitments[(msg.sender, s.receiver)] = (
                s.x,
                s.mask_key_commitment,
                s.seed_commitment,
            )

    def _close_share(self) -> None:
        spec = self.spec
        needed = max(spec.threshold, spec.min_participants)
        self._need(len(self._share_msgs), needed, "share")
        self._u2 = self._prune(self._share_msgs)
        self._need(len(self._u2), needed, "share", "survivors with enough live neighbours")
        self._acc = np.zeros(spec.length, dtype=RING_DTYPE)
        self._stage = Stage.MASKED

    def bundle_for(self, participant: str) -> ShareBundle:
        """The shares addressed to one participant of ``U2`` (and ``U2`` itself)."""
        self._expect(Stage.MASKED)
        if participant not in self._u2:
            raise Excluded(f"{participant!r} is not in U2")
        items = []
        for dealer in self._graph.holders(participant, self._u2):
            share = self._share_index[(dealer, participant)]
            items.append(RoutedShare(sender=dealer, share=share))
        return ShareBundle(
            job_id=self.spec.job_id,
            recipient=participant,
            members=tuple(sorted(self._u2)),
            items=tuple(items),
        )

    # ------------------------------------------------------------- round 2
    def absorb(self, msg: MaskedChunk, *, sender: str | None = None) -> None:
        """Absorb one :class:`MaskedChunk` (see :meth:`absorb_chunk`)."""
        self._expect(Stage.MASKED)
        self._check_sender(msg.job_id, msg.sender, sender, self._u2)
        self._absorb(msg.sender, msg.index, msg.payload)

    def absorb_chunk(self, sender: str, index: int, data: bytes | bytearray | memoryview) -> None:
        """Add chunk ``index`` of ``sender``'s masked input (little-endian uint64 bytes).

        Rejects, storing nothing: a sender not in the job (:class:`UnknownParticipant`)
        or not in ``U2`` (:class:`Excluded`), a sender whose upload is already complete
        or a chunk index it already sent (:class:`DuplicateMessage`), an index out of
        range (:class:`MalformedMessage`), a payload of the wrong size
        (:class:`WrongLength`), and a new upload while all slots are busy
        (:class:`UploadSlotsBusy`). ``sender`` must be the transport-authenticated
        identity."""
        self._expect(Stage.MASKED)
        self._check_sender(self.spec.job_id, sender, None, self._u2)
        self._absorb(sender, index, data)

    def _absorb(self, sender: str, index: int, data: bytes | bytearray | memoryview) -> None:
        if sender in self._completed:
            raise DuplicateMessage(f"{sender!r} already uploaded its complete masked input")
        if not 0 <= index < self.spec.n_chunks:
            raise MalformedMessage(f"chunk index {index} out of range 0..{self.spec.n_chunks - 1}")
        start, stop = self.spec.chunk_bounds(index)
        view = memoryview(data).cast("B")
        if len(view) != 8 * (stop - start):
            raise WrongLength(
                f"chunk {index} must carry {stop - start} entries ({8 * (stop - start)} bytes), "
                f"got {len(view)} bytes"
            )
        upload = self._uploads.get(sender)
        if upload is not None and upload.received[index]:
            raise DuplicateMessage(f"{sender!r} already sent chunk {index}")
        if upload is None:
            upload = _Upload(
                slot=self._take_slot(), received=np.zeros(self.spec.n_chunks, dtype=np.bool_)
            )
            self._uploads[sender] = upload
        slot = self._slots[upload.slot]
        assert slot is not None
        slot[start:stop] = np.frombuffer(view, dtype=RING_DTYPE)
        upload.received[index] = True
        upload.count += 1
        if upload.count == self.spec.n_chunks:
            assert self._acc is not None
            np.add(self._acc, slot, out=self._acc)
            self._completed.add(sender)
            del self._uploads[sender]
            self._free_slots.append(upload.slot)

    def _take_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        if len(self._slots) < self.max_in_flight:
            self._slots.append(np.empty(self.spec.length, dtype=RING_DTYPE))
            return len(self._slots) - 1
        raise UploadSlotsBusy(
            f"all {self.max_in_flight} upload slots are in use; retry when one frees up"
        )

    def abandon_upload(self, participant: str) -> bool:
        """Discard an incomplete upload (connection lost); the participant may start
        again before the stage closes. Returns whether there was one."""
        self._expect(Stage.MASKED)
        upload = self._uploads.pop(participant, None)
        if upload is None:
            return False
        self._free_slots.append(upload.slot)
        return True

    def uploading(self) -> frozenset[str]:
        """Participants with an incomplete upload in a staging slot."""
        return frozenset(self._uploads)

    def _close_masked(self) -> None:
        spec = self.spec
        for participant in list(self._uploads):
            self.abandon_upload(participant)  # incomplete at the deadline: a dropout
        self._slots = []
        self._free_slots = []
        self._u3 = frozenset(self._completed)
        self._need(len(self._u3), max(spec.threshold, spec.min_participants), "masked")
        for group in self._graph.components(self._u3):
            self._need(
                len(group),
                spec.min_participants,
                "masked",
                "survivors in one connected group of the masking graph",
            )
        self._needed_keys = frozenset(
            v for v in self._u2 - self._u3 if self._graph.neighbours(v) & self._u3
        )
        self._check_recoverable(self._u3, "masked")
        self._stage = Stage.CONSISTENCY if spec.consistency_check else Stage.UNMASK
        if not spec.consistency_check:
            self._responders = self._u3

    def _check_recoverable(self, responders: frozenset[str], stage: str) -> None:
        """Every secret we will need must have ``t`` holders among ``responders``."""
        t = self.spec.threshold
        live = responders & self._u2
        for owner in sorted(self._u3 | self._needed_keys):
            have = (
                len(live)
                if self.spec.graph == "complete"
                else len(self._graph.holders(owner, live))
            )
            self._need(have, t, stage, f"live share holders of {owner!r}")

    # ------------------------------------------------------------- round 3
    def consistency_request(self) -> ConsistencyRequest:
        self._expect(Stage.CONSISTENCY)
        return ConsistencyRequest(job_id=self.spec.job_id, survivors=tuple(sorted(self._u3)))

    def receive_consistency(self, msg: ConsistencySignature, *, sender: str | None = None) -> None:
        self._expect(Stage.CONSISTENCY)
        self._check_sender(msg.job_id, msg.sender, sender, self._u3)
        if msg.sender in self._signatures:
            raise DuplicateMessage(f"{msg.sender!r} already signed the survivor set")
        verify(
            self._directory[msg.sender],
            msg.signature,
            survivors_payload(
                spec_digest=self.spec.digest, job_id=self.spec.job_id, survivors=sorted(self._u3)
            ),
            what=f"survivor-set signature of {msg.sender!r}",
        )
        self._signatures[msg.sender] = msg.signature

    def _close_consistency(self) -> None:
        signers = frozenset(self._signatures)
        self._need(len(signers), self.spec.threshold, "consistency", "consistency signatures")
        self._check_recoverable(signers, "consistency")
        self._responders = signers
        self._stage = Stage.UNMASK

    # ------------------------------------------------------------- round 4
    def unmask_request_for(self, participant: str) -> UnmaskRequest:
        self._expect(Stage.UNMASK)
        if participant not in self._responders:
            raise Excluded(f"{participant!r} is not asked to unmask")
        signatures = tuple(
            SurvivorSignature(signer=s, signature=self._signatures[s])
            for s in sorted(self._signatures)
        )
        return UnmaskRequest(
            job_id=self.spec.job_id,
            recipient=participant,
            survivors=tuple(sorted(self._u3)),
            dropouts=tuple(sorted(self._needed_keys)),
            signatures=signatures,
        )

    def receive_unmask(self, msg: UnmaskResponse, *, sender: str | None = None) -> None:
        """Check every revealed share against its dealer's commitment; store all or
        nothing. A participant that reveals a share of the wrong kind for an owner or
        a forged share is rejected (its other shares are not used either)."""
        self._expect(Stage.UNMASK)
        self._check_sender(msg.job_id, msg.sender, sender, self._responders)
        if msg.sender in self._responded:
            raise DuplicateMessage(f"{msg.sender!r} already answered the unmask request")
        accepted: list[tuple[tuple[str, ShareKind], int, bytes]] = []
        for revealed in msg.shares:
            owner, kind = revealed.owner, revealed.kind
            wanted = self._u3 if kind is ShareKind.SEED else self._needed_keys
            if owner not in wanted:
                raise UnexpectedShare(
                    f"{msg.sender!r} revealed a {kind.name} share of {owner!r}, "
                    "which was not asked for"
                )
            record = self._commitments.get((owner, msg.sender))
            if record is None:
                raise UnexpectedShare(f"{msg.sender!r} holds no share of {owner!r}")
            x, mask_key_commitment, seed_commitment_ = record
            published = seed_commitment_ if kind is ShareKind.SEED else mask_key_commitment
            actual = commitment(
                kind,
                spec_digest=self.spec.digest,
                job_id=self.spec.job_id,
                owner=owner,
                holder=msg.sender,
                x=revealed.x,
                share=revealed.share,
                salt=revealed.salt,
            )
            if revealed.x != x or not commitment_matches(published, actual):
                raise ForgedShare(
                    f"{msg.sender!r} revealed a share of {owner!r} that does not "
                    "match its dealer's commitment"
                )
            accepted.append(((owner, kind), x, revealed.share))
        for key, x, share in accepted:
            self._reveals.setdefault(key, {})[msg.sender] = (x, share)
        self._responded.add(msg.sender)

    # ------------------------------------------------------------- complaints
    def receive_complaint(self, msg: ShareComplaint, *, sender: str | None = None) -> None:
        """Record a signed complaint (:mod:`crypto.complaints`): accepted in any stage
        after shares were routed — including after an abort, so the coordinator
        learns whom to exclude on retry. Rejected, storing nothing: another job
        (:class:`WrongJob`), a transport sender other than the complainant
        (:class:`SenderMismatch`), a complainant outside ``U2`` (:class:`Excluded`), a
        dealer whose share was not routed to it (:class:`BadComplaint`), a bad
        signature (:class:`BadSignature`), and a replay (:class:`DuplicateMessage`)."""
        if self._stage in (Stage.ADVERTISE, Stage.SHARE):
            raise OutOfStage("no shares were routed yet; nothing to complain about")
        self._check_sender(msg.job_id, msg.complainant, sender, self._u2)
        if msg.dealer not in self._graph.holders(msg.complainant, self._u2):
            raise BadComplaint(
                f"{msg.complainant!r} received no share from {msg.dealer!r} in this job"
            )
        verify_complaint(self.spec, self._directory[msg.complainant], msg)
        self._complaints.add(msg)

    def accused(self) -> dict[str, tuple[str, ...]]:
        """Dealers accused by at least one valid complaint -> the complainants."""
        return self._complaints.accused()

    def _shortfall(self) -> tuple[str, int] | None:
        t = self.spec.threshold
        for owner in sorted(self._u3):
            have = len(self._reveals.get((owner, ShareKind.SEED), {}))
            if have < t:
                return f"revealed shares of the self-mask seed of {owner!r}", have
        for owner in sorted(self._needed_keys):
            have = len(self._reveals.get((owner, ShareKind.MASK_KEY), {}))
            if have < t:
                return f"revealed shares of the mask key of dropout {owner!r}", have
        return None

    def can_finish(self) -> bool:
        """Whether enough shares arrived to unmask (no need to wait for the rest)."""
        return self._stage is Stage.UNMASK and self._shortfall() is None

    def finish(self) -> AggregateResult:
        """Reconstruct the needed secrets, strip every mask, and return the sum."""
        self._expect(Stage.UNMASK)
        spec = self.spec
        shortfall = self._shortfall()
        if shortfall is not None:
            what, have = shortfall
            self._need(have, spec.threshold, "unmask", what)
        # Defensive: close_stage() already refused fewer than min_participants inputs.
        self._need(len(self._u3), spec.min_participants, "unmask")
        acc = self._acc
        assert acc is not None

        # Reconstruct and verify every secret before touching the accumulator.
        masks: list[tuple[MaskSeed, int]] = []
        wanted = [(o, ShareKind.SEED) for o in sorted(self._u3)]
        wanted += [(o, ShareKind.MASK_KEY) for o in sorted(self._needed_keys)]
        rebuilt = dict(
            zip(
                wanted,
                shamir.combine_many(
                    [sorted(self._reveals[key].values()) for key in wanted], spec.threshold
                ),
                strict=True,
            )
        )
        for owner in sorted(self._u3):
            seed = rebuilt[(owner, ShareKind.SEED)]
            if not digests_equal(
                seed_commitment(spec.digest, owner, seed), self._adverts[owner].seed_commitment
            ):
                raise self._abort(
                    ForgedShare(
                        f"shares of {owner!r}'s self-mask seed do not reconstruct "
                        "the committed seed"
                    )
                )
            mask = self_mask_seed(seed, spec_digest=spec.digest, job_id=spec.job_id, owner=owner)
            masks.append((mask, -1))

        for dropout in sorted(self._needed_keys):
            secret = rebuilt[(dropout, ShareKind.MASK_KEY)]
            if not digests_equal(
                x25519_public_from_private(secret), self._adverts[dropout].masking_public
            ):
                raise self._abort(
                    ForgedShare(
                        f"shares of {dropout!r}'s mask key do not reconstruct its advertised key"
                    )
                )
            private = X25519PrivateKey.from_private_bytes(secret)
            for survivor in sorted(self._graph.neighbours(dropout) & self._u3):
                shared = agree(private, self._adverts[survivor].masking_public)
                mask = pairwise_mask_seed(
                    shared, spec_digest=spec.digest, job_id=spec.job_id, a=survivor, b=dropout
                )
                # The survivor added +PRG if its id is smaller, -PRG otherwise: undo it.
                masks.append((mask, -1 if survivor < dropout else +1))
        self._strip(acc, masks)
        self._check_range(acc)

        result = AggregateResult(
            values=decode(acc, scale_bits=spec.scale_bits),
            ring_sum=acc,
            contributors=tuple(sorted(self._u3)),
            dropouts=tuple(sorted(self._u2 - self._u3)),
            excluded=tuple(sorted(self._participants - self._u2)),
            scale_bits=spec.scale_bits,
        )
        self._result = result
        self._acc = None
        self._reveals = {}
        self._stage = Stage.DONE
        return result

    def _check_range(self, acc: npt.NDArray[np.uint64]) -> None:
        """Refuse a sum no set of in-bound inputs could produce (module docstring)."""
        spec, inputs = self.spec, len(self._u3)
        outside = entries_out_of_range(
            acc,
            inputs=inputs,
            bound=spec.bound,
            scale_bits=spec.scale_bits,
            noise_bound=spec.noise_bound,
        )
        if outside:
            raise self._abort(
                AggregateOutOfRange(
                    f"{outside} of {spec.length} entries of the sum of {inputs} inputs lie "
                    f"outside ±{inputs} × (bound {spec.bound!r} + noise bound "
                    f"{spec.noise_bound}): a contributor uploaded an out-of-bound input; "
                    "the sum is refused"
                )
            )

    def _strip(self, acc: npt.NDArray[np.uint64], masks: list[tuple[MaskSeed, int]]) -> None:
        """Add every ``sign * PRG(mask)`` into the accumulator, chunk-major: each chunk
        of the accumulator stays in cache while all masks are applied to it, and each
        mask's cipher context is reused from chunk to chunk (sequential counter)."""
        expander = MaskExpander(min(self.spec.chunk_size, self.spec.length))
        step = expander.max_entries
        for start in range(0, self.spec.length, step):
            target = acc[start : start + step]
            for mask, sign in masks:
                expander.apply(target, mask, start, sign)
        expander.clear()

    @property
    def result(self) -> AggregateResult | None:
        return self._result
