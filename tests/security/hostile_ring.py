"""A hostile coordinator that runs real secure-aggregation jobs around a real site.

:class:`HostileRing` implements the participant ``Transport`` for one real
:class:`spherecal.participant.runner.ParticipantRunner` (the target, ``p0``: real
trainer, data, crypto, policy and SQLite state directory) and plays the coordinator
of every secure job in its script with a real :class:`spherecal.crypto.SecAggServer`.
The other members of each roster are in-process :class:`SecAggParticipant`\\ s whose
inputs the double chooses (a coordinator colluding with, or simply knowing the
inputs of, the other sites — or, equivalently, running the second sum of a
differencing pair over them alone). When a job finishes, ``sum − others' inputs``
is exactly what the target released into it (plus the noise in the sum): the
attack's result. Used by ``tests/security/test_differencing.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt

from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.crypto.dp import NoisePlan, sample_noise
from spherecal.crypto.messages import decode_message
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.participant.data import LocalData
from spherecal.participant.policy import PolicySettings
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.participant.transport import TransportError
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for
from spherecal.proto.task_context import secure_task
from tests.security.hostile_plan import HostileTransport, bind_to_task

TARGET = "p0"
PEERS = ("p0", "p1", "p2", "p3", "p4")
IDENTITIES = {p: crypto.generate_identity() for p in PEERS}
DIRECTORY = {p: crypto.identity_public_bytes(k) for p, k in IDENTITIES.items()}


@dataclass
class RingJob:
    """One secure job of the script: its spec, the others' inputs and its outcome."""

    spec: crypto.JobSpec
    others: dict[str, npt.NDArray[np.float64]]
    noise: NoisePlan | None = None
    """What the honest others add (the same plan as the target's)."""
    server: crypto.SecAggServer | None = None
    clients: dict[str, crypto.SecAggParticipant] = field(default_factory=dict)
    result: crypto.AggregateResult | None = None

    @property
    def job_id(self) -> bytes:
        return self.spec.job_id

    def target_release(self) -> npt.NDArray[np.float64]:
        """The sum minus the others' inputs: the target's input plus the sum's noise."""
        assert self.result is not None, "the job did not finish"
        others = sum(self.others.values(), np.zeros(self.spec.length))
        return np.asarray(self.result.values - others, dtype=np.float64)


def target_settings(tmp: Path, **policy: object) -> ParticipantSettings:
    """The target site's settings: secure only, its state under ``tmp``, the first
    fifth of the digits data, ``[policy]`` as given (defaults otherwise)."""
    return ParticipantSettings(
        participant_id=TARGET,
        insecure=True,
        allow_plaintext=False,
        long_poll_ms=100,
        state_dir=tmp / "state",
        data=DataSettings(slice_index=0, slice_of=5),
        policy=PolicySettings(**policy),  # type: ignore[arg-type]
    )


def run_target(settings: ParticipantSettings, ring: HostileRing, data: LocalData) -> None:
    """Run the real target site against ``ring`` until its script ends."""
    runner = ParticipantRunner(
        settings,
        ring,
        data,
        IDENTITIES[TARGET],
        MemoryJobLedger(),
        DirectoryTrust(None),
        log=lambda _m: None,
    )
    assert runner.run() == 0


def make_job(
    roster: tuple[str, ...],
    length: int,
    *,
    others: dict[str, npt.NDArray[np.float64]] | None = None,
    noise: NoisePlan | None = None,
    **spec: object,
) -> RingJob:
    arguments: dict[str, object] = {"threshold": len(roster) // 2 + 1, "length": length}
    arguments["bound"] = 1e6
    arguments.update(spec)
    job_spec = crypto.JobSpec.create(roster, **arguments)  # type: ignore[arg-type]
    inputs = others or {p: np.zeros(length) for p in roster if p != TARGET}
    return RingJob(spec=job_spec, others=inputs, noise=noise)


class HostileRing(HostileTransport):
    """Transport double playing the coordinator of a scripted list of tasks."""

    def __init__(self, *, federation: str, model: GlobalModel) -> None:
        self.federation = federation
        self.model = model
        self.peers = len(PEERS)
        self.script: list[pb.Instruction] = []
        self.jobs: dict[bytes, RingJob] = {}
        self._steps: list[pb.Instruction] = []
        self.tensors = {}
        self.failures: list[pb.FailureReport] = []
        self.uploads = []
        self.evaluations: list[pb.EvaluationReport] = []
        self.bind_tasks = True
        """Bind each secure job to its task as the service's coordinator does."""
        self.others_see: Callable[[crypto.JobSpec], crypto.JobSpec] | None = None
        """The spec the server and the other members hold (default: the target's)."""
        self.target_stages: list[str] = []
        """Stages of the target's secure-aggregation submissions, in order."""

    # ----------------------------------------------------------- scripting
    def publish(self, name: str, array: npt.ArrayLike) -> pb.TensorRef:
        data = np.ascontiguousarray(array, dtype=np.float64)
        self.tensors[name] = data
        return pb.TensorRef(name=name, header=header_for(data))

    def train(
        self,
        vector: npt.ArrayLike,
        job: RingJob,
        *,
        round_index: int = 0,
        name: object = None,
        seed: int = 7,
    ) -> pb.Instruction:
        """A secure training task over ``job`` from the model ``vector``: task
        ``train-<name>`` (``name`` defaults to the round), model ``global-<name>``."""
        label = round_index if name is None else name
        return pb.Instruction(
            task_id=f"train-{label}",
            train=pb.TrainTask(
                round=round_index,
                model=self.publish(f"global-{label}", vector),
                seed=seed,
                secure=self.secure(job, "update"),
            ),
        )

    def secure(self, job: RingJob, purpose: str) -> pb.SecAggJob:
        """Register ``job`` and return the message a task carries."""
        self.jobs[job.job_id] = job
        ids = crypto.keys_needed(job.spec, TARGET)
        directory = [
            pb.DirectoryEntry(participant_id=p, identity_public_key=DIRECTORY[p])
            for p in sorted(ids)
        ]
        return pb.SecAggJob(spec=job.spec.to_bytes(), directory=directory, purpose=purpose)

    def refusal(self, task_id: str) -> tuple[str, str]:
        (report,) = [f for f in self.failures if f.task_id == task_id]
        return pb.FailureKind.Name(report.kind), pb.PolicyRule.Name(report.rule)

    # ----------------------------------------------------------- the protocol
    def _start(self, job: RingJob) -> None:
        spec = job.spec
        job.server = crypto.SecAggServer(spec, {p: DIRECTORY[p] for p in spec.participants})
        for p in spec.participants:
            if p == TARGET:
                continue
            client = crypto.SecAggParticipant(
                spec,
                p,
                IDENTITIES[p],
                {q: DIRECTORY[q] for q in crypto.keys_needed(spec, p)},
                ledger=MemoryJobLedger(),
            )
            job.clients[p] = client
            job.server.receive(client.advertise_keys(), sender=p)

    def _step(self, job: RingJob, stage: pb.SecAggStage, message: bytes) -> None:
        self._steps.append(
            pb.Instruction(secagg=pb.SecAggStep(job_id=job.job_id, stage=stage, message=message))
        )

    def _advance(self, job: RingJob) -> None:
        """Close the stage the target just answered; the others answer the next one."""
        server = job.server
        assert server is not None
        server.close_stage()
        stage = server.stage
        if stage is crypto.Stage.SHARE:
            for p, c in job.clients.items():
                server.receive(c.share_keys(server.roster_for(p)), sender=p)
            self._step(job, pb.SHARE, server.roster_for(TARGET).to_bytes())
        elif stage is crypto.Stage.MASKED:
            for p, c in job.clients.items():
                c.receive_shares(server.bundle_for(p))
                noise = sample_noise(job.noise) if job.noise is not None else None
                c.set_input(job.others[p], noise=noise)
                for index in range(job.spec.n_chunks):
                    server.receive(c.masked_chunk(index), sender=p)
            self._step(job, pb.MASKED, server.bundle_for(TARGET).to_bytes())
        elif stage is crypto.Stage.CONSISTENCY:
            request = server.consistency_request()
            for p, c in job.clients.items():
                server.receive(c.consistency_signature(request), sender=p)
            self._step(job, pb.CONSISTENCY, request.to_bytes())
        elif stage is crypto.Stage.UNMASK:
            for p, c in job.clients.items():
                server.receive(c.unmask(server.unmask_request_for(p)), sender=p)
            self._step(job, pb.UNMASK, server.unmask_request_for(TARGET).to_bytes())

    # ----------------------------------------------------------- Transport
    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self._steps:
            return self._steps.pop(0)
        if self.script:
            instruction = self.script.pop(0)
            spec = bind_to_task(instruction, self.joined) if self.bind_tasks else None
            task = secure_task(instruction)
            if task is not None:
                job = self.jobs[crypto.JobSpec.from_bytes(task.secure.spec).job_id]
                if spec is not None and self.others_see is None:
                    job.spec = spec  # the others hold the spec the target holds
                elif self.others_see is not None:
                    job.spec = self.others_see(job.spec)
                self._start(job)
            return instruction
        return pb.Instruction(done=pb.Done(status="completed", message="over"))

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        self.target_stages.append(pb.SecAggStage.Name(request.stage))
        job = self.jobs[bytes(request.job_id)]
        assert job.server is not None
        if request.stage == pb.COMPLAINT:
            return pb.Receipt()
        try:
            job.server.receive(decode_message(bytes(request.message)), sender=TARGET)
        except crypto.SecAggError as exc:  # as the service answers a message it refuses
            raise TransportError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if request.stage == pb.UNMASK:
            job.result = job.server.finish()
        else:
            self._advance(job)
        return pb.Receipt()

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        job: RingJob | None = None
        for message in messages:
            if job is None:
                job = self.jobs[bytes(message.job_id)]
            assert job.server is not None
            if message.chunk:  # the first message is the upload's header
                job.server.receive(decode_message(bytes(message.chunk)), sender=TARGET)
        assert job is not None
        self._advance(job)
        return pb.UploadReceipt()

    def report_evaluation(self, request: pb.EvaluationReport) -> pb.Receipt:
        self.evaluations.append(request)
        return pb.Receipt()

    def report_failure(self, request: pb.FailureReport) -> pb.Receipt:
        self.failures.append(request)
        self._steps = [s for s in self._steps if s.secagg.job_id != request.task_id.encode()]
        return pb.Receipt()

    def get_status(self, request: pb.StatusRequest) -> pb.StatusReply:
        return pb.StatusReply()

    def close(self) -> None:
        pass


# ----------------------------------------------------------- crafted models
FEATURE_DIM = 128
"""The MLP extractor's feature dimension (the model of ``tests.security.conftest``)."""


def dead_unit(model: GlobalModel, outgoing: float) -> npt.NDArray[np.float64]:
    """The MLP with hidden unit 0 never active (weights in 0, bias -1: ReLU gives 0)
    and its outgoing weights all ``outgoing``. The features never read those weights,
    so each value of ``outgoing`` is a new executed model with bit-identical
    features: a new release key the coordinator varies for free."""
    vector = np.array(model.initial_vector, dtype=np.float64)
    d_in, hidden, d = 64, 256, FEATURE_DIM  # extractor.net.1 (64→256), .3 (256→d)
    assert model.feature_dim == d
    assert vector.shape == (d_in * hidden + hidden + hidden * d + d,)
    w1 = vector[: d_in * hidden].reshape(hidden, d_in)
    b1 = vector[d_in * hidden : d_in * hidden + hidden]
    w2 = vector[d_in * hidden + hidden : d_in * hidden + hidden + hidden * d].reshape(d, hidden)
    w1[0, :] = 0.0
    b1[0] = -1.0
    w2[:, 0] = outgoing
    return vector


def mlp_features(
    vector: npt.NDArray[np.float64], x: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """The normalised MLP features, computed here in float64 from the vector."""
    d_in, hidden = 64, 256
    w1 = vector[: d_in * hidden].reshape(hidden, d_in)
    b1 = vector[d_in * hidden : d_in * hidden + hidden]
    w2 = vector[d_in * hidden + hidden : -FEATURE_DIM].reshape(FEATURE_DIM, hidden)
    b2 = vector[-FEATURE_DIM:]
    h = np.maximum(x.reshape(x.shape[0], -1) @ w1.T + b1, 0.0) @ w2.T + b2
    return np.asarray(h / np.linalg.norm(h, axis=1, keepdims=True), dtype=np.float64)
