"""One secure-aggregation job on the coordinator: ``crypto.SecAggServer`` plus the
things a network needs — deadlines, liveness, instruction rendering, streaming.

The state machine itself (``crypto``) is message-in/message-out and knows nothing of
time or connections. This wrapper decides *when* a stage closes: as soon as every
participant the stage still waits for is either done, dead (heartbeat timeout) or
has withdrawn, or at the stage deadline — whichever comes first. Whoever has not
sent by then is a dropout of that stage, which the protocol handles (left out before
sharing, recovered from shares after). A shortfall below the threshold aborts the
job with :class:`crypto.TooFewSurvivors`, recorded as the job's error.

Masked uploads stream straight into the server's accumulator (``absorb``) under the
job's lock; an upload cut off mid-way is abandoned, freeing its staging slot. An upload
that opens with a header waits for a free slot instead of being refused
(:mod:`~spherecal.coordinator.driver.upload_queue`). A site's upload sent again is
compared with what it sent before (``masked_resend``).
Memory is O(vector), as ``spherecal.crypto.server`` documents: ``(1 + max_in_flight)`` vectors.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import numpy as np

from spherecal import crypto
from spherecal.coordinator.driver.masked_resend import MaskedDigests
from spherecal.coordinator.driver.stage_grace import RejoinGrace
from spherecal.coordinator.driver.upload_queue import UploadQueue
from spherecal.coordinator.errors import ServiceError, from_secagg
from spherecal.coordinator.settings import SecAggSettings
from spherecal.coordinator.state.job_journal import (
    CLOSE,
    MASKED_CLOSED,
    MESSAGE,
    JobJournal,
    JournaledJob,
)
from spherecal.crypto import JobSpec, SecAggServer, Stage
from spherecal.crypto.graph import HARARY, max_closed_size
from spherecal.proto import spherecal_pb2 as pb

__all__ = [
    "Halt",
    "JobOutcome",
    "SecureJob",
    "guaranteed_inputs",
    "participants_needed",
    "plan_graph",
]

Halt = Callable[[str, str, "SecureJob"], None]
"""Test-only fault hook ``(point, purpose, job)`` (:mod:`spherecal.coordinator.driver.halts`)."""

STAGE_CODES: dict[Stage, pb.SecAggStage] = {
    Stage.ADVERTISE: pb.ADVERTISE,
    Stage.SHARE: pb.SHARE,
    Stage.MASKED: pb.MASKED,
    Stage.CONSISTENCY: pb.CONSISTENCY,
    Stage.UNMASK: pb.UNMASK,
}
LONG_STAGES = frozenset({Stage.SHARE, Stage.MASKED})
"""Stages that may wait on a participant's local work, so they get the job's first
stage deadline (``[timeouts] round_s`` for an update) rather than ``stage_s``."""
STAGE_NAMES: dict[pb.SecAggStage, str] = {
    pb.ADVERTISE: "advertise",
    pb.SHARE: "share",
    pb.MASKED: "masked",
    pb.CONSISTENCY: "consistency",
    pb.UNMASK: "unmask",
    pb.COMPLAINT: "complaint",
}


def guaranteed_inputs(settings: SecAggSettings, n: int, colluders: int = 0) -> int:
    """The fewest inputs a job over ``n`` participants can aggregate: what a DP plan
    must assume survive (``spherecal.crypto.dp.guaranteed_contributors`` of the spec built here)."""
    _, _, threshold = plan_graph(settings, n, colluders)
    return max(threshold, min(n, max(2, settings.min_participants)))


def participants_needed(settings: SecAggSettings, n: int, colluders: int = 0) -> int:
    """The fewest participants a job planned over ``n`` may be created with: its
    threshold (:func:`plan_graph`) or ``min_participants``, whichever is more. A job
    over fewer is refused at creation (:class:`SecureJob`), and a retry that cannot
    reach it is not tried (``futile_retry.fewest_for_a_job``)."""
    _, _, threshold = plan_graph(settings, n, colluders)
    return max(threshold, settings.min_participants)


def plan_graph(settings: SecAggSettings, n: int, colluders: int = 0) -> tuple[str, int, int]:
    """(graph kind, degree, threshold) for ``n`` participants.

    ``auto`` uses the complete graph up to 32 participants and a Harary graph beyond
    (SecAgg+, Bell et al. 2020) of degree ``~2·log2(n)`` unless ``harary:K`` fixes it.
    The default threshold is a strict majority of one participant's share holders
    (``n`` for the complete graph, ``k+1`` or ``k+2`` for Harary) plus the
    ``colluders`` assumed (``[privacy] colluders``): ``2t > h + c``, never below 2 —
    what sites assuming as many colluders accept (``crypto.policy.check_threshold``).
    """
    graph = settings.graph
    if graph == "auto":
        graph = "complete" if n <= 32 else "harary"
    if graph == "complete":
        return "complete", n - 1, settings.threshold_for(n, colluders)
    if ":" in graph:
        degree = int(graph.split(":", 1)[1])
    else:
        floor_t = settings.threshold if settings.threshold is not None else 2
        degree = max(2, floor_t - 1, 2 * math.ceil(math.log2(max(n, 2))))
    degree = min(degree, n - 1)
    holders = max_closed_size(HARARY, n, degree)
    return "harary", degree, settings.threshold_for(holders, colluders)


@dataclass
class JobOutcome:
    """What the driver needs when a job ends."""

    status: str  # "done" or "failed"
    values: object = None  # numpy float64 vector when done
    contributors: tuple[str, ...] = ()
    dropouts: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    error: str | None = None
    dropped: dict[str, str] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)


class SecureJob:
    """A job plus its stage deadlines; thread-safe (one lock per job)."""

    def __init__(
        self,
        *,
        purpose: str,
        round_index: int | None,
        participants: list[str],
        identity_keys: dict[str, bytes],
        directory: list[pb.DirectoryEntry],
        settings: SecAggSettings,
        length: int,
        bound: float,
        first_stage_s: float,
        stage_s: float,
        spec_arguments: dict[str, Any] | None = None,
        spec: JobSpec | None = None,
        journal: JobJournal | None = None,
        halt: Halt | None = None,
        rejoin_s: float = 0.0,
        colluders: int = 0,
    ) -> None:
        if spec is None:
            n = len(participants)
            kind, degree, threshold = plan_graph(settings, n, colluders)
            needed = participants_needed(settings, n, colluders)
            if n < needed:
                raise crypto.TooFewSurvivors(
                    needed=needed, remaining=n, stage="create", what="participants"
                )
            fixed: dict[str, Any] = {"length": length, "bound": bound}
            fixed.update(spec_arguments or {})  # a DP plan fixes scale, bound and noise bound
            spec = JobSpec.create(
                participants,
                threshold=threshold,
                min_participants=min(n, max(2, settings.min_participants)),
                graph=kind,
                degree=degree,
                consistency_check=settings.consistency_check,
                # whole AES blocks of either ring (4 entries of 32 bits, 2 of 64)
                chunk_size=min(settings.chunk_entries, max(4, -(-length // 4) * 4)),
                **fixed,
            )
        self.spec = spec
        self.purpose = purpose
        self.round = round_index
        self.job_id = self.spec.job_id
        self.job_hex = self.spec.job_id.hex()
        self.spec_bytes = self.spec.to_bytes()
        self.spec_sha256 = hashlib.sha256(self.spec_bytes).hexdigest()
        self._directory = {entry.participant_id: entry for entry in directory}
        self._entries: dict[str, list[pb.DirectoryEntry]] = {}
        self.lock = threading.RLock()
        slots = settings.upload_slots(self.spec.entry_bytes * self.spec.length, self.spec.n)
        self.server = SecAggServer(self.spec, identity_keys, max_in_flight=slots)
        self._first_stage_s = first_stage_s
        self._stage_s = stage_s
        self._stage_started = time.monotonic()
        self._deadline = self._stage_started + first_stage_s
        self._streaming: set[str] = set()
        self.uploads = UploadQueue(self.lock, self.server.max_in_flight)
        self._stage_expected = len(self.spec.participants)
        self.withdrawn: dict[str, str] = {}
        self.dropped: dict[str, str] = {}
        self.stage_seconds: dict[str, float] = {}
        self.outcome: JobOutcome | None = None
        self.journal = journal
        self._halt = halt
        self._halted: set[str] = set()
        self._accepted: dict[tuple[str, int], bytes] = {}
        """(sender, stage) -> SHA-256 of the message accepted: an identical resend (a
        site answering again after either side restarted) is acknowledged, not refused."""
        self._journaling: dict[tuple[str, int], Future[Any]] = {}
        """(sender, stage) -> the journal write of the message accepted (done once
        it committed): an identical resend is acknowledged only after it."""
        self.resumed = False
        self._reconfirmed: set[str] = set()
        self._returned: set[str] = set()
        """Participants seen with a new session during the job (:meth:`rejoined`)."""
        self._comebacks: dict[str, int] = {}
        self._grace = RejoinGrace(rejoin_s)
        self._masked = MaskedDigests(self.spec.n_chunks)

    # ---------------------------------------------------------------- journal
    def journal_message(self) -> bytes:
        """What the journal keeps to rebuild this job: the spec and every directory
        entry (serialized ``pb.SecAggJob``)."""
        return pb.SecAggJob(
            spec=self.spec_bytes,
            directory=[self._directory[p] for p in sorted(self._directory)],
            purpose=self.purpose,
        ).SerializeToString()

    def replay(self, record: JournaledJob) -> None:
        """Feed a previous process's journal of this job into the fresh server: the
        state machine is deterministic in its messages, so it reaches the same stage
        (``stages.continue_journaled_job``)."""
        server = self.server
        for entry in record.entries:
            if entry.kind == MESSAGE:
                assert entry.stage is not None and entry.sender is not None
                assert entry.data is not None
                message = self._DECODERS[cast(pb.SecAggStage, entry.stage)](entry.data)
                if isinstance(message, crypto.ShareComplaint):
                    server.receive_complaint(message, sender=entry.sender)
                else:
                    server.receive(message, sender=entry.sender)
                self._accepted[(entry.sender, entry.stage)] = hashlib.sha256(entry.data).digest()
            elif entry.kind == CLOSE:
                server.close_stage()
            elif entry.kind == MASKED_CLOSED:
                assert entry.sender is not None and entry.data is not None
                survivors = json.loads(entry.sender)
                total = np.frombuffer(entry.data, dtype=self.spec.dtype.newbyteorder("<"))
                server.restore_masked(survivors, total.astype(self.spec.dtype))
                server.close_stage()
            else:
                raise ValueError(f"unknown journal entry {entry.kind!r}")
        self._stage_expected = len(server.pending())

    def restart_clock(self) -> None:
        """Give the current stage its full deadline from now (a continued job)."""
        with self.lock:
            self._stage_started = time.monotonic()
            long_stage = self.server.stage in LONG_STAGES or self.server.stage is Stage.ADVERTISE
            self._deadline = self._stage_started + (
                self._first_stage_s if long_stage else self._stage_s
            )

    def _reached(self, point: str) -> None:
        """Call the test-only halt hook the first time this job reaches ``point``."""
        if self._halt is not None and point not in self._halted:
            self._halted.add(point)
            self._halt(point, self.purpose, self)

    # ---------------------------------------------------------------- describe
    @property
    def threshold(self) -> int:
        return self.spec.threshold

    @property
    def stage_name(self) -> str:
        return self.server.stage.value

    def job_message(self, participant: str) -> pb.SecAggJob:
        """``participant``'s job instruction: the spec and only the directory entries
        whose signatures it checks (``crypto.keys_needed``: on a Harary graph its
        2-hop neighbourhood, O(k) entries, not all n — under TLS each entry is a
        certificate the participant verifies). The entry list is computed once per
        participant and job."""
        return pb.SecAggJob(
            spec=self.spec_bytes, directory=self.directory_for(participant), purpose=self.purpose
        )

    def directory_for(self, participant: str) -> list[pb.DirectoryEntry]:
        """The directory entries ``participant`` needs, sorted by id (cached)."""
        with self.lock:
            entries = self._entries.get(participant)
            if entries is None:
                try:
                    needed = crypto.keys_needed(self.spec, participant)
                    entries = [self._directory[p] for p in sorted(needed)]
                except (crypto.SecAggError, KeyError):
                    raise ServiceError(
                        grpc.StatusCode.INTERNAL,
                        f"{participant!r} is not in {self.label()} or lacks a directory entry",
                    ) from None
                self._entries[participant] = entries
            return entries

    def label(self) -> str:
        where = f" round {self.round + 1}" if self.round is not None else ""
        return f"{self.purpose}{where} job {self.job_hex[:8]}"

    # ---------------------------------------------------------------- participant side
    def comebacks(self, participant: str) -> int:
        """How often ``participant`` came back connected after the job waited for it
        (``stage_grace``): its task is handed out once per session *and* comeback,
        since a task on its way when the connection was cut was never received."""
        with self.lock:
            return self._comebacks.get(participant, 0)

    def rejoined(self, participant: str) -> None:
        """``participant`` polls with a new session (its process restarted, or it
        reconnected): until it confirms the job again, it is handed its task once
        more if its masked input is not in the sum yet (:meth:`has_advertised`)."""
        with self.lock:
            self._returned.add(participant)
            self._reconfirmed.discard(participant)

    def has_advertised(self, participant: str) -> bool:
        """Whether ``participant`` needs no task instruction for this job any more.

        A job continued after a coordinator restart, and a site that comes back with
        a new session (:meth:`rejoined`), get the task once more (per session) while
        the site's masked input is not in the sum yet: a site that was interrupted
        before its local work does it then; one that holds the job answers from what
        it already sent (``participant.secure_jobs``) — its identical advertisement
        confirms it, and from then on the job's stages drive it."""
        with self.lock:
            if self.outcome is not None:
                return True
            stage = self.server.stage
            again = self.resumed or participant in self._returned
            if again and stage in (Stage.ADVERTISE, Stage.SHARE, Stage.MASKED):
                if participant in self._reconfirmed:
                    return True
                if stage is Stage.ADVERTISE:
                    return False
                members = self.server.advertised if stage is Stage.SHARE else self.server.shared
                if participant not in members:
                    return True  # left out before the crash: nothing to continue
                return stage is Stage.MASKED and not self.server.is_pending(participant)
            return stage is not Stage.ADVERTISE or not self.server.is_pending(participant)

    def step_for(self, participant: str) -> pb.SecAggStep | None:
        """The secure-aggregation message ``participant`` must act on now, if any."""
        with self.lock:
            if self.outcome is not None or participant in self.withdrawn:
                return None
            stage = self.server.stage
            if stage in (Stage.ADVERTISE, Stage.DONE, Stage.ABORTED):
                return None
            if not self.server.is_pending(participant):
                return None
            message: crypto.Message
            if stage is Stage.SHARE:
                message = self.server.roster_for(participant)
            elif stage is Stage.MASKED:
                if participant in self._streaming:
                    return None
                message = self.server.bundle_for(participant)
            elif stage is Stage.CONSISTENCY:
                message = self.server.consistency_request()
            else:
                message = self.server.unmask_request_for(participant)
            return pb.SecAggStep(
                job_id=self.job_id, stage=STAGE_CODES[stage], message=message.to_bytes()
            )

    _DECODERS: dict[pb.SecAggStage, Callable[[bytes], crypto.Message]] = {
        pb.ADVERTISE: crypto.AdvertiseKeys.from_bytes,
        pb.SHARE: crypto.ShareKeys.from_bytes,
        pb.CONSISTENCY: crypto.ConsistencySignature.from_bytes,
        pb.UNMASK: crypto.UnmaskResponse.from_bytes,
        pb.COMPLAINT: crypto.ShareComplaint.from_bytes,
    }

    def submit(self, participant: str, stage: pb.SecAggStage, data: bytes) -> None:
        """Accept one participant message for ``stage`` (all or nothing)."""
        decoder = self._DECODERS.get(stage)
        if decoder is None:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"stage {stage} does not take a submitted message (masked inputs stream "
                "through UploadMasked)",
            )
        try:
            message = decoder(data)
        except crypto.SecAggError as exc:
            raise from_secagg(exc) from None
        if isinstance(message, crypto.ShareComplaint):
            # accepted in any stage after share routing, even once the job has ended:
            # the complaint is what lets the retry exclude the dealer
            with self.lock:
                try:
                    self.server.receive_complaint(message, sender=participant)
                except crypto.SecAggError as exc:
                    raise from_secagg(exc) from None
                if self.journal is not None:
                    self.journal.message(self.job_hex, stage, participant, data)
            return
        digest = hashlib.sha256(data).digest()
        durable: Future[Any] | None = None
        with self.lock:
            if self._accepted.get((participant, stage)) == digest:
                # the same message again (its sender restarted, or we did): it is in
                # the job already; the sender reads ALREADY_EXISTS as delivered —
                # once the first copy is durable (its write may still be queued)
                self._reconfirmed.add(participant)
                durable = self._journaling.get((participant, stage))
                repeated = ServiceError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{self.label()} already has this {STAGE_NAMES.get(stage, stage)} message "
                    f"from {participant!r} (identical)",
                )
            else:
                repeated = None
        if repeated is not None:
            if durable is not None:
                durable.result()
            raise repeated
        with self.lock:
            self._check_open()
            current = self.server.stage
            if STAGE_CODES.get(current) != stage:
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{self.label()} is at stage {current.value!r}, not "
                    f"{STAGE_NAMES.get(stage, stage)!r}",
                )
            try:
                self.server.receive(message, sender=participant)
            except crypto.SecAggError as exc:
                raise from_secagg(exc) from None
            self._accepted[(participant, stage)] = digest
            self._reconfirmed.add(participant)
            if self.journal is not None:
                durable = self.journal.message_queued(self.job_hex, stage, participant, data)
                self._journaling[(participant, stage)] = durable
        # Durable before the sender hears "OK" — waited for outside the job's lock, so
        # the messages of a stage that arrive together commit together (one writer
        # batch) instead of one commit after another under the lock. The stage's close
        # is queued after them (under the lock), so it never commits before them.
        if durable is not None:
            durable.result()
        with self.lock:
            self._reached(STAGE_NAMES[stage])

    def begin_upload(self, participant: str) -> None:
        with self.lock:
            self._check_open()
            if self.server.stage is not Stage.MASKED:
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{self.label()} is at stage {self.server.stage.value!r}, not 'masked'",
                )
            if participant in self._streaming:
                raise ServiceError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{participant!r} already has a masked upload in progress",
                )
            if participant not in self.server.shared:
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{participant!r} is not in this job's masked stage (left out earlier)",
                )
            if self._input_complete(participant) and not self._masked.begin_repeat(participant):
                raise ServiceError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{participant!r} already uploaded its complete masked input",
                )
            self._streaming.add(participant)

    def _input_complete(self, participant: str) -> bool:
        """The job holds ``participant``'s whole masked input already (an upload of it
        now is a repeat, compared and not summed)."""
        return participant in self.server.survivors or not self.server.is_pending(participant)

    def wait_for_slot(
        self, participant: str, cancelled: Callable[[], bool] = lambda: False
    ) -> None:
        """After :meth:`begin_upload` of an upload that opened with a header: return once
        it holds an upload slot (at once for a repeat of a complete input, which is
        compared, not summed); ``ServiceError`` when the masked stage closes or the job
        ends first, or the call is cancelled (:class:`UploadQueue`)."""

        def still_open() -> None:
            self._check_open()
            if self.server.stage is not Stage.MASKED:
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{self.label()} closed its masked stage",
                )

        with self.lock:
            if self._input_complete(participant):
                return
        self.uploads.wait(
            participant, in_use=self.server.uploading, check=still_open, cancelled=cancelled
        )

    def absorb(self, participant: str, data: bytes, digest: bytes | None = None) -> int:
        """Absorb one canonical MaskedChunk (``digest``: its SHA-256, if known);
        returns its index. Repeats are compared, not summed (``masked_resend``)."""
        try:
            chunk = crypto.MaskedChunk.from_bytes(data)
        except crypto.SecAggError as exc:
            raise from_secagg(exc) from None
        if digest is None:
            digest = hashlib.sha256(data).digest()
        with self.lock:
            self._check_open()
            if self.server.stage is not Stage.MASKED:
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{self.label()} closed its masked stage",
                )
            if not self._masked.admit(participant, chunk.index, digest, self.label()):
                return chunk.index
            try:
                self.uploads.admit(participant, self.server.uploading())
                self.server.absorb(chunk, sender=participant)
            except crypto.SecAggError as exc:
                raise from_secagg(exc) from None
            self._masked.record(participant, chunk.index, digest)
        return chunk.index

    def end_upload(self, participant: str) -> bool:
        """Stream ended (normally or not). Returns whether the upload is complete;
        an incomplete one is abandoned so its slot frees and it can be retried."""
        with self.lock:
            self._streaming.discard(participant)
            self.uploads.release(participant)
            if self._masked.end(participant):
                return True  # a repeat of a complete input: nothing was summed
            if self.server.stage is not Stage.MASKED:
                return participant in self.server.survivors
            complete = not self.server.is_pending(participant)
            if not complete:
                self.server.abandon_upload(participant)
            else:
                self._reconfirmed.add(participant)
                self._reached("masked")
            return complete

    def accused(self) -> dict[str, tuple[tuple[str, ...], int]]:
        """Dealers named by verified complaints -> (complainants, the dealer's other
        share holders in this job)."""
        with self.lock:
            accused = self.server.accused()
            holders = self.server.shared
            graph = self.spec.masking_graph
            return {
                dealer: (
                    complainants,
                    sum(1 for h in graph.holders(dealer, holders) if h != dealer),
                )
                for dealer, complainants in accused.items()
            }

    def withdraw(self, participant: str, reason: str) -> None:
        with self.lock:
            if participant in self.spec.participants:
                self.withdrawn[participant] = reason

    def _check_open(self) -> None:
        if self.outcome is not None:
            raise ServiceError(
                grpc.StatusCode.ABORTED
                if self.outcome.status == "failed"
                else (grpc.StatusCode.FAILED_PRECONDITION),
                f"{self.label()} has ended ({self.outcome.status})",
            )

    # ---------------------------------------------------------------- driver side
    def waiting_on(self, alive: frozenset[str]) -> frozenset[str]:
        with self.lock:
            return frozenset(
                p for p in self.server.pending() if p in alive and p not in self.withdrawn
            )

    def advance(self, alive: frozenset[str], now: float | None = None) -> tuple[str, ...]:
        """Close the current stage if nobody live is pending or the deadline passed.

        Returns log lines describing what happened (empty when nothing changed).
        Sets :attr:`outcome` when the job ends."""
        t = time.monotonic() if now is None else now
        with self.lock:
            if self.outcome is not None:
                return ()
            server = self.server
            stage = server.stage
            pending = server.pending()
            waiting = frozenset(p for p in pending if p in alive and p not in self.withdrawn)
            expired = t >= self._deadline
            # Every stage, unmasking included, waits for all *live* participants: with
            # instant disconnect detection (presence streams) that costs nothing, and it
            # keeps the protocol's view of who took part complete and deterministic.
            # ... and, after the masked stage, for summed ones restarting (stage_grace)
            rejoining, news = self._grace.waiting(
                stage, pending, alive, self.withdrawn, t, self.label()
            )
            for p in self._grace.came_back(alive):
                self._comebacks[p] = self._comebacks.get(p, 0) + 1
                self._returned.add(p)
                self._reconfirmed.discard(p)
                news += (f"{self.label()}: {p} is back in stage {stage.value}",)
            if (waiting or rejoining) and not expired:
                return news
            for p in sorted(pending):
                if p in self.withdrawn:
                    reason = f"withdrew: {self.withdrawn[p]}"
                elif p not in alive:
                    reason = "disconnected / heartbeat timeout"
                else:
                    reason = "stage deadline"
                self.dropped.setdefault(p, f"{stage.value}: {reason}")
            self.stage_seconds[stage.value] = t - self._stage_started
            self._grace.stage_closed()
            self.uploads.wake()  # uploads waiting for a slot end (once the lock is free)
            lines = [
                f"{self.label()}: stage {stage.value} closed, "
                f"{self._stage_expected - len(pending)}/{self._stage_expected} sent"
                + (
                    "; dropped "
                    + ", ".join(
                        f"{p} ({self.dropped[p]})" for p in sorted(pending) if p in self.dropped
                    )
                    if any(p in self.dropped for p in pending)
                    else ""
                )
            ]
            try:
                if stage is Stage.UNMASK:
                    result = server.finish()
                    if self.journal is not None:  # written before anything uses it
                        self.journal.finished(
                            self.job_hex,
                            "done",
                            contributors=result.contributors,
                            dropouts=result.dropouts,
                            excluded=result.excluded,
                            values=result.values,
                        )
                    self._reached("aggregated")
                    self.outcome = JobOutcome(
                        status="done",
                        values=result.values,
                        contributors=result.contributors,
                        dropouts=result.dropouts,
                        excluded=result.excluded,
                        dropped=dict(self.dropped),
                        stage_seconds=dict(self.stage_seconds),
                    )
                    lines.append(
                        f"{self.label()}: aggregated {len(result.contributors)} inputs "
                        f"(dropouts {list(result.dropouts)}, excluded {list(result.excluded)})"
                    )
                else:
                    server.close_stage()
                    self._streaming.clear()
                    self._masked.clear()
                    self._stage_expected = len(server.pending())
                    if self.journal is not None:
                        if stage is Stage.MASKED:
                            survivors, total = server.masked_snapshot()
                            self.journal.masked_closed(self.job_hex, sorted(survivors), total)
                        else:
                            self.journal.closed(self.job_hex, STAGE_CODES[stage])
                    self._reached(f"{stage.value}-closed")
            except crypto.SecAggError as exc:
                self.outcome = JobOutcome(
                    status="failed",
                    error=f"{type(exc).__name__}: {exc}",
                    contributors=tuple(sorted(server.survivors)),
                    dropped=dict(self.dropped),
                    stage_seconds=dict(self.stage_seconds),
                )
                lines.append(f"{self.label()}: FAILED — {exc}")
                if self.journal is not None:
                    self.journal.finished(self.job_hex, "failed")
                return tuple(lines)
            self._stage_started = t
            # Participants advertise and answer the share stage before their local work
            # (spherecal.participant.secure_jobs) and upload their masked input after it: the
            # masked stage gets the first stage's (training-sized) deadline. So does the
            # share stage, for a participant whose share wait ran out ([policy]
            # share_wait_s): it answers after its local work.
            long_stage = server.stage in LONG_STAGES
            self._deadline = t + (self._first_stage_s if long_stage else self._stage_s)
            return tuple(lines)

    def abort(self, reason: str) -> None:
        with self.lock:
            if self.outcome is None:
                self.outcome = JobOutcome(
                    status="failed",
                    error=reason,
                    dropped=dict(self.dropped),
                    stage_seconds=dict(self.stage_seconds),
                )
                self.uploads.wake()
