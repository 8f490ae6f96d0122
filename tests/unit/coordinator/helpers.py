"""Shared helpers for coordinator unit tests: crypto participants driving a job."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from spherecal import crypto
from spherecal.coordinator.driver.board import Board
from spherecal.coordinator.driver.secure_job import JobOutcome, SecureJob
from spherecal.coordinator.driver.stages import Progress, StageContext
from spherecal.coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    EvaluationSettings,
    ModelSettings,
    SecAggSettings,
    ServerSettings,
    Timeouts,
    TrainingSettings,
)
from spherecal.coordinator.state.job_journal import JobJournal
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.spool import Spool
from spherecal.coordinator.state.store import Store
from spherecal.participant.policy import PolicySettings
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.identity import public_key_bytes


def make_job(
    n: int,
    length: int,
    *,
    threshold: int | None = None,
    bound: float = 10.0,
    chunk_entries: int = 1 << 18,
    stage_s: float = 60.0,
    first_stage_s: float | None = None,
    max_in_flight: int = 2,
    consistency_check: bool = True,
    in_flight_mb: float = 0.0,
    rejoin_s: float = 0.0,
    journal: JobJournal | None = None,
) -> tuple[SecureJob, dict[str, crypto.SecAggParticipant]]:
    ids = [f"p{k}" for k in range(n)]
    identities = {p: crypto.generate_identity() for p in ids}
    keys = {p: public_key_bytes(k) for p, k in identities.items()}
    settings = SecAggSettings(
        threshold=threshold,
        chunk_entries=chunk_entries,
        max_in_flight=max_in_flight,
        consistency_check=consistency_check,
        in_flight_mb=in_flight_mb,  # 0: exactly max_in_flight slots
    )
    job = SecureJob(
        purpose="ffc",
        round_index=None,
        participants=ids,
        identity_keys=keys,
        directory=[pb.DirectoryEntry(participant_id=p, identity_public_key=keys[p]) for p in ids],
        settings=settings,
        length=length,
        bound=bound,
        first_stage_s=stage_s if first_stage_s is None else first_stage_s,
        stage_s=stage_s,
        rejoin_s=rejoin_s,
        journal=journal,
    )
    ledger = crypto.MemoryJobLedger()
    # Each participant gets the directory its instruction carries (its needed entries).
    clients = {
        p: crypto.SecAggParticipant(
            job.spec,
            p,
            identities[p],
            {e.participant_id: e.identity_public_key for e in job.job_message(p).directory},
            ledger=ledger,
        )
        for p in ids
    }
    return job, clients


STAGES = ("advertise", "share", "masked", "consistency", "unmask")


def masked_streams(
    job: SecureJob,
    clients: Mapping[str, crypto.SecAggParticipant],
    inputs: Mapping[str, np.ndarray],
) -> dict[str, Iterator[crypto.MaskedChunk]]:
    """Drive every client through advertise and share; return each one's masked
    chunks, not yet sent (the tests then stream them as they need)."""
    for p, c in clients.items():
        c.set_input(inputs[p])
        job.submit(p, pb.ADVERTISE, c.advertise_keys().to_bytes())
    job.advance(frozenset(clients))
    for p, c in clients.items():
        step = job.step_for(p)
        assert step is not None
        job.submit(p, pb.SHARE, c.share_keys(crypto.KeyRoster.from_bytes(step.message)).to_bytes())
    job.advance(frozenset(clients))
    streams = {}
    for p, c in clients.items():
        step = job.step_for(p)
        assert step is not None
        c.receive_shares(crypto.ShareBundle.from_bytes(step.message))
        streams[p] = c.masked_chunks()
    return streams


def finish_after_masked(
    job: SecureJob, clients: Mapping[str, crypto.SecAggParticipant]
) -> JobOutcome:
    """Close the masked stage (every upload in) and drive the consistency and unmask
    rounds with every client; returns the job's outcome (done)."""
    job.advance(frozenset(clients))
    for stage in (pb.CONSISTENCY, pb.UNMASK):
        for p, c in clients.items():
            step = job.step_for(p)
            assert step is not None and step.stage == stage
            if stage == pb.CONSISTENCY:
                request = crypto.ConsistencyRequest.from_bytes(step.message)
                job.submit(p, stage, c.consistency_signature(request).to_bytes())
            else:
                unmask = crypto.UnmaskRequest.from_bytes(step.message)
                job.submit(p, stage, c.unmask(unmask).to_bytes())
        job.advance(frozenset(clients))
    assert job.outcome is not None and job.outcome.status == "done"
    return job.outcome


def run_job(
    job: SecureJob,
    clients: Mapping[str, crypto.SecAggParticipant],
    inputs: Mapping[str, np.ndarray],
    drop: Mapping[str, str] | None = None,
) -> None:
    """Drive ``job`` to its end; ``drop[p] = stage`` makes p vanish at that stage
    (it never sends that stage's message and counts as disconnected from then on)."""
    drop = dict(drop or {})
    gone: set[str] = set()

    def alive() -> frozenset[str]:
        return frozenset(p for p in clients if p not in gone)

    def vanish(stage: str) -> None:
        gone.update(p for p, s in drop.items() if s == stage)

    for p, client in clients.items():
        client.set_input(inputs[p])
    vanish("advertise")
    for p in alive():
        job.submit(p, pb.ADVERTISE, clients[p].advertise_keys().to_bytes())
    job.advance(alive())
    for stage in STAGES[1:]:
        if job.outcome is not None:
            return
        vanish(stage)
        for p in sorted(alive()):
            step = job.step_for(p)
            if step is None:
                continue
            client = clients[p]
            if stage == "share":
                out = client.share_keys(crypto.KeyRoster.from_bytes(step.message))
                job.submit(p, pb.SHARE, out.to_bytes())
            elif stage == "masked":
                client.receive_shares(crypto.ShareBundle.from_bytes(step.message))
                job.begin_upload(p)
                for chunk in client.masked_chunks():
                    job.absorb(p, chunk.to_bytes())
                assert job.end_upload(p)
            elif stage == "consistency":
                if step.stage != pb.CONSISTENCY:
                    continue
                request = crypto.ConsistencyRequest.from_bytes(step.message)
                job.submit(p, pb.CONSISTENCY, client.consistency_signature(request).to_bytes())
            else:
                response = client.unmask(crypto.UnmaskRequest.from_bytes(step.message))
                job.submit(p, pb.UNMASK, response.to_bytes())
        if stage == "consistency" and not job.spec.consistency_check:
            continue
        job.advance(alive())


def plaintext_federation(
    tmp: Path, model: ModelSettings, training: TrainingSettings, *, n: int = 3
) -> tuple[CoordinatorSettings, list[ParticipantSettings]]:
    """Settings of an in-process plaintext federation on digits slices, FFC only,
    with central test data — the setting that must equal the reference runner."""
    ids = tuple(f"p{k}" for k in range(n))
    cs = CoordinatorSettings(
        participants=ids,
        model=model,
        training=training,
        calibration=CalibrationSettings(methods=("ffc",)),
        secagg=SecAggSettings(updates=False, statistics=False, evaluation=False),
        server=ServerSettings(insecure=True),
        timeouts=Timeouts(
            heartbeat_interval_s=0.2, heartbeat_timeout_s=10, long_poll_s=0.3, linger_s=5
        ),
        evaluation=EvaluationSettings(test_dataset="digits"),
        state_dir=tmp / "state",
        out_dir=tmp / "out",
        example_count_noise_sd=0,  # the reference weights by the exact counts
    )
    ps = [
        ParticipantSettings(
            participant_id=p,
            insecure=True,
            allow_plaintext=True,
            long_poll_ms=300,
            data=DataSettings(slice_index=k, slice_of=n),
            state_dir=tmp / "participants" / p,
            policy=PolicySettings(example_count_noise_sd=0),
        )
        for k, p in enumerate(ids)
    ]
    return cs, ps


def secure_federation(
    tmp: Path, ids: tuple[str, ...], **participant: object
) -> tuple[CoordinatorSettings, list[ParticipantSettings]]:
    """Settings of a one-round in-process federation over secure aggregation (the
    defaults), FFC only, digits slices, fast timeouts; ``participant`` fields (e.g.
    ``privacy``) are set on every participant."""
    cs = CoordinatorSettings(
        participants=ids,
        model=ModelSettings(extractor="mlp"),
        training=TrainingSettings(rounds=1, max_round_attempts=1, local_epochs=1),
        calibration=CalibrationSettings(methods=("ffc",)),
        secagg=SecAggSettings(),
        server=ServerSettings(insecure=True),
        timeouts=Timeouts(
            heartbeat_interval_s=0.2, heartbeat_timeout_s=5, long_poll_s=0.3, linger_s=3
        ),
        state_dir=tmp / "state",
        out_dir=tmp / "out",
    )
    ps = [
        ParticipantSettings(
            participant_id=p,
            insecure=True,
            long_poll_ms=300,
            state_dir=tmp / p,
            data=DataSettings(slice_index=k, slice_of=len(ids)),
            **participant,  # type: ignore[arg-type]
        )
        for k, p in enumerate(ids)
    ]
    return cs, ps


@contextmanager
def stage_context(
    settings: CoordinatorSettings, tmp_path: Path, say: Callable[[str], None] | None = None
) -> Iterator[StageContext]:
    """A driver stage's services over a real Store, Registry (no certificates) and
    Board in ``tmp_path``; the store is closed afterwards."""
    store = Store(tmp_path / "state.db")
    registry = Registry(
        settings.participants,
        store,
        require_certificates=False,
        heartbeat_timeout_s=30,
        clock_skew_s=60,
    )
    try:
        yield StageContext(
            settings=settings,
            store=store,
            registry=registry,
            board=Board(),
            spool=Spool(tmp_path / "spool"),
            progress=Progress(global_vector=np.zeros(1)),
            say=say if say is not None else (lambda _line: None),
        )
    finally:
        store.close()
