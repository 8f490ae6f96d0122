"""The coordinator's side of secure aggregation, as a message-in/message-out state machine.

Its methods are the protocol's stage transitions, each checking stage and sender before
delegating; the work itself is in :mod:`spherecal.crypto.routing` (key and share
routing), :mod:`spherecal.crypto.staging` (the streaming sum) and
:mod:`spherecal.crypto.unmask` (round 4), so the stage checks that make it safe stay
together.

Protocol: Bonawitz et al. 2017 (rounds 0-4) with the SecAgg+ neighbour graph of Bell
et al. 2020. The server routes keys and encrypted shares, sums masked inputs, and at
the end reconstructs exactly the secrets needed to cancel the masks: self-mask seeds
``b_u`` of survivors and mask keys ``s_sk`` of participants that dropped after
sharing. It learns the sum of the survivors' inputs and nothing else (see
``docs/threat_model.md``).

Driving it (the service does this over gRPC; :mod:`spherecal.crypto.simulation` does it
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

Streaming and memory: masked chunks are added in place as they arrive, at most
``max_in_flight`` uploads incomplete at once, and an upload incomplete at the deadline
is taken out of the sum again; memory is at most ``(1 + max_in_flight) × w/8 × length``
bytes (:mod:`spherecal.crypto.staging`). Round 4
— checking revealed shares, rebuilding secrets, stripping masks — is in
:mod:`spherecal.crypto.unmask`; this module is the stage machine that calls both.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from spherecal.crypto._exceptions import (
    BadComplaint,
    DuplicateMessage,
    Excluded,
    ForgedShare,
    InvalidSpec,
    JobAborted,
    OutOfStage,
    SecAggError,
    SenderMismatch,
    TooFewSurvivors,
    UnknownParticipant,
    WrongJob,
    WrongLength,
)
from spherecal.crypto.complaints import ComplaintRecord, verify_complaint
from spherecal.crypto.consistency import signers_counted
from spherecal.crypto.keys import load_identity_public, survivors_payload, verify
from spherecal.crypto.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    KeyRoster,
    MaskedChunk,
    Message,
    ShareBundle,
    ShareComplaint,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
    decode_message,
)
from spherecal.crypto.ring import decode
from spherecal.crypto.routing import ShareRouter, prune_unrecoverable
from spherecal.crypto.spec import JobSpec
from spherecal.crypto.staging import StagedSum
from spherecal.crypto.unmask import (
    Reveals,
    aggregate_out_of_range,
    checked_reveals,
    masks_to_strip,
    missing_reveals,
    strip_masks,
)

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

    ``ring_sum`` is the exact sum in the job's ring ``Z_{2^w}`` (``uint32`` or ``uint64``
    words; fixed point, DP noise included) for
    callers that need integers, e.g. privacy accounting. ``values`` is
    ``ring_sum`` decoded to float64 with ``2^-scale_bits`` per unit.
    """

    values: npt.NDArray[np.float64] = field(repr=False)
    ring_sum: npt.NDArray[np.unsignedinteger] = field(repr=False)
    contributors: tuple[str, ...]
    dropouts: tuple[str, ...]
    excluded: tuple[str, ...]
    scale_bits: int


@dataclass(frozen=True)
class _SurvivorView:
    """What the consistency and unmask stages send and check, from ``U3`` and the
    needed dropouts (:meth:`SecAggServer._survivor_view`)."""

    u3: frozenset[str]
    needed: frozenset[str]
    survivors: tuple[str, ...]
    dropouts: tuple[str, ...]
    revealed: frozenset[str]
    payload: bytes


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

        self._router = ShareRouter(spec, self._graph, self._directory)
        self._u1: frozenset[str] = frozenset()
        self._u2: frozenset[str] = frozenset()

        self._sum: StagedSum | None = None  # from the MASKED stage until finish()
        self._u3: frozenset[str] = frozenset()
        self._needed_keys: frozenset[str] = frozenset()  # dropouts whose s_sk is needed
        self._view: _SurvivorView | None = None

        self._signatures: dict[str, bytes] = {}
        self._signed_holders_of: dict[str, tuple[str, ...]] = {}
        self._responders: frozenset[str] = frozenset()
        self._responded: set[str] = set()
        self._reveals: Reveals = {}
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
            return self._participants - set(self._router.adverts)
        if self._stage is Stage.SHARE:
            return self._u1 - set(self._router.share_msgs)
        if self._stage is Stage.MASKED:
            assert self._sum is not None
            return self._u2 - self._sum.completed
        if self._stage is Stage.CONSISTENCY:
            return self._u3 - set(self._signatures)
        if self._stage is Stage.UNMASK:
            return self._responders - self._responded
        return frozenset()

    def is_pending(self, participant: str) -> bool:
        """``participant in pending()`` in O(1) (every long poll asks)."""
        stage = self._stage
        if stage is Stage.ADVERTISE:
            return participant in self._participants and participant not in self._router.adverts
        if stage is Stage.SHARE:
            return participant in self._u1 and participant not in self._router.share_msgs
        if stage is Stage.MASKED:
            assert self._sum is not None
            return participant in self._u2 and participant not in self._sum.completed
        if stage is Stage.CONSISTENCY:
            return participant in self._u3 and participant not in self._signatures
        if stage is Stage.UNMASK:
            return participant in self._responders and participant not in self._responded
        return False

    def memory_bytes(self) -> int:
        """Bytes held in vectors (the accumulator + chunks of uploads in flight)."""
        return 0 if self._sum is None else self._sum.memory_bytes()

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
        self._sum = None
        self._reveals = {}
        return error

    def _need(self, count: int, needed: int, stage: str, what: str = "survivors") -> None:
        if count < needed:
            raise self._abort(
                TooFewSurvivors(needed=needed, remaining=count, stage=stage, what=what)
            )

    def _prune(self, live: Iterable[str]) -> frozenset[str]:
        return prune_unrecoverable(self.spec, self._graph, live)

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
        self._router.add_advert(msg)

    def _close_advertise(self) -> None:
        spec = self.spec
        needed = max(spec.threshold, spec.min_participants)
        self._need(len(self._router.adverts), needed, "advertise")
        self._u1 = self._prune(self._router.adverts)
        self._need(len(self._u1), needed, "advertise", "survivors with enough live neighbours")
        self._stage = Stage.SHARE

    def roster_for(self, participant: str) -> KeyRoster:
        """The key roster for one participant of ``U1``."""
        self._expect(Stage.SHARE)
        if participant not in self._u1:
            raise Excluded(f"{participant!r} is not in U1")
        return self._router.roster_for(participant, self._u1)

    # ------------------------------------------------------------- round 1
    def receive_share_keys(self, msg: ShareKeys, *, sender: str | None = None) -> None:
        self._expect(Stage.SHARE)
        self._check_sender(msg.job_id, msg.sender, sender, self._u1)
        self._router.add_shares(msg, self._u1)

    def _close_share(self) -> None:
        spec = self.spec
        needed = max(spec.threshold, spec.min_participants)
        self._need(len(self._router.share_msgs), needed, "share")
        self._u2 = self._prune(self._router.share_msgs)
        self._need(len(self._u2), needed, "share", "survivors with enough live neighbours")
        self._sum = StagedSum(spec, max_in_flight=self.max_in_flight)
        self._stage = Stage.MASKED

    def bundle_for(self, participant: str) -> ShareBundle:
        """The shares addressed to one participant of ``U2`` (and ``U2`` itself)."""
        self._expect(Stage.MASKED)
        if participant not in self._u2:
            raise Excluded(f"{participant!r} is not in U2")
        return self._router.bundle_for(participant, self._u2)

    # ------------------------------------------------------------- round 2
    def absorb(self, msg: MaskedChunk, *, sender: str | None = None) -> None:
        """Absorb one :class:`MaskedChunk` (see :meth:`absorb_chunk`)."""
        self._expect(Stage.MASKED)
        self._check_sender(msg.job_id, msg.sender, sender, self._u2)
        self._absorb(msg.sender, msg.index, msg.payload)

    def absorb_chunk(self, sender: str, index: int, data: bytes | bytearray | memoryview) -> None:
        """Add chunk ``index`` of ``sender``'s masked input (little-endian ring words).

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
        assert self._sum is not None
        self._sum.add_chunk(sender, index, data)

    def abandon_upload(self, participant: str) -> bool:
        """Discard an incomplete upload (connection lost); the participant may start
        again before the stage closes. Returns whether there was one."""
        self._expect(Stage.MASKED)
        assert self._sum is not None
        return self._sum.abandon(participant)

    def uploading(self) -> frozenset[str]:
        """Participants with an incomplete upload in the sum (``crypto.staging``)."""
        return frozenset() if self._sum is None else self._sum.uploading()

    def _close_masked(self) -> None:
        spec = self.spec
        assert self._sum is not None
        self._u3 = self._sum.close()  # an upload incomplete at the deadline: a dropout
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

    # ------------------------------------------------------------- journal
    def masked_snapshot(self) -> tuple[frozenset[str], npt.NDArray[np.unsignedinteger]]:
        """``(U3, the masked sum)`` once the masked stage has closed: what a journal
        must keep so that a restarted coordinator can finish the job without asking
        anyone for their masked input again. The sum is still masked (it reveals
        nothing without the unmask stage's shares).

        The sum is a read-only view of the server's own, not a copy (issue #24: the
        copy of a 7.6 MB FFC sum, into fresh pages, cost the coordinator 14–40 ms of
        CPU per job in the service): nothing adds into it after the masked stage
        closed, and a caller that needs it past :meth:`finish` copies it."""
        if self._stage not in (Stage.CONSISTENCY, Stage.UNMASK) or self._sum is None:
            raise OutOfStage(
                f"server is at stage {self._stage.value!r}; the masked sum is kept from the "
                "close of the masked stage until finish()"
            )
        view = self._sum.total.view()
        view.flags.writeable = False
        return self._u3, view

    def restore_masked(
        self, survivors: Iterable[str], total: npt.NDArray[np.unsignedinteger]
    ) -> None:
        """Replay of a journal: set the masked stage's completed uploads and their sum
        to what :meth:`masked_snapshot` returned before a restart; the caller then
        closes the stage as it was closed. Only for a journal this coordinator wrote
        (the values are its own, not a participant's message)."""
        self._expect(Stage.MASKED)
        assert self._sum is not None
        completed = frozenset(survivors)
        if not completed <= self._u2:
            raise Excluded("a restored survivor is not in U2")
        if total.shape != (self.spec.length,) or total.dtype != self.spec.dtype:
            raise WrongLength(
                f"restored sum must be {self.spec.length} entries of {self.spec.dtype}"
            )
        self._sum.abandon_all()
        self._sum.total = total.copy()
        self._sum.completed = set(completed)

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

    def _survivor_view(self) -> _SurvivorView:
        """``U3`` and the dropouts whose keys are needed, sorted, and the payload every
        survivor signs — fixed once the masked stage has closed, so computed once per
        job (O(n log n)) rather than for each signature and each unmask request, which
        was O(n² log n) per job (≈ 0.1–0.2 s of the coordinator's 2.3 s at n = 1000;
        issue #24). Rebuilt if either set is ever replaced."""
        view = self._view
        if view is None or view.u3 is not self._u3 or view.needed is not self._needed_keys:
            survivors = tuple(sorted(self._u3))
            view = self._view = _SurvivorView(
                u3=self._u3,
                needed=self._needed_keys,
                survivors=survivors,
                dropouts=tuple(sorted(self._needed_keys)),
                revealed=self._u3 | self._needed_keys,
                payload=survivors_payload(
                    spec_digest=self.spec.digest, job_id=self.spec.job_id, survivors=survivors
                ),
            )
        return view

    # ------------------------------------------------------------- round 3
    def consistency_request(self) -> ConsistencyRequest:
        self._expect(Stage.CONSISTENCY)
        return ConsistencyRequest(
            job_id=self.spec.job_id, survivors=self._survivor_view().survivors
        )

    def receive_consistency(self, msg: ConsistencySignature, *, sender: str | None = None) -> None:
        self._expect(Stage.CONSISTENCY)
        self._check_sender(msg.job_id, msg.sender, sender, self._u3)
        if msg.sender in self._signatures:
            raise DuplicateMessage(f"{msg.sender!r} already signed the survivor set")
        verify(
            self._directory[msg.sender],
            msg.signature,
            self._survivor_view().payload,
            what=f"survivor-set signature of {msg.sender!r}",
        )
        self._signatures[msg.sender] = msg.signature

    def _close_consistency(self) -> None:
        signers = frozenset(self._signatures)
        self._need(len(signers), self.spec.threshold, "consistency", "consistency signatures")
        self._check_recoverable(signers, "consistency")
        self._responders = signers
        self._signed_holders_of = {}
        self._stage = Stage.UNMASK

    # ------------------------------------------------------------- round 4
    def unmask_request_for(self, participant: str) -> UnmaskRequest:
        self._expect(Stage.UNMASK)
        if participant not in self._responders:
            raise Excluded(f"{participant!r} is not asked to unmask")
        view = self._survivor_view()
        signatures = tuple(
            SurvivorSignature(signer=s, signature=self._signatures[s])
            for s in signers_counted(
                self._graph,
                participant,
                revealed=view.revealed,
                members1=self._u1,
                signed=self._signatures,
                threshold=self.spec.threshold,
                signed_holders=self._signed_holders,
            )
        )
        return UnmaskRequest(
            job_id=self.spec.job_id,
            recipient=participant,
            survivors=view.survivors,
            dropouts=view.dropouts,
            signatures=signatures,
        )

    def _signed_holders(self, owner: str) -> tuple[str, ...]:
        """``owner``'s holders in ``U1`` that signed the survivor set (sorted), once per
        owner and job: the signatures are fixed once the consistency stage closed (it
        clears this cache), and each owner is in ``k + 1`` unmask requests."""
        cached = self._signed_holders_of.get(owner)
        if cached is None:
            signed = self._signatures
            cached = tuple(s for s in self._graph.holders(owner, self._u1) if s in signed)
            self._signed_holders_of[owner] = cached
        return cached

    def receive_unmask(self, msg: UnmaskResponse, *, sender: str | None = None) -> None:
        """Check every revealed share against its dealer's commitment; store all or
        nothing. A participant that reveals a share of the wrong kind for an owner or
        a forged share is rejected (its other shares are not used either)."""
        self._expect(Stage.UNMASK)
        self._check_sender(msg.job_id, msg.sender, sender, self._responders)
        if msg.sender in self._responded:
            raise DuplicateMessage(f"{msg.sender!r} already answered the unmask request")
        accepted = checked_reveals(
            self.spec,
            self._router.commitments,
            holder=msg.sender,
            shares=msg.shares,
            survivors=self._u3,
            needed_keys=self._needed_keys,
        )
        for key, x, share in accepted:
            self._reveals.setdefault(key, {})[msg.sender] = (x, share)
        self._responded.add(msg.sender)

    # ------------------------------------------------------------- complaints
    def receive_complaint(self, msg: ShareComplaint, *, sender: str | None = None) -> None:
        """Record a signed complaint (:mod:`spherecal.crypto.complaints`): accepted in any stage
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
        return missing_reveals(
            self._reveals,
            survivors=self._u3,
            needed_keys=self._needed_keys,
            threshold=self.spec.threshold,
        )

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
        assert self._sum is not None
        acc = self._sum.total

        # Reconstruct and verify every secret before touching the accumulator.
        try:
            masks = masks_to_strip(
                spec,
                self._graph,
                self._router.adverts,
                self._reveals,
                survivors=self._u3,
                needed_keys=self._needed_keys,
            )
        except ForgedShare as error:
            raise self._abort(error) from None
        strip_masks(spec, acc, masks)
        out_of_range = aggregate_out_of_range(spec, acc, inputs=len(self._u3))
        if out_of_range is not None:
            raise self._abort(out_of_range)

        result = AggregateResult(
            values=decode(acc, scale_bits=spec.scale_bits),
            ring_sum=acc,
            contributors=tuple(sorted(self._u3)),
            dropouts=tuple(sorted(self._u2 - self._u3)),
            excluded=tuple(sorted(self._participants - self._u2)),
            scale_bits=spec.scale_bits,
        )
        self._result = result
        self._sum = None
        self._reveals = {}
        self._stage = Stage.DONE
        return result

    @property
    def result(self) -> AggregateResult | None:
        return self._result
