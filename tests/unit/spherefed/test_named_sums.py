"""The one registry and the named sums a strategy declares: layouts that flatten a
payload into the single secure-aggregation vector and split the aggregate back."""

from __future__ import annotations

import numpy as np
import pytest

from spherecal.spherefed.algorithms import (
    ALGORITHM_NAMES,
    LOSS_SUM,
    STRATEGIES,
    AlgorithmSettings,
    FedAdam,
    FedProx,
    NamedSum,
    Scaffold,
    SumLayout,
    add_payloads,
    as_payload,
    configured_strategy,
)
from spherecal.spherefed.reference import ReferenceConfig, default_strategy

L = 7


def _payload(rng: np.random.Generator, layout: SumLayout) -> dict[str, np.ndarray]:
    return {
        name: rng.normal(size=size) if size != 1 else np.asarray(rng.normal())
        for name, size in layout.entries
    }


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_each_strategy_declares_its_sums_and_their_sizes(name: str) -> None:
    strategy = configured_strategy(name, AlgorithmSettings(num_participants=3))
    layout = strategy.layout(L, LOSS_SUM)
    assert layout.names == (*strategy.sum_keys, "loss")
    sizes = dict(layout.entries)
    assert sizes["delta"] == L and sizes["weight"] == 1 and sizes["loss"] == 1
    expected_extra = {"fednova": {"tau": 1}, "scaffold": {"control_delta": L}}.get(name, {})
    assert {k: v for k, v in sizes.items() if k not in ("delta", "weight", "loss")} == (
        expected_extra
    )
    assert layout.length == sum(sizes.values())


def test_flattened_sum_is_the_sum_of_flattened_payloads() -> None:
    """What secure aggregation computes (Σ of flat vectors) unflattens to the
    harness's ``add_payloads`` sum, entry for entry and bit for bit."""
    rng = np.random.default_rng(0)
    layout = Scaffold().layout(L, LOSS_SUM)
    payloads = [_payload(rng, layout) for _ in range(4)]
    flat_total = np.zeros(layout.length)
    total = None
    for p in payloads:
        flat_total = flat_total + layout.flatten(p)
        total = add_payloads(total, as_payload(**p))
    assert total is not None
    back = layout.unflatten(flat_total)
    assert set(back) == set(total)
    for key in total:
        assert back[key].shape == total[key].shape
        assert np.array_equal(back[key], total[key])


def test_layout_refuses_what_does_not_fit() -> None:
    layout = SumLayout.of((NamedSum("delta", per_entry=True), NamedSum("weight")), L)
    good: dict[str, np.ndarray | float] = {"delta": np.zeros(L), "weight": 1.0}
    assert layout.flatten(good).shape == (L + 1,)
    with pytest.raises(ValueError, match="layout needs"):
        layout.flatten({"delta": np.zeros(L)})
    with pytest.raises(ValueError, match="layout needs"):
        layout.flatten({**good, "tau": 1.0})
    with pytest.raises(ValueError, match="entries, expected"):
        layout.flatten({"delta": np.zeros(L - 1), "weight": 1.0})
    with pytest.raises(ValueError, match="layout"):
        layout.unflatten(np.zeros(L))
    with pytest.raises(ValueError, match="duplicate"):
        SumLayout.of((NamedSum("w"), NamedSum("w")), L)


def test_one_registry_configures_every_algorithm() -> None:
    assert tuple(STRATEGIES) == ALGORITHM_NAMES
    settings = AlgorithmSettings(prox_mu=0.3, fedopt_lr=0.07, num_participants=5)
    for name in ALGORITHM_NAMES:
        assert configured_strategy(name, settings).name == name
    prox = configured_strategy("fedprox", settings)
    assert isinstance(prox, FedProx) and prox.mu == 0.3
    adam = configured_strategy("fedadam", settings)
    assert isinstance(adam, FedAdam) and adam.lr == 0.07
    scaffold = configured_strategy("scaffold", settings)
    assert isinstance(scaffold, Scaffold) and scaffold.num_participants == 5
    with pytest.raises(ValueError, match="unknown algorithm"):
        configured_strategy("fedsgd", settings)


def test_reference_runner_takes_every_registered_algorithm() -> None:
    for name in ALGORITHM_NAMES:
        config = ReferenceConfig(algorithm=name, participants=4)
        assert default_strategy(config).name == name
    scaffold = default_strategy(ReferenceConfig(algorithm="scaffold", participants=4))
    assert isinstance(scaffold, Scaffold) and scaffold.num_participants == 4
    with pytest.raises(ValueError, match="unknown algorithm"):
        ReferenceConfig(algorithm="fedsgd")
