"""The coordinator's RPC semantics, independent of gRPC.

Every method takes protobuf messages plus the transport's :class:`Peer` and either
returns the reply or raises :class:`ServiceError`. The gRPC servicer
(:mod:`spherecal.coordinator.server.grpc_server`) is a thin adapter over this class, and unit tests
drive it in-process through the same methods — so the validation tested in-process
is the validation deployed.

Validation at the boundary, before any state changes: the caller (certificate
identity, roster, session), the task or job and its stage, the message's type and
length, chunk sizes, tensor dtype/shape/finiteness. A rejected request leaves the
federation untouched and is recorded in the audit log as ``rejected`` with its
status code, so probing is visible to an operator.

One method per RPC with its boundary checks, so every check a request passes is read
in one place — except the two streamed uploads, whose chunk-by-chunk reading is in
:mod:`spherecal.coordinator.server.uploads`; what the methods do once a request is
valid lives in the driver (``board``, ``stages``, ``secure_job`` …).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Iterator

import grpc

from spherecal import crypto
from spherecal.coordinator.driver.board import end_told_to_sites, stopping_message
from spherecal.coordinator.driver.conduct import REFUSAL_KINDS
from spherecal.coordinator.driver.dp_releases import PRIVACY_REFUSALS
from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.driver.secure_job import STAGE_NAMES
from spherecal.coordinator.driver.tasks import EvaluationResult, Task
from spherecal.coordinator.errors import ServiceError, failure_kind, policy_rule
from spherecal.coordinator.server.ids import check_hex_id
from spherecal.coordinator.server.peer_refusals import PeerRefusals
from spherecal.coordinator.server.revocation import RevocationList
from spherecal.coordinator.server.status import (
    RefusalCounter,
    authorize_admin,
    federation_status,
    job_statuses,
)
from spherecal.coordinator.server.traffic import Traffic
from spherecal.coordinator.server.uploads import UploadStreams
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Member, Peer, Registry
from spherecal.coordinator.state.store import Store
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.federation_end import ended_details

__all__ = ["CoordinatorService"]

MAX_REASON_CHARS = 300


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _instruction_stage(instruction: pb.Instruction) -> str:
    kind = instruction.WhichOneof("kind")
    if kind == "secagg":
        return STAGE_NAMES.get(instruction.secagg.stage, "secagg")
    if kind in ("train", "statistics", "evaluate"):
        return str(kind)
    return "control"


class CoordinatorService:
    def __init__(
        self,
        settings: CoordinatorSettings,
        registry: Registry,
        federation: Federation,
        store: Store,
        traffic: Traffic,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.federation = federation
        self.store = store
        self.traffic = traffic
        self.max_chunk = settings.server.max_chunk_bytes
        self.refusals = RefusalCounter()
        self.peer_refusals = PeerRefusals(self.refusals, federation.say, store)
        """Calls refused for their client certificate before any handler ran."""
        self.uploads = UploadStreams(
            registry=registry,
            federation=federation,
            store=store,
            traffic=traffic,
            max_chunk=self.max_chunk,
            reject=self._reject,
            task=self._task,
        )
        """The two streamed uploads (plaintext tensors, masked inputs)."""
        self.revocation: RevocationList | None = None
        """The ``[tls] crl`` list in force (set by ``grpc_server.build_server``): the
        metrics export its ``nextUpdate``."""

    # ---------------------------------------------------------------- helpers
    def _reject(
        self,
        sender: str,
        stage: str,
        kind: str,
        data: bytes,
        error: ServiceError,
        job: str | None = None,
    ) -> ServiceError:
        self.refusals.add(error.code)
        self.store.audit(
            sender=sender[:64] or "?",
            job=job,
            stage=stage,
            kind=kind,
            nbytes=len(data),
            sha256=_sha(data),
            status="rejected",
            code=error.code.name,
            detail=error.message[:200],
        )
        return error

    def _task(self, task_id: str, participant: str) -> Task:
        check_hex_id(task_id, "task_id")
        found = self.federation.board.current_task(task_id)
        if isinstance(found, str):
            if found == "over":
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION, f"task {task_id[:32]!r} is over"
                )
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no task {task_id[:32]!r}")
        if participant not in found.expected:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{participant!r} is not part of task {task_id[:32]!r}",
            )
        return found

    # ---------------------------------------------------------------- join / liveness
    def join(self, request: pb.JoinRequest, peer: Peer) -> pb.JoinReply:
        raw = request.SerializeToString()
        pid = request.participant_id
        try:
            # who asks first: the end, and why the coordinator is stopping, are the
            # federation's (until 2026-11-27 any certificate of the CA was told)
            self.registry.check_member(pid, peer)
            self._refuse_after_end()
            self._check_data_shape(request.data)
            member = self.registry.join(request, peer)
        except ServiceError as exc:
            # Operators need to see who was turned away and why (wrong certificate,
            # not on the roster, data that does not fit the model, a replay).
            line = f"refused join from {pid[:64]!r} ({peer.address or 'in-process'}): "
            line += f"{exc.code.name}: {exc.message}"
            self.federation.say(line)
            self.store.event("warning", line)
            raise self._reject(pid, "join", "JoinRequest", raw, exc) from None
        reply = pb.JoinReply(session=member.session or "", plan=self.federation.plan_for(member))
        self.store.audit(
            sender=pid,
            job=None,
            stage="join",
            kind="JoinRequest",
            nbytes=len(raw),
            sha256=_sha(raw),
        )
        self.traffic.received(pid, "join", len(raw))
        self.traffic.sent(pid, "join", reply.ByteSize())
        self.store.event("info", f"{pid} joined (join #{member.joins})")
        self.federation.say(f"{pid} joined" + (" again" if member.joins > 1 else ""))
        self.federation.notify()
        return reply

    def _refuse_after_end(self) -> None:
        """A join after the end cannot lead anywhere: say so in a way the participant
        recognises (``spherecal.proto.federation_end``) so it stops at once."""
        board = self.federation.board
        with board.cond:
            done = board.done
            suspended = board.suspended
        if suspended is not None:  # stopping, not over: come back after the restart
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, stopping_message(suspended))
        if done is not None:
            status, message = done
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                ended_details(board.federation_id, status, end_told_to_sites(status, message)),
            )

    def _check_data_shape(self, shape: pb.DataShape) -> None:
        """The site's images against the model. A site sends ``num_classes = 0``: its
        label range is its data (whether it holds the highest classes), so it checks
        its labels against the plan itself (``participant.data.check_fits_model``); a
        non-zero count (an older site) must still match."""
        m = self.settings.model
        want = (m.in_channels, m.image_size[0], m.image_size[1])
        got = (shape.in_channels, shape.image_height, shape.image_width)
        if got != want:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"local images (channels, height, width) = {got} do not fit the "
                f"federation's model {want}",
            )
        if shape.num_classes not in (0, m.num_classes):
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"local data has {shape.num_classes} classes, the federation's model "
                f"{m.num_classes}",
            )

    def heartbeat(self, request: pb.HeartbeatRequest, peer: Peer) -> pb.HeartbeatReply:
        member = self.registry.authenticate(request.caller, peer)
        reply = pb.HeartbeatReply(
            phase=self.federation.phase,
            interval_ms=int(self.settings.timeouts.heartbeat_interval_s * 1000),
        )
        self.traffic.received(member.participant_id, "control", request.ByteSize())
        self.traffic.sent(member.participant_id, "control", reply.ByteSize())
        return reply

    def presence_open(self, request: pb.HeartbeatRequest, peer: Peer) -> Member:
        member = self.registry.authenticate(request.caller, peer)
        self.registry.presence_opened(member, peer.address)
        self.traffic.received(member.participant_id, "control", request.ByteSize())
        return member

    def presence_close(self, member: Member) -> None:
        self.registry.presence_closed(member)
        self.federation.notify()

    def presence_reply(self, member: Member) -> pb.HeartbeatReply:
        reply = pb.HeartbeatReply(
            phase=self.federation.phase,
            interval_ms=int(self.settings.timeouts.heartbeat_interval_s * 1000),
        )
        self.traffic.sent(member.participant_id, "control", reply.ByteSize())
        return reply

    def next_instruction(self, request: pb.InstructionRequest, peer: Peer) -> pb.Instruction:
        member, wait_s = self.open_poll(request, peer)
        return self.answer_poll(
            member,
            request,
            self.federation.board.wait_instruction(member, wait_s, request.caller.session),
        )

    def open_poll(self, request: pb.InstructionRequest, peer: Peer) -> tuple[Member, float]:
        """A long poll's caller and how long it may wait (the gRPC server awaits the
        board itself, ``Board.wait_instruction_async``, between this and the answer)."""
        member = self.registry.authenticate(request.caller, peer)
        return member, min(request.wait_ms / 1000.0, self.settings.timeouts.long_poll_s)

    def answer_poll(
        self, member: Member, request: pb.InstructionRequest, instruction: pb.Instruction
    ) -> pb.Instruction:
        stage = _instruction_stage(instruction)
        self.traffic.received(member.participant_id, "control", request.ByteSize())
        self.traffic.sent(member.participant_id, stage, instruction.ByteSize())
        return instruction

    # ---------------------------------------------------------------- downloads
    def download_tensor(self, request: pb.DownloadRequest, peer: Peer) -> Iterator[pb.TensorChunk]:
        member = self.registry.authenticate(request.caller, peer)
        published = self.federation.board.tensor(request.name)
        if published is None:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no tensor named {request.name[:64]!r}")
        pid = member.participant_id
        self.traffic.received(pid, "download", request.ByteSize())
        return self._stream(pid, published.header, published.array.data)

    def _stream(
        self, pid: str, header: pb.TensorHeader, data: memoryview
    ) -> Iterator[pb.TensorChunk]:
        first = pb.TensorChunk(header=header)
        self.traffic.sent(pid, "download", first.ByteSize())
        yield first
        raw = data.cast("B")
        step = min(self.max_chunk, 2 << 20)
        for start in range(0, len(raw), step):
            chunk = pb.TensorChunk(data=bytes(raw[start : start + step]))
            self.traffic.sent(pid, "download", chunk.ByteSize())
            yield chunk

    # ---------------------------------------------------------------- uploads
    def upload_tensor(self, requests: Iterable[pb.TensorUpload], peer: Peer) -> pb.UploadReceipt:
        return self.uploads.plain(requests, peer)

    # ---------------------------------------------------------------- secure aggregation
    def submit_secagg(self, request: pb.SecAggSubmission, peer: Peer) -> pb.Receipt:
        member = self.registry.authenticate(request.caller, peer)
        pid = member.participant_id
        stage = STAGE_NAMES.get(request.stage, "secagg")
        data = bytes(request.message)
        job = self.federation.board.job(request.job_id)
        job_hex = bytes(request.job_id).hex()[:64]
        try:
            if job is None:
                raise ServiceError(grpc.StatusCode.NOT_FOUND, "no such secure-aggregation job")
            job.submit(pid, request.stage, data)
        except ServiceError as exc:
            raise self._reject(pid, stage, "SecAggSubmission", data, exc, job_hex) from None
        self.store.audit(
            sender=pid,
            job=job_hex,
            stage=stage,
            kind="SecAggSubmission",
            nbytes=len(data),
            sha256=_sha(data),
        )
        if request.stage == pb.UNMASK:
            self._record_reveals(job_hex, pid, data)
        self.traffic.received(pid, stage, request.ByteSize())
        self.federation.notify()
        return pb.Receipt(message="accepted")

    def upload_masked(self, requests: Iterable[pb.MaskedUpload], peer: Peer) -> pb.UploadReceipt:
        return self.uploads.masked(requests, peer)

    def _record_reveals(self, job_hex: str, pid: str, data: bytes) -> None:
        try:
            response = crypto.UnmaskResponse.from_bytes(data)
        except crypto.SecAggError:
            return  # the job already accepted it, so this cannot happen; never fail here
        shares = [(r.owner, r.kind.name.lower()) for r in response.shares]
        self.store.revealed_shares(job_hex, pid, shares)

    # ---------------------------------------------------------------- reports
    def report_evaluation(self, request: pb.EvaluationReport, peer: Peer) -> pb.Receipt:
        member = self.registry.authenticate(request.caller, peer)
        pid = member.participant_id
        raw = request.SerializeToString()
        try:
            task = self._task(request.task_id, pid)
            if task.kind != "evaluate":
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION, "this task is not an evaluation"
                )
            counts = {c.head: int(c.correct) for c in request.counts}
            if len(counts) != len(request.counts) or set(counts) != set(task.heads):
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"report counts for exactly the heads {list(task.heads)}",
                )
            if request.total > 1 << 40 or any(c > request.total for c in counts.values()):
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT, "correct counts cannot exceed the total"
                )
            if not task.add_evaluation(pid, EvaluationResult(int(request.total), counts)):
                raise ServiceError(grpc.StatusCode.ALREADY_EXISTS, "evaluation already reported")
        except ServiceError as exc:
            raise self._reject(pid, "evaluate", "EvaluationReport", raw, exc) from None
        self.store.audit(
            sender=pid,
            job=request.task_id[:64],
            stage="evaluate",
            kind="EvaluationReport",
            nbytes=len(raw),
            sha256=_sha(raw),
        )
        self.traffic.received(pid, "evaluate", len(raw))
        self.federation.notify()
        return pb.Receipt(message="accepted")

    def report_failure(self, request: pb.FailureReport, peer: Peer) -> pb.Receipt:
        member = self.registry.authenticate(request.caller, peer)
        pid = member.participant_id
        raw = request.SerializeToString()
        reason = request.reason[:MAX_REASON_CHARS]
        if not request.task_id:
            return self._plan_refused(member, request, raw)
        try:
            check_hex_id(request.task_id, "task_id")
        except ServiceError as exc:
            raise self._reject(pid, "report", "FailureReport", raw, exc) from None
        failure = failure_kind(request)
        kind = pb.FailureKind.Name(failure)
        found = self.federation.board.current_task(request.task_id)
        if isinstance(found, str):
            job = self.federation.board.job(bytes.fromhex(request.task_id))
            if job is None:
                raise self._reject(
                    pid,
                    "report",
                    "FailureReport",
                    raw,
                    ServiceError(grpc.StatusCode.NOT_FOUND, "no such current task or job"),
                )
            purpose = job.purpose
            withdraw = job.withdraw
        else:
            job = found.job
            purpose = found.purpose or found.kind
            withdraw = found.withdraw
        if failure in REFUSAL_KINDS:
            # recorded before the withdrawal: a job the withdrawal ends is judged
            # (``futile_retry``) with this refusal already in the record
            self.federation.stages.conduct.refusal(
                participant=pid,
                job=job.job_hex if job is not None else request.task_id[:64],
                purpose=purpose,
                kind=failure,
                rule=policy_rule(request),
                reason=reason,
            )
        withdraw(pid, f"{kind}: {reason}")
        privacy = self.federation.privacy
        if privacy is not None and job is not None and failure in PRIVACY_REFUSALS:
            privacy.record_refusal(job.job_hex, pid, failure)
        self.store.audit(
            sender=pid,
            job=request.task_id[:64],
            stage="report",
            kind="FailureReport",
            nbytes=len(raw),
            sha256=_sha(raw),
        )
        rule = policy_rule(request)
        shown = kind + (f"/{pb.PolicyRule.Name(rule)}" if rule != pb.RULE_UNSPECIFIED else "")
        message = f"{pid} withdrew from {request.task_id[:16]}: {shown}: {reason}"
        self.store.event("warning", message)
        self.federation.say(message)
        self.federation.notify()
        return pb.Receipt(message="noted")

    def _plan_refused(self, member: Member, request: pb.FailureReport, raw: bytes) -> pb.Receipt:
        """A ``FailureReport`` without a task: the site refused the federation's plan as
        it joined and is leaving (its process exits). Its session ends at once
        (:meth:`Registry.leave`), so ``spherecal status`` shows it as having left, with
        the reason, rather than connected until the heartbeat timeout; the refusal is
        logged, recorded in the events table and under ``warnings`` (status view,
        ``summary.json``), and a typed policy refusal in ``policy_events`` as well
        (``purpose`` "plan", no job). The driver no longer counts it among the joined
        or the alive, and a join window still open stops waiting for it — failing the
        federation at once if the sites still to come cannot make its minimum
        (``Federation._await_participants``); a site that joins again is let back in."""
        pid = member.participant_id
        reason = request.reason[:MAX_REASON_CHARS]
        try:
            failure = failure_kind(request)
        except ServiceError as exc:
            raise self._reject(pid, "report", "FailureReport", raw, exc) from None
        rule = policy_rule(request)
        shown = pb.FailureKind.Name(failure) + (
            f"/{pb.PolicyRule.Name(rule)}" if rule != pb.RULE_UNSPECIFIED else ""
        )
        self.registry.leave(member, f"refused the federation's plan: {shown}: {reason}")
        if failure in REFUSAL_KINDS:
            self.federation.stages.conduct.refusal(
                participant=pid, job="", purpose="plan", kind=failure, rule=rule, reason=reason
            )
        self.store.audit(
            sender=pid,
            job=None,
            stage="report",
            kind="FailureReport",
            nbytes=len(raw),
            sha256=_sha(raw),
        )
        message = f"{pid} refused the federation's plan and left: {shown}: {reason}"
        self.store.event("warning", message)
        self.federation.progress.warnings.append(message)
        self.federation.say(f"WARNING: {message}")
        self.federation.notify()
        return pb.Receipt(message="noted")

    def certificates_revoked(self, serials: Collection[int]) -> None:
        """The CA's revocation list, as loaded or reloaded (``[tls] crl``): each member
        whose own certificate (the one it last joined with) is on it has *left*
        (:meth:`Registry.revoked`) — said once, in the log, the events table and
        ``warnings`` — and nothing waits for it: not the join window
        (``Federation._await_participants``), not a job's stages
        (``Stages.drive_job``). A join with a new certificate lets it back in."""
        gone = self.registry.revoked(serials)
        for pid, why in gone.items():
            message = f"{pid} left the federation: it {why}"
            self.store.event("warning", message)
            self.federation.progress.warnings.append(message)
            self.federation.say(f"WARNING: {message}")
        if gone:
            self.federation.notify()

    # ---------------------------------------------------------------- status
    def get_status(self, request: pb.StatusRequest, peer: Peer) -> pb.StatusReply:
        """A roster member's view: the phase, the rounds, each job's state, and its
        own presence — never another site's presence, a job's contributors or any
        reason. Until 2026-11-27 any certificate of the CA was answered, and every
        member read which sites stayed connected yet left a job's sum (a withheld
        input, a bit of that site's data) and the first cause naming them. The
        operator's view is :meth:`get_federation_status`."""
        pid = self.registry.authenticate_any(request.caller, peer)
        fed = self.federation
        failed = len(fed.errors)
        return pb.StatusReply(
            federation_id=fed.federation_id,
            phase=fed.phase,
            completed_rounds=fed.completed_rounds,
            rounds=self.settings.training.rounds,
            jobs=[
                pb.JobStatus(
                    job_id=j.job_id, purpose=j.purpose, round=j.round, state=j.state, stage=j.stage
                )
                for j in job_statuses(fed)
            ],
            participants=[
                pb.ParticipantStatus(
                    participant_id=pid,
                    joined=pid in self.registry.joined(),
                    alive=pid in self.registry.alive(),
                )
            ],
            error=f"{failed} error(s): see the coordinator's status" if failed else "",
        )

    def get_federation_status(
        self, request: pb.FederationStatusRequest, peer: Peer
    ) -> pb.FederationStatus:
        """The operator's status view (``spherecal.coordinator.server.status``); admin callers
        only."""
        raw = request.SerializeToString()
        try:
            authorize_admin(self.settings, peer)
        except ServiceError as exc:
            raise self._reject(peer.identity or "?", "status", "StatusRequest", raw, exc) from None
        status = federation_status(self.settings, self.registry, self.federation, self.refusals)
        # The end as an operator should see it: every connected site told done (a
        # lingering coordinator waits for a watch to be shown that view).
        told_all = all(r.told_done or not r.connected for r in status.roster)
        self.federation.board.status_served(final=status.status != "running" and told_all)
        return status
