"""The calibration statistics' bound follows the head and the declared data (issue #24).

With a unit-norm head every entry of a site's FFC or CCVR statistics is at most its
example count, so the coordinator derives the bound from ``[federation]
max_examples_per_site`` instead of a fixed 1e6, and the job's fixed-point scale gets
finer. Checked against what a real model's statistics really are (and the worst case
of every feature on one axis), its consequence for the scale and the decoded sum, the
fallback for heads without unit norm, the override, the evaluation jobs' bound, and the
refusal of statistics beyond it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from spherecal import crypto
from spherecal.coordinator.driver.bounds import evaluation_bound, statistics_bound
from spherecal.coordinator.settings import CoordinatorSettings, ModelSettings, SecAggSettings
from spherecal.crypto import ring
from spherecal.spherefed.network import ModelSpec, build_model, compute_features
from spherecal.spherefed.stats import (
    FALLBACK_STATISTICS_BOUND,
    ccvr_statistics,
    ffc_statistics,
    pack_ccvr,
    pack_ffc,
    statistics_entry_bound,
)

IDS = tuple(f"p{k}" for k in range(10))


def _settings(head: str = "sphere", **kwargs: object) -> CoordinatorSettings:
    return CoordinatorSettings(
        participants=IDS,
        model=ModelSettings(head=head),
        **kwargs,  # type: ignore[arg-type]
    )


def _packed(z: np.ndarray, y: np.ndarray, classes: int) -> np.ndarray:
    return np.concatenate(
        [pack_ffc(ffc_statistics(z, y, classes)), pack_ccvr(ccvr_statistics(z, y, classes))]
    )


@pytest.mark.parametrize("head", ["sphere", "fn"])
def test_a_real_sites_statistics_stay_inside_the_derived_bound(head: str) -> None:
    n, classes = 60, 3
    model = build_model(
        ModelSpec(extractor="mlp", head=head, feature_dim=8, num_classes=classes, image_size=4)
    )
    g = torch.Generator().manual_seed(0)
    x = 50 * torch.randn(n, 1, 4, 4, generator=g)  # large inputs: the norm still holds
    y = torch.randint(0, classes, (n,), generator=g).numpy()
    z = compute_features(model, x)
    bound = statistics_bound(_settings(head, max_examples_per_site=n)).value
    packed = _packed(z, y, classes)
    assert float(np.max(np.abs(packed))) <= bound
    ring.encode(packed, scale_bits=ring.choose_scale_bits(10, bound), bound=bound)  # no refusal


def test_the_worst_case_site_fits_and_one_example_more_is_refused() -> None:
    """Every feature on one axis (a float32 unit vector): ``V₁₁ = U₁₀ = count = n``,
    the largest entries unit norm allows. At ``n = max_examples_per_site`` they fit;
    with one example more the site refuses with a typed error, never a wrapped sum."""
    n, classes = 1000, 2
    z = np.zeros((n + 1, 5), dtype=np.float32)
    z[:, 0] = 1.0
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    y = np.zeros(n + 1, dtype=np.int64)
    bound = statistics_bound(_settings(max_examples_per_site=n)).value
    honest = _packed(z[:n], y[:n], classes)
    assert float(np.max(honest)) == n
    scale = ring.choose_scale_bits(10, bound)
    ring.encode(honest, scale_bits=scale, bound=bound)
    with pytest.raises(crypto.EncodingOverflow, match="outside"):
        ring.encode(_packed(z, y, classes), scale_bits=scale, bound=bound)


def test_the_derived_scale_is_finer_and_the_sum_decodes_within_it() -> None:
    default = statistics_bound(_settings())
    assert (default.source, default.value) == ("derived", 100_000 * (1 + 2.0**-10))
    assert "max_examples_per_site 100000" in default.describe()
    assert ring.choose_scale_bits(10, default.value) == 33
    assert ring.choose_scale_bits(10, 1e6) == 30  # the fixed bound it replaces
    small = statistics_bound(_settings(max_examples_per_site=400)).value
    assert ring.choose_scale_bits(10, small) == 41
    # ten sites' statistics summed in the ring decode within 10 · 2^-42 of the float sum
    rng = np.random.default_rng(3)
    parts = rng.uniform(-400, 400, size=(10, 2000))
    total = np.zeros(2000, dtype=np.uint64)
    for part in parts:
        total += ring.encode(part, scale_bits=41, bound=small)
    assert np.max(np.abs(ring.decode(total, scale_bits=41) - parts.sum(axis=0))) <= 10 * 2.0**-42


@pytest.mark.parametrize("head", ["learnable", "fixed"])
def test_a_head_without_unit_norm_falls_back(head: str) -> None:
    fallback = statistics_bound(_settings(head, max_examples_per_site=400))
    assert (fallback.source, fallback.value) == ("fallback", FALLBACK_STATISTICS_BOUND)
    assert "set [secure_aggregation] statistics_bound" in fallback.describe()
    assert statistics_entry_bound(head, 400) == FALLBACK_STATISTICS_BOUND


def test_a_configured_bound_overrides_and_bounds_the_evaluation_jobs() -> None:
    base = _settings(max_examples_per_site=400)
    assert evaluation_bound(base) == FALLBACK_STATISTICS_BOUND  # counts: unchanged default
    configured = replace(base, secagg=SecAggSettings(statistics_bound=5e5))
    got = statistics_bound(configured)
    assert (got.source, got.value) == ("configured", 5e5)
    assert evaluation_bound(configured) == 5e5


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_statistics_bound_is_refused(bad: float) -> None:
    assert SecAggSettings().statistics_bound == 0  # derived by default
    with pytest.raises(ValueError, match="statistics_bound"):
        SecAggSettings(statistics_bound=bad)
