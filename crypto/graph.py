"""Masking graphs: the complete graph, or a Harary ``k``-regular graph (SecAgg+).

Why a sparse graph (Bell et al. 2020, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead"): with the complete graph each participant expands ``n``
masks and holds ``n`` shares, so cost grows as ``O(n)`` per participant and
``O(n^2)`` for the coordinator's recovery. Bell et al. mask only along the edges of a
sparse random graph of degree ``O(log n)``; the sum is still hidden as long as the
survivors' graph stays connected.

Why Harary: ``H_{k,n}`` is the sparsest ``k``-vertex-connected graph — removing any
``k-1`` participants leaves it connected — so up to ``k-1`` dropouts can never split
the survivors into groups whose partial sums the coordinator would learn. (Bell et
al. use a random graph, connected after dropouts with high probability; Harary's
graph is connected by construction.) When
more drop, both sides check that every connected component of the survivor graph
has at least ``min_participants`` members (see :meth:`Graph.components`).

Vertex order: participants are placed on the Harary cycle in the order of
``SHA-256(job id, participant id)``, so neighbourhoods change from job to job and
both sides compute them from the job spec alone. (A coordinator that chooses job
ids could grind for an order; Bell et al.'s random-graph argument assumes it
cannot — see ``docs/threat_model.md``.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from spherecal.crypto import native
from spherecal.crypto._codec import context_text, encode_context
from spherecal.crypto.kdf import LABEL

COMPLETE = "complete"
HARARY = "harary"
GRAPH_KINDS = (COMPLETE, HARARY)

__all__ = ["COMPLETE", "GRAPH_KINDS", "HARARY", "Graph", "harary_edges", "harary_neighbours"]


def harary_edges(n: int, k: int) -> set[tuple[int, int]]:
    """Edges ``(i, j), i < j`` of Harary's graph ``H_{k,n}`` on vertices ``0..n-1``.

    * ``k`` even: ``i ~ i ± j (mod n)`` for ``j = 1..k/2``;
    * ``k`` odd, ``n`` even: additionally ``i ~ i + n/2`` (diameters);
    * ``k`` odd, ``n`` odd: additionally ``i ~ i + (n+1)/2`` for ``i = 0..(n-1)/2``
      (one vertex then has degree ``k+1``).
    """
    if not 1 <= k < n:
        raise ValueError(f"Harary graph needs 1 <= k < n, got k={k}, n={n}")
    edges: set[tuple[int, int]] = set()

    def add(a: int, b: int) -> None:
        a, b = a % n, b % n
        if a != b:
            edges.add((min(a, b), max(a, b)))

    for i in range(n):
        for j in range(1, k // 2 + 1):
            add(i, i + j)
    if k % 2:
        if n % 2 == 0:
            for i in range(n // 2):
                add(i, i + n // 2)
        else:
            for i in range((n - 1) // 2 + 1):
                add(i, i + (n + 1) // 2)
    return edges


def _order_head(job_id: bytes) -> bytes:
    """The bytes every order key's context starts with: ``encode_context(LABEL,
    "graph-order", job_id, p)`` is this followed by ``context_text(p)``."""
    full = encode_context(LABEL, "graph-order", job_id, "")
    return full[: len(full) - len(context_text(""))]


def _order_keys(job_id: bytes) -> Callable[[str], bytes]:
    """The sort key of the Harary cycle: ``SHA-256(encode_context(LABEL, "graph-order",
    job_id, p))`` per participant ``p``, with the context's common head hashed once and
    copied (every party orders all ``n``: the one O(n) step of its graph)."""
    head = hashlib.sha256(_order_head(job_id))

    def key(p: str) -> bytes:
        h = head.copy()
        h.update(context_text(p))
        return h.digest()

    return key


def _cycle_order(participants: tuple[str, ...], job_id: bytes) -> tuple[str, ...]:
    """``participants`` (sorted) in the order of their :func:`_order_keys`; equal keys
    keep the sorted order, as ``sorted(..., key=...)`` does. The native helper
    (:data:`spherecal.crypto.native.CODEC`) hashes the keys through OpenSSL with the
    head hashed once (issue #24: the one O(n) step of a site's graph); tested equal."""
    helper = native.CODEC
    if helper is None:
        return tuple(sorted(participants, key=_order_keys(job_id)))
    digests = helper.order_digests(_order_head(job_id), participants)
    order = sorted(range(len(participants)), key=digests.__getitem__)
    return tuple(participants[i] for i in order)


def harary_neighbours(n: int, k: int, i: int) -> frozenset[int]:
    """Vertex ``i``'s neighbours in ``H_{k,n}`` (the graph of :func:`harary_edges`),
    computed from ``i`` alone in O(k).

    Why (issue #24): every participant needs only its own and its neighbours'
    neighbourhoods, O(k²) vertices; building all ``n·k/2`` edges cost each participant
    3 ms at n = 500 and 10 ms at n = 1000 — more than the rest of its protocol work.
    Tested equal to :func:`harary_edges` for every ``n ≤ 40`` and ``k < n``."""
    if not 1 <= k < n:
        raise ValueError(f"Harary graph needs 1 <= k < n, got k={k}, n={n}")
    if not 0 <= i < n:
        raise ValueError(f"vertex {i} is not in 0..{n - 1}")
    out = {(i + j) % n for j in range(1, k // 2 + 1)}
    out.update((i - j) % n for j in range(1, k // 2 + 1))
    if k % 2:
        if n % 2 == 0:
            out.add((i + n // 2) % n)
        else:
            half = (n + 1) // 2
            if i <= (n - 1) // 2:  # an edge (i, i + half) of the odd case
                out.add((i + half) % n)
            a = (i - half) % n  # ... and one (a, a + half) that ends at i
            if a <= (n - 1) // 2:
                out.add(a)
    out.discard(i)
    return frozenset(out)


class Graph:
    """Neighbourhoods of one job's participants.

    Harary neighbourhoods are computed on demand from a participant's position on the
    cycle (:func:`harary_neighbours`) and kept: a participant asks for O(k) of them, the
    coordinator for every survivor's. Only the order of the cycle is O(n) per party —
    one SHA-256 per participant and a sort."""

    def __init__(self, participants: Sequence[str], kind: str, degree: int, job_id: bytes):
        if kind not in GRAPH_KINDS:
            raise ValueError(f"unknown graph kind {kind!r}")
        self.participants: tuple[str, ...] = tuple(sorted(participants))
        self.kind = kind
        self.degree = degree
        self._all = frozenset(self.participants)
        self._adj: dict[str, frozenset[str]] = {}
        self._order: tuple[str, ...] = ()
        self._position: dict[str, int] = {}
        if kind == HARARY:
            if not 1 <= degree < len(self.participants):
                raise ValueError(
                    f"Harary graph needs 1 <= k < n, got k={degree}, n={len(self.participants)}"
                )
            self._order = _cycle_order(self.participants, job_id)
            self._position = {p: i for i, p in enumerate(self._order)}

    def __contains__(self, u: object) -> bool:
        return u in self._all

    @property
    def cycle(self) -> tuple[str, ...]:
        """The participants in the Harary cycle's order (empty for the complete graph)."""
        return self._order

    def neighbours(self, u: str) -> frozenset[str]:
        """``N(u)``: the participants ``u`` shares a pairwise mask with."""
        cached = self._adj.get(u)
        if cached is not None:
            return cached
        if self.kind == COMPLETE:
            if u not in self._all:
                raise KeyError(u)
            cached = self._all - {u}
        else:
            order = self._order
            cached = frozenset(
                order[j] for j in harary_neighbours(len(order), self.degree, self._position[u])
            )
        self._adj[u] = cached
        return cached

    def closed(self, u: str) -> frozenset[str]:
        """``N(u) ∪ {u}``: who holds shares of ``u``'s secrets."""
        return self.neighbours(u) | {u}

    def closed_two_hop(self, u: str) -> frozenset[str]:
        """``u`` and everyone within two hops: ``⋃_{v ∈ N(u) ∪ {u}} N(v) ∪ {v}``.

        Why: ``u`` holds shares of the owners in ``N(u) ∪ {u}``, and before revealing
        them its consistency check (:mod:`spherecal.crypto.consistency`) counts signatures among
        *their* holders — so these are the only parties whose identity keys ``u`` ever
        needs (:func:`spherecal.crypto.spec.keys_needed`). On ``H_{k,n}`` that is at most the
        ``2k + 1`` cycle positions around ``u`` plus the diameters' ends: O(k), not n.
        The complete graph: everyone."""
        if self.kind == COMPLETE:
            if u not in self._all:
                raise KeyError(u)
            return self._all
        out = set(self.closed(u))
        for v in self.neighbours(u):
            out |= self.neighbours(v)
        return frozenset(out)

    def holders(self, u: str, live: Iterable[str]) -> tuple[str, ...]:
        """Sorted share holders of ``u`` among ``live``; holder ``i`` gets x = i+1."""
        live_set = live if isinstance(live, (set, frozenset)) else set(live)
        return tuple(sorted(p for p in self.closed(u) if p in live_set))

    def components(self, nodes: Iterable[str]) -> list[frozenset[str]]:
        """Connected components of the subgraph induced on ``nodes``."""
        remaining = set(nodes)
        if self.kind == COMPLETE:
            return [frozenset(remaining)] if remaining else []
        out: list[frozenset[str]] = []
        while remaining:
            start = remaining.pop()
            comp = {start}
            stack = [start]
            while stack:
                v = stack.pop()
                for w in self.neighbours(v):
                    if w in remaining:
                        remaining.discard(w)
                        comp.add(w)
                        stack.append(w)
            out.append(frozenset(comp))
        return out

    def reach(self, u: str, nodes: Iterable[str], at_least: int) -> int:
        """How many of ``nodes`` are connected to ``u`` (``u`` included) in the subgraph
        induced on ``nodes`` — counted only up to ``at_least``: the search stops there.

        Why: a participant checks that its connected group of survivors is large enough
        (a small group's partial sum would be exposed); counting that group whole is a
        walk over all ``n`` survivors, O(n·k) per participant and job, where the check
        needs O(``at_least`` · k). Exact whenever the answer is below ``at_least``.
        """
        live = nodes if isinstance(nodes, (set, frozenset)) else set(nodes)
        if u not in live:
            return 0
        if self.kind == COMPLETE:
            return min(len(live), max(at_least, 1))
        seen = {u}
        stack = [u]
        while stack and len(seen) < at_least:
            v = stack.pop()
            for w in self.neighbours(v):
                if w in live and w not in seen:
                    seen.add(w)
                    stack.append(w)
        return min(len(seen), max(at_least, 1))

    def component_of(self, u: str, nodes: Iterable[str]) -> frozenset[str]:
        for comp in self.components(nodes):
            if u in comp:
                return comp
        return frozenset()

    def max_closed_size(self) -> int:
        """Largest ``|N(u) ∪ {u}|`` (k+1, or k+2 for one vertex of odd ``H_{k,n}``)."""
        n = len(self.participants)
        if self.kind == COMPLETE:
            return n
        return max_closed_size(HARARY, n, self.degree)


def max_closed_size(kind: str, n: int, degree: int) -> int:
    """Largest closed neighbourhood of the graph a spec describes, without building it."""
    if kind == COMPLETE:
        return n
    extra = 1 if (degree % 2 == 1 and n % 2 == 1) else 0
    return min(n, degree + 1 + extra)


def min_closed_size(kind: str, n: int, degree: int) -> int:
    """Smallest closed neighbourhood: every participant has at least this many holders."""
    return n if kind == COMPLETE else degree + 1
