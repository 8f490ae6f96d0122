"""``Graph.reach``: a participant's connected group of survivors, counted only as far
as its checks need (issue #24: O(k) per participant instead of a walk over all n).
Checked against the full connected components, computed independently."""

from __future__ import annotations

import random

import pytest

from spherecal.crypto import JobSpec
from spherecal.crypto.graph import Graph


def _graph(n: int, kind: str) -> Graph:
    ids = [f"p{i:03d}" for i in range(n)]
    spec = JobSpec.create(ids, threshold=3, length=4, bound=1.0, graph=kind)
    return spec.masking_graph


def _component(graph: Graph, u: str, nodes: set[str]) -> set[str]:
    """Breadth-first search over the whole induced subgraph (the reference)."""
    if u not in nodes:
        return set()
    seen, frontier = {u}, [u]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph.neighbours(v):
                if w in nodes and w not in seen:
                    seen.add(w)
                    nxt.append(w)
        frontier = nxt
    return seen


@pytest.mark.parametrize("kind", ["harary", "complete"])
def test_reach_is_the_component_size_capped_at_what_is_asked(kind: str) -> None:
    rng = random.Random(7)
    graph = _graph(60, kind)
    ids = sorted(graph.participants)
    for _ in range(300):
        # sparse survivor sets split the Harary graph into small groups
        nodes = {p for p in ids if rng.random() < rng.choice([0.1, 0.3, 0.9])}
        u = rng.choice(ids)
        at_least = rng.randrange(1, 12)
        full = len(_component(graph, u, nodes))
        assert graph.reach(u, nodes, at_least) == min(full, at_least)
        if u in nodes:
            assert graph.reach(u, nodes, len(ids)) == full == len(graph.component_of(u, nodes))
