"""Masking graphs and the job specification."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spherecal.crypto import InvalidSpec, JobSpec, MalformedMessage
from spherecal.crypto._codec import encode_context
from spherecal.crypto.graph import (
    Graph,
    harary_edges,
    harary_neighbours,
    max_closed_size,
    min_closed_size,
)
from spherecal.crypto.kdf import LABEL
from spherecal.crypto.ring import sum_fits


# ----------------------------------------------------------------------- graph
def _connected(nodes: set[int], edges: set[tuple[int, int]]) -> bool:
    if not nodes:
        return True
    adj: dict[int, set[int]] = {v: set() for v in nodes}
    for a, b in edges:
        if a in nodes and b in nodes:
            adj[a].add(b)
            adj[b].add(a)
    start = next(iter(nodes))
    seen, stack = {start}, [start]
    while stack:
        for w in adj[stack.pop()]:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return seen == nodes


@pytest.mark.parametrize("n", range(3, 10))
def test_harary_graph_is_k_connected_with_minimum_edges(n: int) -> None:
    for k in range(2, n):
        edges = harary_edges(n, k)
        degree = [0] * n
        for a, b in edges:
            degree[a] += 1
            degree[b] += 1
        assert min(degree) == k
        assert len(edges) == math.ceil(n * k / 2)
        assert max(degree) <= k + 1
        assert max(degree) + 1 == max_closed_size("harary", n, k)
        # Removing any k-1 vertices leaves the graph connected.
        for removed in itertools.combinations(range(n), k - 1):
            assert _connected(set(range(n)) - set(removed), edges)


@pytest.mark.parametrize("n", range(2, 41))
def test_one_vertex_neighbours_equal_the_edge_list(n: int) -> None:
    """The O(k) per-vertex rule (what each party computes) against the whole edge list,
    for every degree — both parities of n and k, the odd-odd case's vertex of k + 1."""
    for k in range(1, n):
        expected: dict[int, set[int]] = {i: set() for i in range(n)}
        for a, b in harary_edges(n, k):
            expected[a].add(b)
            expected[b].add(a)
        for i in range(n):
            assert harary_neighbours(n, k, i) == expected[i], (n, k, i)
    with pytest.raises(ValueError):
        harary_neighbours(n, n, 0)
    with pytest.raises(ValueError):
        harary_neighbours(n, 1, n)


@pytest.mark.parametrize(("n", "k"), [(12, 4), (13, 5), (31, 10), (64, 11), (101, 14)])
def test_graph_equals_the_edge_list_on_the_hashed_cycle(n: int, k: int) -> None:
    """Every neighbourhood, asked in any order, equals the graph built whole from the
    edge list on the SHA-256 order (the protocol's definition, written out here)."""
    ids = [f"site-{i}" for i in range(n)]
    job = b"job-x"
    order = sorted(
        ids,
        key=lambda p: hashlib.sha256(encode_context(LABEL, "graph-order", job, p)).digest(),
    )
    whole: dict[str, set[str]] = {p: set() for p in ids}
    for a, b in harary_edges(n, k):
        whole[order[a]].add(order[b])
        whole[order[b]].add(order[a])
    graph = Graph(list(reversed(ids)), "harary", k, job)
    for p in sorted(ids, key=lambda q: hashlib.sha256(q.encode()).digest()):
        assert graph.neighbours(p) == whole[p]
        two_hop = set(whole[p]) | {p}
        for v in whole[p]:
            two_hop |= whole[v] | {v}
        assert graph.closed_two_hop(p) == two_hop
    assert graph.components(ids) == [frozenset(ids)]
    with pytest.raises(KeyError):
        graph.neighbours("nobody")
    with pytest.raises(ValueError):
        Graph(ids, "harary", n, job)


def test_graph_neighbourhoods_are_symmetric_and_job_dependent() -> None:
    ids = [f"p{i:02d}" for i in range(12)]
    g1 = Graph(ids, "harary", 4, b"job-a")
    g2 = Graph(ids, "harary", 4, b"job-b")
    for u in ids:
        assert u not in g1.neighbours(u)
        assert len(g1.neighbours(u)) == 4
        for v in g1.neighbours(u):
            assert u in g1.neighbours(v)
        assert g1.closed(u) == g1.neighbours(u) | {u}
    assert any(g1.neighbours(u) != g2.neighbours(u) for u in ids)
    assert Graph(ids, "harary", 4, b"job-a").neighbours("p00") == g1.neighbours("p00")
    assert g1.holders("p00", ids) == tuple(sorted(g1.closed("p00")))


def test_components() -> None:
    ids = [f"p{i}" for i in range(8)]
    complete = Graph(ids, "complete", 7, b"j")
    assert complete.components(ids[:3]) == [frozenset(ids[:3])]
    assert complete.neighbours("p0") == frozenset(ids[1:])
    ring = Graph(ids, "harary", 2, b"j")  # a cycle
    a = "p0"
    left, right = sorted(ring.neighbours(a))
    # Removing a vertex and both of its neighbours' other neighbours splits the cycle.
    survivors = set(ids) - {left, right}
    assert ring.component_of(a, survivors) == frozenset({a})
    assert len(ring.components(survivors)) == 2
    assert ring.component_of("nobody", survivors) == frozenset()
    with pytest.raises(ValueError):
        Graph(ids, "star", 2, b"j")
    with pytest.raises(ValueError):
        harary_edges(4, 4)
    assert min_closed_size("harary", 9, 3) == 4 and max_closed_size("harary", 9, 3) == 5


# ------------------------------------------------------------------------ spec
IDS = ("a", "b", "c", "d", "e")


def make(**overrides: object) -> JobSpec:
    fields: dict[str, object] = dict(
        participants=IDS, threshold=3, length=10, bound=1.0, job_id=b"job"
    )
    fields.update(overrides)
    return JobSpec.create(**fields)  # type: ignore[arg-type]


def test_create_fills_in_safe_defaults() -> None:
    spec = JobSpec.create(["c", "a", "b"], threshold=2, length=5, bound=2.5)
    assert spec.participants == ("a", "b", "c")
    assert len(spec.job_id) == 16 and spec.min_participants == 2 and spec.degree == 2
    assert sum_fits(3, 2.5, spec.scale_bits) and not sum_fits(3, 2.5, spec.scale_bits + 13)
    assert JobSpec.create(["a", "b"], threshold=2, length=1, bound=1, job_id="r1").job_id == b"r1"
    assert spec.job_id != JobSpec.create(["a", "b", "c"], threshold=2, length=5, bound=2.5).job_id


def test_spec_roundtrips_canonically_and_digest_covers_every_field() -> None:
    spec = make(graph="harary", degree=2, chunk_size=4, noise_bound=7)
    data = spec.to_bytes()
    again = JobSpec.from_bytes(data)
    assert again == spec and again.to_bytes() == data and again.digest == spec.digest
    changes = dict(
        job_id=b"job2",
        participants=("a", "b", "c", "d", "f"),
        threshold=2,
        min_participants=4,
        length=11,
        scale_bits=spec.scale_bits - 1,
        bound=0.5,
        degree=3,
        chunk_size=6,
        noise_bound=8,
    )
    for field, value in changes.items():
        changed = replace(spec, **{field: value})  # type: ignore[arg-type]
        assert changed.digest != spec.digest, field
    assert replace(spec, graph="complete", degree=4).digest != spec.digest
    assert (
        make(threshold=4, consistency_check=True).digest
        != make(threshold=4, consistency_check=False).digest
    )


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(threshold=1), "threshold must be in 2..5"),
        (dict(threshold=6), "threshold must be in 2..5"),
        (dict(graph="harary", degree=2, threshold=4), "threshold must be in 2..3"),
        (dict(graph="harary", degree=1), "Harary degree"),
        (dict(graph="harary", degree=5), "Harary degree"),
        (dict(graph="star"), "graph must be one of"),
        (dict(min_participants=1), "min_participants"),
        (dict(min_participants=6), "min_participants"),
        (dict(consistency_check=True, threshold=2), "2\\*t > 5"),
        (dict(length=0), "vector length"),
        (dict(chunk_size=3), "chunk_size must be a multiple of 2"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(bound=0.0), "bound"),
        (dict(bound=math.inf), "bound"),
        (dict(scale_bits=62), "could overflow"),
        (dict(scale_bits=63), "scale_bits"),
        (dict(noise_bound=-1), "noise_bound"),
        (dict(noise_bound=1 << 62), "no scale fits"),
        (dict(job_id=b""), "job_id"),
        (dict(job_id=b"x" * 65), "job_id"),
        (dict(participants=("a",), threshold=2), "at least 2 participants"),
        (dict(participants=("a", "a", "b")), "unique"),
        (dict(participants=("a", "b\n", "c")), "printable"),
        # the fast all-ASCII pass and the id-by-id pass refuse alike
        (dict(participants=("a", "b", "c" * 256)), "too long"),
        (dict(participants=("a", "b", "é" * 128)), "too long"),  # 128 chars, 256 bytes
        (dict(participants=("a", "b", "é\u2028")), "printable"),
    ],
)
def test_invalid_specs_are_refused(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidSpec, match=match):
        make(**overrides)


def test_ids_at_the_byte_limit_are_accepted() -> None:
    longest = ("a", "b", "c" * 255, "d", "é" * 127)  # 255 and 254 bytes
    assert make(participants=longest).participants == tuple(sorted(longest))


def test_constructor_validates_too() -> None:
    spec = make()
    with pytest.raises(InvalidSpec, match="tuple"):
        replace(spec, participants=list(spec.participants))  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match="non-empty"):
        replace(spec, participants=("", "a", "b", "c", "d"))
    with pytest.raises(InvalidSpec, match="2..65536 participants"):
        replace(spec, participants=("a",), threshold=2, min_participants=2)
    with pytest.raises(InvalidSpec, match="bound"):
        replace(spec, bound=1)  # an int is not a float bound
    with pytest.raises(InvalidSpec, match="scale_bits"):
        replace(spec, scale_bits=-1)
    with pytest.raises(InvalidSpec, match="sorted"):
        replace(spec, participants=("b", "a", "c", "d", "e"))
    with pytest.raises(InvalidSpec, match="degree 4"):
        replace(spec, degree=3)


def test_consistency_check_needs_a_majority_threshold() -> None:
    assert make(threshold=3, consistency_check=True).consistency_check
    with pytest.raises(InvalidSpec):
        make(graph="harary", degree=3, threshold=2, consistency_check=True)


def test_from_bytes_is_strict() -> None:
    data = make().to_bytes()
    with pytest.raises(MalformedMessage, match="trailing"):
        JobSpec.from_bytes(data + b"\x00")
    with pytest.raises(MalformedMessage):
        JobSpec.from_bytes(data[:-1])
    with pytest.raises(MalformedMessage):
        JobSpec.from_bytes(b"XXXX" + data[4:])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 40), length=st.integers(1, 10_000), chunk=st.integers(1, 64))
def test_chunks_tile_the_vector(n: int, length: int, chunk: int) -> None:
    ids = [f"p{i}" for i in range(n)]
    spec = JobSpec.create(ids, threshold=2, length=length, bound=1.0, chunk_size=2 * chunk)
    bounds = [spec.chunk_bounds(i) for i in range(spec.n_chunks)]
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    with pytest.raises(IndexError):
        spec.chunk_bounds(spec.n_chunks)


def test_a_participant_computes_only_neighbourhoods_within_two_hops() -> None:
    """What a site asks of its graph in a job — its neighbours, its 2-hop set (the keys
    it needs), its owners' holders, its survivor group up to a size — computes the
    neighbourhoods of its 2-hop vertices only, never all n (issue #24: building the
    whole graph cost each site 9.9 ms at n = 1000)."""
    ids = [f"site-{i:03d}" for i in range(300)]
    spec = JobSpec.create(ids, threshold=6, length=4, bound=1.0, graph="harary", degree=10)
    own = JobSpec.from_bytes(spec.to_bytes())  # as a site decodes it
    graph = own.masking_graph
    me = ids[17]
    two_hop = graph.closed_two_hop(me)
    for owner in graph.closed(me):
        graph.holders(owner, ids)
    assert graph.reach(me, ids, 5) == 5
    computed = set(graph._adj)  # the neighbourhoods computed so far
    assert me in computed and computed <= two_hop
    assert len(two_hop) <= 2 * 10 + 1 < len(ids)
