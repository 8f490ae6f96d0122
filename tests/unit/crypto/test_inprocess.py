"""End-to-end properties: the decoded sum is the survivors' sum, for random sizes,
participant counts, thresholds, graphs and dropouts at every stage."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spherecal.crypto import (
    EncodingOverflow,
    InvalidSpec,
    JobSpec,
    ThresholdTooLow,
    TooFewSurvivors,
    WrongLength,
    run_protocol,
    simulate_secure_sum,
)
from spherecal.crypto.graph import max_closed_size, min_closed_size
from spherecal.crypto.simulation import DROP_STAGES, parse_graph

from .helpers import MECHANICS_POLICY

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fsum_rows(rows: list[np.ndarray], length: int) -> np.ndarray:
    if not rows:
        return np.zeros(length)
    return np.array([math.fsum(col) for col in zip(*rows, strict=True)])


@st.composite
def jobs(draw: st.DrawFn) -> tuple[JobSpec, dict[str, np.ndarray], dict[str, str], set[str]]:
    """A random job and a dropout pattern that the protocol must survive."""
    n = draw(st.integers(2, 8))
    graph = "complete" if n < 5 else draw(st.sampled_from(["complete", "harary"]))
    degree = n - 1 if graph == "complete" else draw(st.integers(2, n - 2))
    smallest = min_closed_size(graph, n, degree)
    t = draw(st.integers(2, smallest))
    consistency = 2 * t > max_closed_size(graph, n, degree) and draw(st.booleans())
    length = draw(st.integers(1, 40))
    chunk = 2 * draw(st.integers(1, 12))
    bound = draw(st.sampled_from([1e-3, 1.0, 7.5, 1e4]))
    ids = [f"u{i}" for i in range(n)]
    spec = JobSpec.create(
        ids,
        threshold=t,
        length=length,
        bound=bound,
        graph=graph,
        degree=degree,
        consistency_check=consistency,
        chunk_size=chunk,
    )
    # Up to `smallest - t` dropouts: every share-holder set keeps t live members and a
    # k-connected Harary graph (k >= smallest - 1 > dropouts) stays connected.
    budget = smallest - t
    dropped = draw(st.lists(st.sampled_from(ids), unique=True, max_size=budget))
    stages = DROP_STAGES if consistency else tuple(s for s in DROP_STAGES if s != "consistency")
    drop = {p: draw(st.sampled_from(stages)) for p in dropped}
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    inputs = {p: rng.uniform(-bound, bound, length) for p in ids}
    contributors = {p for p in ids if drop.get(p) not in ("advertise", "share", "masked")}
    return spec, inputs, drop, contributors


@SETTINGS
@given(job=jobs(), order=st.integers(0, 2**32 - 1), site_costs=st.booleans())
def test_decoded_sum_is_the_sum_of_the_survivors(
    job: tuple[JobSpec, dict[str, np.ndarray], dict[str, str], set[str]],
    order: int,
    site_costs: bool,
) -> None:
    """Either way of delivering the spec and the messages (one decoded object for all,
    or each participant decoding its own copy, as a site does) gives the exact sum."""
    spec, inputs, drop, contributors = job
    report = run_protocol(
        spec,
        inputs,
        drop=drop,
        rng=random.Random(order),
        policy=MECHANICS_POLICY,
        site_costs=site_costs,
    )
    result = report.result
    assert set(result.contributors) == contributors
    expected = fsum_rows([inputs[p] for p in sorted(contributors)], spec.length)
    tolerance = spec.n * math.ldexp(1.0, -spec.scale_bits)
    assert np.all(np.abs(result.values - expected) <= tolerance)
    assert len(contributors) >= spec.min_participants


@SETTINGS
@given(
    n=st.integers(2, 7),
    data=st.data(),
    graph=st.sampled_from(["complete", "harary"]),
)
def test_simulate_secure_sum_property(n: int, data: st.DataObject, graph: str) -> None:
    if graph == "harary" and n < 4:
        graph = "complete"
    kind, degree = parse_graph(graph, n, 2)
    t = data.draw(st.integers(2, min_closed_size(kind, n, degree)), label="t")
    kind, degree = parse_graph(graph, n, t)
    budget = min_closed_size(kind, n, degree) - t
    length = data.draw(st.integers(1, 30), label="length")
    dropped = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=budget))
    drop = {i: data.draw(st.sampled_from(DROP_STAGES)) for i in dropped}
    vectors = np.random.default_rng(data.draw(st.integers(0, 2**31))).normal(0, 3, (n, length))
    out = simulate_secure_sum(
        vectors, threshold=t, drop=drop, graph=graph, seed=1, policy=MECHANICS_POLICY
    )
    kept = [vectors[i] for i in range(n) if drop.get(i) not in ("advertise", "share", "masked")]
    bound = float(np.abs(vectors).max())
    f = JobSpec.create([f"p{i}" for i in range(n)], threshold=2, length=1, bound=bound).scale_bits
    assert np.all(np.abs(out - fsum_rows(kept, length)) <= n * math.ldexp(1.0, -f))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 7), data=st.data())
def test_fewer_than_t_survivors_raises(n: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(2, n), label="t")
    k = data.draw(st.integers(n - t + 1, n), label="dropouts")  # leaves < t
    dropped = data.draw(st.lists(st.integers(0, n - 1), unique=True, min_size=k, max_size=k))
    drop = {i: data.draw(st.sampled_from(DROP_STAGES)) for i in dropped}
    with pytest.raises(TooFewSurvivors) as err:
        simulate_secure_sum(np.ones((n, 3)), threshold=t, drop=drop, policy=MECHANICS_POLICY)
    assert err.value.needed >= t > err.value.remaining
    assert f"needed at least {err.value.needed}" in str(err.value)


def test_drop_stage_semantics() -> None:
    v = np.arange(12, dtype=float).reshape(4, 3) - 5
    assert np.allclose(simulate_secure_sum(v, threshold=2, policy=MECHANICS_POLICY), v.sum(0))
    for stage, included in [
        ("advertise", False),
        ("share", False),
        ("masked", False),
        ("consistency", True),
        ("unmask", True),
    ]:
        out = simulate_secure_sum(v, threshold=2, drop={1: stage}, policy=MECHANICS_POLICY)
        expected = v.sum(0) if included else v.sum(0) - v[1]
        assert np.allclose(out, expected, atol=1e-9), stage


def test_the_seed_only_changes_delivery_order_not_the_result() -> None:
    v = np.random.default_rng(5).uniform(-1, 1, (5, 17))
    a = simulate_secure_sum(v, threshold=3, seed=1, drop={0: "masked"}, policy=MECHANICS_POLICY)
    b = simulate_secure_sum(v, threshold=3, seed=2, drop={0: "masked"}, policy=MECHANICS_POLICY)
    assert np.array_equal(a, b)


def test_noise_hook_adds_integer_noise_in_the_ring() -> None:
    ids = ["a", "b", "c"]
    spec = JobSpec.create(ids, threshold=2, length=6, bound=1.0, noise_bound=1000, chunk_size=4)
    rng = np.random.default_rng(0)
    inputs = {p: rng.uniform(-1, 1, 6) for p in ids}
    noise = {p: rng.integers(-1000, 1001, 6) for p in ids}
    result = run_protocol(
        spec, inputs, noise=noise, drop={"c": "masked"}, policy=MECHANICS_POLICY
    ).result
    from spherecal.crypto.ring import RING_DTYPE, encode

    expected = np.zeros(6, dtype=RING_DTYPE)
    for p in ("a", "b"):
        np.add(expected, encode(inputs[p], scale_bits=spec.scale_bits, bound=1.0), out=expected)
        np.add(expected, noise[p].astype("<i8").view(RING_DTYPE), out=expected)
    assert np.array_equal(result.ring_sum, expected)


def test_invalid_arguments() -> None:
    with pytest.raises(WrongLength):
        simulate_secure_sum([np.zeros(3), np.zeros(4)], threshold=2, policy=MECHANICS_POLICY)
    with pytest.raises(WrongLength):
        simulate_secure_sum([], threshold=2, policy=MECHANICS_POLICY)
    with pytest.raises(EncodingOverflow):
        simulate_secure_sum(
            [np.zeros(3), np.array([0, np.nan, 0])], threshold=2, policy=MECHANICS_POLICY
        )
    with pytest.raises(ValueError, match="drop stage"):
        simulate_secure_sum(
            np.zeros((3, 2)), threshold=2, drop={0: "lunch"}, policy=MECHANICS_POLICY
        )
    with pytest.raises(ValueError, match="out of range"):
        simulate_secure_sum(
            np.zeros((3, 2)), threshold=2, drop={5: "share"}, policy=MECHANICS_POLICY
        )
    with pytest.raises(InvalidSpec):
        simulate_secure_sum(np.zeros((3, 2)), threshold=4, policy=MECHANICS_POLICY)
    with pytest.raises(InvalidSpec):
        simulate_secure_sum(np.zeros((3, 2)), threshold=2, scale_bits=62, policy=MECHANICS_POLICY)
    with pytest.raises(ValueError, match="graph"):
        simulate_secure_sum(np.zeros((3, 2)), threshold=2, graph="star", policy=MECHANICS_POLICY)
    assert parse_graph("harary:3", 8, 2) == ("harary", 3)
    with pytest.raises(ValueError):
        parse_graph("harary:x", 8, 2)


def test_explicit_scale_and_harary_with_explicit_degree() -> None:
    v = np.random.default_rng(1).uniform(-2, 2, (9, 8))
    out = simulate_secure_sum(
        v, threshold=3, graph="harary:4", scale_bits=20, drop={4: "share"}, policy=MECHANICS_POLICY
    )
    assert np.all(np.abs(out - (v.sum(0) - v[4])) <= 9 * 2.0**-20 + 1e-12)


def test_run_protocol_checks_its_arguments() -> None:
    spec = JobSpec.create(["a", "b", "c"], threshold=2, length=2, bound=1.0)
    inputs = {p: np.zeros(2) for p in spec.participants}
    with pytest.raises(ValueError, match="not a participant"):
        run_protocol(spec, inputs, drop={"z": "share"}, policy=MECHANICS_POLICY)
    with pytest.raises(ValueError, match="one vector per participant"):
        run_protocol(spec, {"a": np.zeros(2)}, policy=MECHANICS_POLICY)


def test_default_policy_runs_a_majority_job_and_refuses_a_low_threshold() -> None:
    v = np.arange(12.0).reshape(4, 3)
    assert np.allclose(simulate_secure_sum(v, threshold=3), v.sum(0))
    with pytest.raises(ThresholdTooLow):
        simulate_secure_sum(v, threshold=2)
