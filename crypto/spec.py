"""The job specification every party validates before taking part.

Why a signed-into-everything spec: the coordinator chooses the threshold, the graph,
the scale and the participant list. If it could show different values to different
participants it could, e.g., give one participant ``t = 1``. So the canonical bytes
of the spec are hashed into every signature, KDF salt and share commitment: parties
that were shown different specs derive unrelated keys and reject each other's
signatures, and the job fails instead of leaking.

Invariants checked on construction (including from bytes):

* ``2 <= t <= `` the smallest share-holder set (``n`` for the complete graph,
  ``k+1`` for Harary): ``t = 1`` would let any single holder rebuild a secret.
* ``2 <= min_participants <= n``: an aggregate of one input *is* that input.
* ``n * (ceil(B * 2^f) + noise_bound) <= 2^(w-1) - 1`` for the job's ring width ``w``
  (32 or 64): the sum cannot wrap (:mod:`spherecal.crypto.ring`);
* ``chunk_size * w/8`` is a multiple of 16: every chunk starts on an AES block.

* ``context`` is empty or 32 bytes: the digest of the task the job serves
  (:mod:`spherecal.proto.task_context` — the model and every other input each member
  computes its input from). Hashed into everything like the rest of the spec, it
  makes the members of one job compute on one model: a coordinator that sent the
  target a real model and everyone else a model whose update or statistics it knows
  (Pasquini et al. 2022, "model inconsistency") would have to show them different
  specs, and they would reject each other's signatures.

Versions: version 2 (issue #24) added the ring width and the v2 mask keystream
(:mod:`spherecal.crypto.prg`: 96-bit nonce, 32-bit counter from 2, the GCM keystream);
version 3 (2026-11-27) the task context. Older specs and messages are refused with a
message that says so: a v1 party would expand different masks, and the sum would be
garbage; a v2 party would not bind the job to its task.
* with ``consistency_check`` (the active-adversary variant of Bonawitz et al. 2017,
  round 3 "ConsistencyCheck"), ``2t >`` the largest share-holder set: otherwise a malicious
  coordinator could split the honest holders of one participant's shares into two
  groups, each with ``t`` signatures on a different survivor set, and obtain both of
  that participant's secrets.
"""

from __future__ import annotations

import hashlib
import math
import operator
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from spherecal.crypto import native
from spherecal.crypto._codec import MAX_ID_BYTES, Reader, Writer
from spherecal.crypto._exceptions import InvalidSpec, MalformedMessage, UnknownParticipant
from spherecal.crypto.graph import (
    COMPLETE,
    GRAPH_KINDS,
    HARARY,
    Graph,
    max_closed_size,
    min_closed_size,
)
from spherecal.crypto.ring import (
    MAX_SCALE_BITS,
    RING_WIDTHS,
    choose_ring,
    choose_scale_bits,
    ring_dtype,
    sum_fits,
)

MAGIC = b"SCSA"
VERSION = 3
RETIRED_VERSIONS = {
    1: "AES-CTR with a 128-bit counter keystream and a 64-bit ring only",
    2: "job specs not bound to the task they serve",
}
CONTEXT_BYTES = 32
TYPE_JOB_SPEC = 0x01

DEFAULT_CHUNK_ENTRIES = 1 << 15  # 256 KiB of uint64: stays in L2 next to its keystream tile
MAX_CHUNK_ENTRIES = 1 << 24
MAX_JOB_ID_BYTES = 64
MAX_PARTICIPANTS = 1 << 16
MAX_LENGTH = 1 << 40

__all__ = ["DEFAULT_CHUNK_ENTRIES", "JobSpec", "default_degree", "keys_needed"]


def default_degree(n: int, threshold: int) -> int:
    """A Harary degree for ``n`` participants: ``~2 log2 n`` (Bell et al. 2020 use
    ``O(log n)``), at least ``t - 1`` so ``t`` holders exist, at most ``n - 1``."""
    return max(2, min(n - 1, max(threshold - 1, 2 * math.ceil(math.log2(max(n, 2))))))


def _check_id(pid: object) -> str:
    if not isinstance(pid, str) or not pid:
        raise InvalidSpec("participant ids must be non-empty strings")
    if len(pid.encode("utf-8")) > MAX_ID_BYTES or not pid.isprintable():
        raise InvalidSpec(f"participant id {pid[:40]!r} is too long or not printable")
    return pid


def _check_ids(ids: tuple[object, ...]) -> None:
    """:func:`_check_id` on every id, in a few C-level passes when they are printable
    ASCII (the spec is read and validated by every participant: O(n) per participant,
    so its constant matters at n in the thousands); any other case id by id, for the
    same errors."""
    if set(map(type, ids)) == {str}:
        strs: tuple[str, ...] = ids  # type: ignore[assignment]
        joined = "".join(strs)
        # ASCII: characters are bytes, so the longest id in bytes is the longest in len
        if (
            strs
            and joined.isascii()
            and joined.isprintable()
            and min(map(len, strs)) > 0
            and max(map(len, strs)) <= MAX_ID_BYTES
        ):
            return
    for pid in ids:
        _check_id(pid)


@dataclass(frozen=True)
class JobSpec:
    """Parameters of one secure-aggregation job. Build with :meth:`create`."""

    job_id: bytes
    participants: tuple[str, ...]
    threshold: int
    min_participants: int
    length: int
    scale_bits: int
    bound: float
    graph: str = COMPLETE
    degree: int = 0
    consistency_check: bool = False
    chunk_size: int = DEFAULT_CHUNK_ENTRIES
    noise_bound: int = 0
    ring_bits: int = 64
    context: bytes = b""
    """The digest of the task this job serves (:mod:`spherecal.proto.task_context`),
    or empty for a job outside the service (benchmarks, the crypto layer's tests);
    a participant refuses a job whose context is not its task's."""

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        participants: Iterable[str],
        *,
        threshold: int,
        length: int,
        bound: float,
        job_id: bytes | str | None = None,
        min_participants: int | None = None,
        scale_bits: int | None = None,
        graph: str = COMPLETE,
        degree: int | None = None,
        consistency_check: bool | None = None,
        chunk_size: int = DEFAULT_CHUNK_ENTRIES,
        noise_bound: int = 0,
        ring_bits: int = 64,
        resolution: float | None = None,
        context: bytes = b"",
    ) -> JobSpec:
        """Fill in defaults: a fresh random 16-byte job id, ``min_participants = t``,
        the finest overflow-safe scale, ``degree = n - 1`` (complete) or
        :func:`default_degree` (Harary), and the consistency round whenever the
        threshold allows it (``2t >`` share holders) — participants' default policy
        (:mod:`spherecal.crypto.policy`) refuses jobs without it.

        ``resolution`` (with ``scale_bits`` left to choose) picks the ring by
        :func:`spherecal.crypto.ring.choose_ring`: 32 bits when a step ``2^-f <=
        resolution`` fits, else 64 (``chunk_size`` rounded up to whole AES blocks of the
        chosen ring); without it the ring is ``ring_bits`` (default 64)."""
        ids = tuple(sorted(participants))
        n = len(ids)
        if job_id is None:
            job_id_bytes = secrets.token_bytes(16)
        elif isinstance(job_id, str):
            job_id_bytes = job_id.encode("utf-8")
        else:
            job_id_bytes = bytes(job_id)
        if degree is None:
            degree = n - 1 if graph == COMPLETE else default_degree(n, threshold)
        if scale_bits is None:
            if n < 2:
                raise InvalidSpec(f"secure aggregation needs at least 2 participants, got {n}")
            if resolution is not None:
                choice = choose_ring(
                    n, float(bound), resolution=resolution, noise_bound=noise_bound
                )
                ring_bits, scale_bits = choice.ring_bits, choice.scale_bits
                per_block = 128 // ring_bits  # the chosen ring's chunks: whole AES blocks
                chunk_size = -(-chunk_size // per_block) * per_block
            else:
                scale_bits = choose_scale_bits(n, float(bound), noise_bound, ring_bits)
        if consistency_check is None:
            consistency_check = 2 * threshold > max_closed_size(graph, n, degree)

        return cls(
            job_id=job_id_bytes,
            participants=ids,
            threshold=threshold,
            min_participants=threshold if min_participants is None else min_participants,
            length=length,
            scale_bits=scale_bits,
            bound=float(bound),
            graph=graph,
            degree=degree,
            consistency_check=consistency_check,
            chunk_size=chunk_size,
            noise_bound=noise_bound,
            ring_bits=ring_bits,
            context=context,
        )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every invariant (module docstring); raises :class:`InvalidSpec`.

        Runs on construction; the state machines run it again before use."""
        if not isinstance(self.job_id, bytes) or not 1 <= len(self.job_id) <= MAX_JOB_ID_BYTES:
            raise InvalidSpec(f"job_id must be 1..{MAX_JOB_ID_BYTES} bytes")
        ids = self.participants
        if not isinstance(ids, tuple):
            raise InvalidSpec("participants must be a tuple of ids")
        helper = native.CODEC
        if helper is None or not helper.sorted_ids(ids, MAX_ID_BYTES, True):
            # the checks the native helper makes in one pass, each with its error
            _check_ids(ids)
            # strictly increasing ⇔ sorted and unique: one C-level pass, not a sort
            # (the spec is validated by every participant, O(n) each; issue #24)
            if not all(map(operator.lt, ids, ids[1:])):
                raise InvalidSpec("participant ids must be unique and sorted")
        n = len(ids)
        if not 2 <= n <= MAX_PARTICIPANTS:
            raise InvalidSpec(
                f"secure aggregation needs 2..{MAX_PARTICIPANTS} participants, got {n}"
            )
        if self.graph not in GRAPH_KINDS:
            raise InvalidSpec(f"graph must be one of {GRAPH_KINDS}, got {self.graph!r}")
        if self.graph == COMPLETE and self.degree != n - 1:
            raise InvalidSpec(f"the complete graph on {n} participants has degree {n - 1}")
        if self.graph == HARARY and not 2 <= self.degree <= n - 1:
            raise InvalidSpec(f"Harary degree must be in 2..{n - 1}, got {self.degree}")
        smallest = min_closed_size(self.graph, n, self.degree)
        largest = max_closed_size(self.graph, n, self.degree)
        if not 2 <= self.threshold <= smallest:
            raise InvalidSpec(
                f"threshold must be in 2..{smallest} (the smallest share-holder set), "
                f"got {self.threshold}"
            )
        if not 2 <= self.min_participants <= n:
            raise InvalidSpec(f"min_participants must be in 2..{n}, got {self.min_participants}")
        if self.consistency_check and 2 * self.threshold <= largest:
            raise InvalidSpec(
                f"consistency_check needs 2*t > {largest} (share holders per participant) so "
                f"that no two survivor sets can each gather t signatures; got t={self.threshold}"
            )
        if not 1 <= self.length <= MAX_LENGTH:
            raise InvalidSpec(f"vector length must be in 1..{MAX_LENGTH}, got {self.length}")
        if self.ring_bits not in RING_WIDTHS:
            raise InvalidSpec(f"ring_bits must be one of {RING_WIDTHS}, got {self.ring_bits!r}")
        per_block = 128 // self.ring_bits
        if not (
            per_block <= self.chunk_size <= MAX_CHUNK_ENTRIES and self.chunk_size % per_block == 0
        ):
            raise InvalidSpec(
                f"chunk_size must be a multiple of {per_block} (16-byte AES blocks of "
                f"{self.ring_bits}-bit entries) in {per_block}..{MAX_CHUNK_ENTRIES}, "
                f"got {self.chunk_size}"
            )
        if not (isinstance(self.bound, float) and math.isfinite(self.bound) and self.bound > 0):
            raise InvalidSpec(f"bound must be a positive finite float, got {self.bound!r}")
        if not isinstance(self.context, bytes) or len(self.context) not in (0, CONTEXT_BYTES):
            raise InvalidSpec(f"context must be empty or {CONTEXT_BYTES} bytes (a task digest)")
        if not isinstance(self.noise_bound, int) or self.noise_bound < 0:
            raise InvalidSpec("noise_bound must be a non-negative integer")
        if not 0 <= self.scale_bits <= MAX_SCALE_BITS:
            raise InvalidSpec(f"scale_bits must be in 0..{MAX_SCALE_BITS}, got {self.scale_bits}")
        if not sum_fits(n, self.bound, self.scale_bits, self.noise_bound, self.ring_bits):
            raise InvalidSpec(
                f"scale 2^{self.scale_bits} with |x| <= {self.bound!r}, noise bound "
                f"{self.noise_bound} and {n} participants could overflow the "
                f"{self.ring_bits}-bit ring; lower scale_bits or the bound"
            )

    # ----------------------------------------------------------------- derived
    @property
    def n(self) -> int:
        return len(self.participants)

    @property
    def dtype(self) -> np.dtype[np.unsignedinteger]:
        """The ring's word: ``<u4`` or ``<u8``."""
        return ring_dtype(self.ring_bits)

    @property
    def entry_bytes(self) -> int:
        return self.ring_bits // 8

    @property
    def n_chunks(self) -> int:
        return -(-self.length // self.chunk_size)

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """Entry range ``[start, stop)`` of chunk ``index``."""
        if not 0 <= index < self.n_chunks:
            raise IndexError(f"chunk index {index} out of range 0..{self.n_chunks - 1}")
        start = index * self.chunk_size
        return start, min(start + self.chunk_size, self.length)

    @cached_property
    def digest(self) -> bytes:
        """SHA-256 of the canonical bytes: the job context of every signature/KDF."""
        return hashlib.sha256(self.to_bytes()).digest()

    @cached_property
    def masking_graph(self) -> Graph:
        """The masking graph (computed once per spec object)."""
        return Graph(self.participants, self.graph, self.degree, self.job_id)

    # ----------------------------------------------------------------- encoding
    def to_bytes(self) -> bytes:
        w = Writer().raw(MAGIC).u8(VERSION).u8(TYPE_JOB_SPEC)
        w.blob(self.job_id).texts(self.participants)
        w.u32(self.threshold).u32(self.min_participants).u64(self.length)
        w.u8(self.scale_bits).f64(self.bound).text(self.graph).u32(self.degree)
        w.boolean(self.consistency_check).u32(self.chunk_size).u64(self.noise_bound)
        w.u8(self.ring_bits).blob(self.context)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> JobSpec:
        r = Reader(data)
        if r.raw(4) != MAGIC:
            raise MalformedMessage("not a spherecal secagg job spec (bad magic)")
        version = r.u8()
        if version in RETIRED_VERSIONS:
            raise MalformedMessage(
                f"secagg job spec version {version} ({RETIRED_VERSIONS[version]}) is no "
                f"longer supported; this party speaks version {VERSION} (the 96-bit-nonce "
                "mask keystream, a per-job ring width and the task context): upgrade the "
                "other side"
            )
        if version != VERSION or r.u8() != TYPE_JOB_SPEC:
            raise MalformedMessage(f"not a spherecal secagg v{VERSION} job spec")
        job_id = r.blob(max_len=MAX_JOB_ID_BYTES)
        participants = r.texts()
        threshold, min_p, length = r.u32(), r.u32(), r.u64()
        scale_bits, bound, graph, degree = r.u8(), r.f64(), r.text(), r.u32()
        consistency, chunk, noise = r.boolean(), r.u32(), r.u64()
        ring_bits = r.u8()
        context = r.blob(max_len=CONTEXT_BYTES)
        r.finish()
        spec = cls(
            job_id=job_id,
            participants=participants,
            threshold=threshold,
            min_participants=min_p,
            length=length,
            scale_bits=scale_bits,
            bound=bound,
            graph=graph,
            degree=degree,
            consistency_check=consistency,
            chunk_size=chunk,
            noise_bound=noise,
            ring_bits=ring_bits,
            context=context,
        )
        # The reader accepts one encoding per value and the constructor only checks, so
        # these bytes are what to_bytes() would give: the digest needs no re-encoding
        # (every site decodes the spec; issue #24). Tested for both graphs and rings.
        spec.__dict__["digest"] = hashlib.sha256(data).digest()
        return spec


def keys_needed(spec: JobSpec, participant: str) -> frozenset[str]:
    """The participants whose identity keys ``participant`` needs in ``spec``'s job:
    exactly those whose signatures it checks.

    * itself (its own directory entry must match its identity key);
    * its masking-graph neighbours ``N(u)``: the roster's key advertisements are those
      of its share holders ``N(u) ∪ {u}`` among ``U1``, each checked against its
      sender's pinned key (:func:`spherecal.crypto.policy.check_roster_keys`);
    * with ``consistency_check``, the share holders of every owner whose shares it
      holds — its closed 2-hop neighbourhood (:meth:`Graph.closed_two_hop`) — whose
      survivor-set signatures :func:`spherecal.crypto.consistency.verify_signed_view` counts.

    The complete graph: everyone. A Harary graph: O(k) of the n participants, so the
    identity directory a participant receives and verifies (under TLS one certificate
    per entry) stops growing with n (Bell et al. 2020 bound each client's work by its
    neighbourhood; this is the directory's share of that)."""
    graph = spec.masking_graph
    if participant not in graph:
        raise UnknownParticipant(f"{participant!r} is not a participant of this job")
    if spec.consistency_check:
        return graph.closed_two_hop(participant)
    return graph.closed(participant)
