"""Run the whole protocol in-process between real state machines (tests, demos, bench).

Every message goes through its canonical bytes (``to_bytes`` → ``decode``), exactly
as the service will carry it, so a simulation exercises the encodings, the
signatures, the share encryption and every check of both state machines. Nothing
is shortcut: the server learns only what it would learn over the network.

Randomness: keys, masks, seeds, nonces and job ids always come from ``os.urandom``.
``seed`` (``rng``) only shuffles the order in which the simulated network delivers
messages to the coordinator, to show the result does not depend on it.
"""

from __future__ import annotations

import random
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from spherecal.crypto._exceptions import WrongLength
from spherecal.crypto.graph import COMPLETE, HARARY, max_closed_size
from spherecal.crypto.keys import generate_identity, identity_public_bytes
from spherecal.crypto.messages import (
    ConsistencyRequest,
    KeyRoster,
    Message,
    ShareBundle,
    UnmaskRequest,
    decode_message,
)
from spherecal.crypto.participant import SecAggParticipant
from spherecal.crypto.policy import SecAggPolicy
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.crypto.server import AggregateResult, SecAggServer, Stage
from spherecal.crypto.spec import JobSpec, default_degree, keys_needed

T = TypeVar("T")

DROP_STAGES = ("advertise", "share", "masked", "consistency", "unmask")
"""Where a participant can vanish: the stage whose message it never sends."""

__all__ = ["DROP_STAGES", "SimulationReport", "parse_graph", "run_protocol", "simulate_secure_sum"]


@dataclass
class SimulationReport:
    """Result plus what a test or benchmark wants to look at."""

    spec: JobSpec
    result: AggregateResult
    upload_bytes: dict[str, int]
    """Bytes each participant sent (all messages, canonical encodings)."""
    mask_seconds: dict[str, float]
    """Per uploader: wall time to produce all its masked chunks."""
    server_unmask_seconds: float
    protocol_seconds: float
    input_seconds: dict[str, float] = field(default_factory=dict)
    """Per uploader: float vector to upload bytes — ``set_input`` (range check, encoding),
    every ``masked_chunk`` and its canonical ``to_bytes``."""
    mask_cpu_seconds: dict[str, float] = field(default_factory=dict)
    """:attr:`mask_seconds` by this thread's CPU time (free of waiting for a core)."""
    input_cpu_seconds: dict[str, float] = field(default_factory=dict)
    """:attr:`input_seconds` by this thread's CPU time."""
    input_minor_faults: dict[str, int] = field(default_factory=dict)
    """Per uploader: minor page faults of this thread over the same calls as
    :attr:`input_seconds` (fresh pages written first; ``-1`` where the OS cannot count
    one thread's faults)."""
    prepare_seconds: dict[str, float] = field(default_factory=dict)
    """Per participant that prepared its input's buffer (``prepare_input=True``): wall
    time of :meth:`~spherecal.crypto.participant.SecAggParticipant.prepare_input` — the
    page faults of a new buffer, moved off :attr:`input_seconds` to a moment the
    participant waits; counted in :attr:`participant_seconds`, not in the input's."""
    prepare_cpu_seconds: dict[str, float] = field(default_factory=dict)
    """:attr:`prepare_seconds` by this thread's CPU time."""
    prepare_minor_faults: dict[str, int] = field(default_factory=dict)
    """Minor page faults of this thread in the same calls (``-1`` where not counted)."""
    participant_seconds: dict[str, float] = field(default_factory=dict)
    """Per participant: wall time inside its own calls over the whole job (every round,
    message encoding included) — the participant's cost, without the server's."""
    participant_cpu_seconds: dict[str, float] = field(default_factory=dict)
    """The same calls timed by this thread's CPU time: on a shared machine the wall clock
    also counts the time the process waits for a core, the CPU time does not."""
    received: list[tuple[str, Message]] = field(default_factory=list, repr=False)
    """Every message the coordinator received, in order (when ``record=True``)."""


_COUNTS_THREAD_FAULTS = hasattr(resource, "RUSAGE_THREAD")


def _thread_minor_faults() -> int:
    """This thread's minor page faults so far (Linux); 0 where it cannot be counted."""
    if not _COUNTS_THREAD_FAULTS:
        return 0
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def run_protocol(
    spec: JobSpec,
    inputs: Mapping[str, npt.ArrayLike],
    *,
    drop: Mapping[str, str] | None = None,
    noise: Mapping[str, npt.ArrayLike] | None = None,
    rng: random.Random | None = None,
    max_in_flight: int = 2,
    record: bool = False,
    policy: SecAggPolicy | None = None,
    full_directory: bool = False,
    prepare_input: bool = False,
    site_costs: bool = False,
) -> SimulationReport:
    """Run one job. ``inputs`` maps every participant id to its vector; ``drop`` maps
    an id to the stage whose message it never sends (:data:`DROP_STAGES`).

    Each participant gets only the identity keys it needs
    (:func:`spherecal.crypto.spec.keys_needed`),
    as the service sends them; ``full_directory`` gives every participant all ``n``
    (the result must be the same). ``prepare_input`` has each participant call
    :meth:`~spherecal.crypto.participant.SecAggParticipant.prepare_input` where the
    service does (right after its share answer, before the masked stage), timed apart
    (:attr:`SimulationReport.prepare_seconds`).

    ``site_costs`` has each participant decode its own copy of the job spec and of
    every message addressed to it inside its timed calls, as a site of the service
    does: otherwise the in-process participants share one spec object, whose masking
    graph and digest are then built once for all of them, and their messages are
    decoded outside their timed calls — O(n) work in nobody's figure (issue #24's
    per-participant cost at n = 500 and 1000 is measured with ``site_costs``).

    Raises whatever the protocol raises (e.g. :class:`TooFewSurvivors`); a refusal by
    a participant propagates too. ``policy`` is every participant's privacy policy
    (default: the safe :class:`~spherecal.crypto.policy.SecAggPolicy`).
    """
    drop = dict(drop or {})
    for pid, stage in drop.items():
        if stage not in DROP_STAGES:
            raise ValueError(f"unknown drop stage {stage!r} for {pid!r}; use one of {DROP_STAGES}")
        if pid not in spec.participants:
            raise ValueError(f"cannot drop {pid!r}: not a participant")
    if set(inputs) != set(spec.participants):
        raise ValueError("inputs must have exactly one vector per participant")
    if not spec.consistency_check:
        drop = {p: ("unmask" if s == "consistency" else s) for p, s in drop.items()}
    rng = rng or random.Random()
    noise = noise or {}

    identities = {p: generate_identity() for p in spec.participants}
    directory = {p: identity_public_bytes(k) for p, k in identities.items()}
    ledger = MemoryJobLedger()
    upload = dict.fromkeys(spec.participants, 0)
    received: list[tuple[str, Message]] = []
    mask_seconds: dict[str, float] = {}
    input_seconds: dict[str, float] = {}
    mask_cpu: dict[str, float] = {}
    input_cpu: dict[str, float] = {}
    input_faults: dict[str, int] = {}
    prepare_s: dict[str, float] = {}
    prepare_cpu: dict[str, float] = {}
    prepare_faults: dict[str, int] = {}
    spent: dict[str, float] = {}
    cpu: dict[str, float] = {}

    def timed(pid: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            spent[pid] = spent.get(pid, 0.0) + time.perf_counter() - t0
            cpu[pid] = cpu.get(pid, 0.0) + time.thread_time() - c0

    started = time.perf_counter()
    server = SecAggServer(spec, directory, max_in_flight=max_in_flight)
    spec_bytes = spec.to_bytes()

    def own_spec(pid: str) -> JobSpec:
        return timed(pid, JobSpec.from_bytes, spec_bytes) if site_costs else spec

    def read(pid: str, decode: Callable[[bytes], T], data: bytes) -> T:
        """``pid`` decodes a message addressed to it: counted as its cost with
        ``site_costs``."""
        return timed(pid, decode, data) if site_costs else decode(data)

    clients = {
        p: timed(
            p,
            SecAggParticipant,
            own_spec(p),
            p,
            identities[p],
            directory if full_directory else {q: directory[q] for q in keys_needed(spec, p)},
            ledger=ledger,
            policy=policy,
        )
        for p in spec.participants
    }

    def send(pid: str, message: Message | bytes) -> None:
        data = message if isinstance(message, bytes) else timed(pid, message.to_bytes)
        upload[pid] += len(data)
        decoded = decode_message(data)
        if record:
            received.append((pid, decoded))
        server.receive(decoded, sender=pid)

    def shuffled(ids: frozenset[str] | Sequence[str]) -> list[str]:
        order = sorted(ids)
        rng.shuffle(order)
        return order

    def alive(pid: str, stage: str) -> bool:
        """Whether ``pid`` still sends its message of ``stage``."""
        dropped_at = drop.get(pid)
        return dropped_at is None or DROP_STAGES.index(dropped_at) > DROP_STAGES.index(stage)

    # Round 0: advertise keys.
    for pid in shuffled(spec.participants):
        if alive(pid, "advertise"):
            send(pid, timed(pid, clients[pid].advertise_keys))
    server.close_stage()

    # Round 1: rosters out, encrypted shares in.
    for pid in shuffled(server.advertised):
        if alive(pid, "share"):
            roster = read(pid, KeyRoster.from_bytes, server.roster_for(pid).to_bytes())
            send(pid, timed(pid, clients[pid].share_keys, roster))
            if prepare_input:
                f0 = _thread_minor_faults()
                t0, c0 = time.perf_counter(), time.thread_time()
                timed(pid, clients[pid].prepare_input)
                prepare_s[pid] = time.perf_counter() - t0
                prepare_cpu[pid] = time.thread_time() - c0
                prepare_faults[pid] = _thread_minor_faults() - f0 if _COUNTS_THREAD_FAULTS else -1
    server.close_stage()

    # Round 2: share bundles out, masked inputs streamed in.
    for pid in shuffled(server.shared):
        if not alive(pid, "masked"):
            continue
        client = clients[pid]
        bundle = read(pid, ShareBundle.from_bytes, server.bundle_for(pid).to_bytes())
        timed(pid, client.receive_shares, bundle)
        f_in = _thread_minor_faults()
        t_in, c_in = time.perf_counter(), time.thread_time()
        client.set_input(inputs[pid], noise=noise.get(pid))
        setting = time.perf_counter() - t_in
        used = time.thread_time() - c_in
        faults = _thread_minor_faults() - f_in
        elapsed = serialising = masking = 0.0
        for index in range(spec.n_chunks):
            f0 = _thread_minor_faults()
            t0, c0 = time.perf_counter(), time.thread_time()
            chunk = client.masked_chunk(index)
            t1, c1 = time.perf_counter(), time.thread_time()
            data = chunk.to_bytes()
            t2 = time.perf_counter()
            used += time.thread_time() - c0
            faults += _thread_minor_faults() - f0
            masking += c1 - c0
            elapsed += t1 - t0
            serialising += t2 - t1
            send(pid, data)
        mask_seconds[pid] = elapsed
        input_seconds[pid] = setting + elapsed + serialising
        mask_cpu[pid], input_cpu[pid] = masking, used
        input_faults[pid] = faults if _COUNTS_THREAD_FAULTS else -1
        spent[pid] = spent.get(pid, 0.0) + input_seconds[pid]
        cpu[pid] = cpu.get(pid, 0.0) + used
    server.close_stage()

    # Round 3 (optional): signatures over the survivor set.
    if server.stage is Stage.CONSISTENCY:
        request = server.consistency_request().to_bytes()
        for pid in shuffled(server.survivors):
            if alive(pid, "consistency"):
                mine = read(pid, ConsistencyRequest.from_bytes, request)
                send(pid, timed(pid, clients[pid].consistency_signature, mine))
        server.close_stage()

    # Round 4: unmask.
    for pid in shuffled(server.pending()):
        if alive(pid, "unmask"):
            unmask = read(pid, UnmaskRequest.from_bytes, server.unmask_request_for(pid).to_bytes())
            send(pid, timed(pid, clients[pid].unmask, unmask))
    t0 = time.perf_counter()
    result = server.finish()
    finished = time.perf_counter()
    return SimulationReport(
        spec=spec,
        result=result,
        upload_bytes=upload,
        mask_seconds=mask_seconds,
        input_seconds=input_seconds,
        mask_cpu_seconds=mask_cpu,
        input_cpu_seconds=input_cpu,
        input_minor_faults=input_faults,
        prepare_seconds=prepare_s,
        prepare_cpu_seconds=prepare_cpu,
        prepare_minor_faults=prepare_faults,
        participant_seconds=spent,
        participant_cpu_seconds=cpu,
        server_unmask_seconds=finished - t0,
        protocol_seconds=finished - started,
        received=received,
    )


def parse_graph(graph: str, n: int, threshold: int) -> tuple[str, int]:
    """``"complete"``, ``"harary"`` (degree ~2 log2 n) or ``"harary:K"`` -> (kind, degree)."""
    if graph == COMPLETE:
        return COMPLETE, n - 1
    if graph == HARARY:
        return HARARY, default_degree(n, threshold)
    if graph.startswith(HARARY + ":"):
        try:
            return HARARY, int(graph.split(":", 1)[1])
        except ValueError:
            pass
    raise ValueError(f"graph must be 'complete', 'harary' or 'harary:K', got {graph!r}")


def simulate_secure_sum(
    vectors: Sequence[npt.ArrayLike] | npt.NDArray[np.float64],
    *,
    threshold: int,
    drop: Mapping[int, str] | None = None,
    scale_bits: int | None = None,
    seed: int | None = None,
    graph: str = "complete",
    policy: SecAggPolicy | None = None,
) -> npt.NDArray[np.float64]:
    """Securely sum ``vectors`` (one per participant) in-process; return the float64 sum
    of the vectors whose masked input made it into the aggregate.

    ``drop`` maps a participant *index* to the stage whose message it never sends:
    ``"advertise"``, ``"share"``, ``"masked"``, ``"consistency"`` or ``"unmask"``. A
    participant dropped at ``"unmask"`` (or ``"consistency"``) sent its masked input,
    so its vector is in the sum; one dropped earlier is not. The value bound is the
    largest ``|x|`` in the data; ``scale_bits`` defaults to the finest overflow-safe
    scale. The signed consistency-check round runs whenever the threshold is high
    enough for it to be meaningful (``2t`` > share holders per participant); the
    participants' default ``policy`` refuses lower thresholds and fewer than three
    participants or inputs (pass a relaxed :class:`~spherecal.crypto.policy.SecAggPolicy` to
    allow them). ``seed`` only fixes the simulated delivery order — never keys or masks.

    Raises the protocol's typed errors, e.g. :class:`TooFewSurvivors` when fewer than
    ``threshold`` participants remain.
    """
    arrays = [np.asarray(v, dtype=np.float64) for v in vectors]
    if not arrays:
        raise WrongLength("no vectors to sum")
    length = arrays[0].shape[0] if arrays[0].ndim == 1 else -1
    if length <= 0 or any(a.ndim != 1 or a.shape[0] != length for a in arrays):
        raise WrongLength("vectors must be non-empty 1-D arrays of equal length")
    n = len(arrays)
    width = len(str(n - 1))
    ids = [f"p{i:0{width}d}" for i in range(n)]
    finite = [np.abs(a[np.isfinite(a)]) for a in arrays]
    bound = max((float(f.max()) for f in finite if f.size), default=0.0) or 1.0
    kind, degree = parse_graph(graph, n, threshold)
    consistency = 2 * threshold > max_closed_size(kind, n, degree)
    spec = JobSpec.create(
        ids,
        threshold=threshold,
        length=length,
        bound=bound,
        scale_bits=scale_bits,
        graph=kind,
        degree=degree,
        consistency_check=consistency,
    )
    drops: dict[str, str] = {}
    for index, stage in (drop or {}).items():
        if not 0 <= index < n:
            raise ValueError(f"drop index {index} out of range 0..{n - 1}")
        drops[ids[index]] = stage
    report = run_protocol(
        spec,
        dict(zip(ids, arrays, strict=True)),
        drop=drops,
        rng=random.Random(seed),
        policy=policy,
    )
    return report.result.values
