"""A step-by-step harness around the real state machines, for tests that need to
intercept, tamper with or reorder individual protocol messages."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from spherecal.crypto import (
    AggregateResult,
    JobSpec,
    MemoryJobLedger,
    SecAggParticipant,
    SecAggServer,
    Stage,
    generate_identity,
    identity_public_bytes,
    keys_needed,
)
from spherecal.crypto.messages import (
    ConsistencySignature,
    KeyRoster,
    ShareBundle,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
)
from spherecal.crypto.policy import SecAggPolicy

MECHANICS_POLICY = SecAggPolicy(
    require_consistency_round=False,
    require_majority_threshold=False,
    min_participants=2,
    min_inputs=2,
)
"""For tests of protocol *mechanics* (routing, dropouts, encodings) on small or
low-threshold jobs that the default policy refuses. Tests of the policy itself pass
``policy=SecAggPolicy()`` (see ``tests/security/test_malicious_coordinator.py``)."""


class Net:
    """A job between real participants and a real server, advanced stage by stage."""

    def __init__(
        self,
        n: int = 4,
        *,
        threshold: int | None = None,
        length: int = 10,
        chunk_size: int = 4,
        graph: str = "complete",
        degree: int | None = None,
        consistency: bool = False,
        min_participants: int | None = None,
        bound: float = 1.0,
        noise_bound: int = 0,
        max_in_flight: int = 2,
        job_id: bytes | None = None,
        seed: int = 0,
        policy: SecAggPolicy = MECHANICS_POLICY,
    ) -> None:
        self.ids = [f"p{i:02d}" for i in range(n)]
        t = threshold if threshold is not None else n // 2 + 1
        self.spec = JobSpec.create(
            self.ids,
            threshold=t,
            length=length,
            bound=bound,
            job_id=job_id,
            min_participants=min_participants,
            graph=graph,
            degree=degree,
            consistency_check=consistency,
            chunk_size=chunk_size,
            noise_bound=noise_bound,
        )
        self.identities = {p: generate_identity() for p in self.ids}
        self.directory = {p: identity_public_bytes(k) for p, k in self.identities.items()}
        self.ledger = MemoryJobLedger()
        # Each participant holds only the keys it needs, as the service sends them.
        self.clients = {
            p: SecAggParticipant(
                self.spec,
                p,
                self.identities[p],
                {q: self.directory[q] for q in keys_needed(self.spec, p)},
                ledger=self.ledger,
                policy=policy,
            )
            for p in self.ids
        }
        self.server = SecAggServer(self.spec, self.directory, max_in_flight=max_in_flight)
        rng = np.random.default_rng(seed)
        self.inputs = {p: rng.uniform(-bound, bound, length) for p in self.ids}
        self.rosters: dict[str, KeyRoster] = {}
        self.share_msgs: dict[str, ShareKeys] = {}
        self.bundles: dict[str, ShareBundle] = {}
        self.signatures: dict[str, ConsistencySignature] = {}
        self.unmask_requests: dict[str, UnmaskRequest] = {}
        self.responses: dict[str, UnmaskResponse] = {}

    # --------------------------------------------------------------- stages
    def advertise(self, skip: Iterable[str] = ()) -> None:
        skip = set(skip)
        for p in self.ids:
            if p not in skip:
                self.server.receive(self.clients[p].advertise_keys(), sender=p)
        self.server.close_stage()

    def share(self, skip: Iterable[str] = ()) -> None:
        skip = set(skip)
        for p in sorted(self.server.advertised):
            self.rosters[p] = self.server.roster_for(p)
            if p not in skip:
                msg = self.clients[p].share_keys(self.rosters[p])
                self.share_msgs[p] = msg
                self.server.receive(msg, sender=p)
        self.server.close_stage()

    def deliver_bundles(self, skip: Iterable[str] = ()) -> None:
        skip = set(skip)
        for p in sorted(self.server.shared):
            self.bundles[p] = self.server.bundle_for(p)
            if p not in skip:
                self.clients[p].receive_shares(self.bundles[p])

    def upload(self, p: str, *, noise: npt.ArrayLike | None = None) -> None:
        client = self.clients[p]
        if not client.has_input:
            client.set_input(self.inputs[p], noise=noise)
        for chunk in client.masked_chunks():
            self.server.receive(chunk, sender=p)

    def masked(self, skip: Iterable[str] = (), *, close: bool = True) -> None:
        skip = set(skip)
        self.deliver_bundles(skip)
        for p in sorted(self.server.shared - skip):
            self.upload(p)
        if close:
            self.server.close_stage()

    def consistency(self, skip: Iterable[str] = ()) -> None:
        skip = set(skip)
        request = self.server.consistency_request()
        for p in sorted(self.server.survivors - skip):
            self.signatures[p] = self.clients[p].consistency_signature(request)
            self.server.receive(self.signatures[p], sender=p)
        self.server.close_stage()

    def unmask(self, skip: Iterable[str] = ()) -> AggregateResult:
        skip = set(skip)
        for p in sorted(self.server.pending()):
            self.unmask_requests[p] = self.server.unmask_request_for(p)
            if p not in skip:
                self.responses[p] = self.clients[p].unmask(self.unmask_requests[p])
                self.server.receive(self.responses[p], sender=p)
        return self.server.finish()

    def run(self, drop: Mapping[str, str] | None = None) -> AggregateResult:
        """Whole protocol; ``drop`` maps an id to the stage whose message it skips."""
        drop = dict(drop or {})

        def at(stage: str) -> set[str]:
            return {p for p, s in drop.items() if s == stage}

        self.advertise(at("advertise"))
        self.share(at("share"))
        self.masked(at("masked"))
        if self.server.stage is Stage.CONSISTENCY:
            self.consistency(at("consistency"))
        return self.unmask(at("unmask") | at("consistency"))

    # --------------------------------------------------------------- checks
    def expected(self, contributors: Iterable[str]) -> npt.NDArray[np.float64]:
        vectors = [self.inputs[p] for p in contributors]
        return np.array([math.fsum(col) for col in zip(*vectors, strict=True)])

    def tolerance(self) -> float:
        return self.spec.n * math.ldexp(1.0, -self.spec.scale_bits)


def flip(data: bytes, index: int = 0) -> bytes:
    """``data`` with one bit flipped."""
    out = bytearray(data)
    out[index] ^= 0x01
    return bytes(out)


def advertised_client(length: int, *, ring_bits: int = 64) -> SecAggParticipant:
    """p0 of a three-participant job (threshold 2, bound 1) past its advertisement:
    the participant alone, for tests of how it holds and encodes its input."""
    ids = ["p0", "p1", "p2"]
    identities = {p: generate_identity() for p in ids}
    directory = {p: identity_public_bytes(k) for p, k in identities.items()}
    spec = JobSpec.create(ids, threshold=2, length=length, bound=1.0, ring_bits=ring_bits)
    client = SecAggParticipant(spec, "p0", identities["p0"], directory)
    client.advertise_keys()
    return client
