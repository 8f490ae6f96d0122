"""A hostile coordinator reading a site's counts through the bounds it chooses.

Every secure job's spec carries the bound on each entry of a site's input, and the
coordinator chooses it per job. Where the input holds a count — an evaluation's total
and correct counts, unit-norm statistics (every entry at most the example count), a
training update's weight — a site that refused an input above the bound would answer
"do you hold more than B examples?" on its own, past secure aggregation and any noise:
exactly, once per job, at bounds the coordinator picks (``test_refusal_oracle.py``
makes such a refusal cost the release; it still says what it says). So a site fits its
input to the bound whatever its count: it evaluates, or computes its statistics on, a
uniformly random subset of the size that fits, and weights its update by the largest
count up to its released weight that fits; only its own log says so.

Played by :class:`tests.security.hostile_ring.HostileRing` around a real
:class:`ParticipantRunner` (real trainer, data, crypto, SQLite release ledger) with
colluding others whose inputs are zero, so the sum is the target's input: for bounds
just below, at and above the site's count, and tiny ones, the site sends, and what it
sent counts ``min(count, what fits)`` — computed here from the data and the bound, not
by the site's code. Each has its mutation check: without the fit (the subset patched
back to the whole split, the weight left as released) the site refuses again.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.settings import ModelSettings
from spherecal.participant import evaluation_task, example_weight, trainer, training_task
from spherecal.participant.data import LocalData
from spherecal.participant.failures import WITHHELD_TEXT
from spherecal.participant.trainer import LocalTrainer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.stats import UNIT_NORM_SLACK, ccvr_layout_size, ffc_layout_size
from tests.security.hostile_ring import HostileRing, RingJob, make_job, run_target, target_settings
from tests.security.test_differencing import _evaluate, _evaluation_job

ROSTER = ("p0", "p1", "p2", "p3")


def _ledger(tmp: Path) -> list[dict[str, object]]:
    conn = sqlite3.connect(tmp / "state" / "privacy.db")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM site_releases")]
    finally:
        conn.close()


def _no_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutation: every "random subset" is the whole split (the site as it was)."""

    def whole(n: int, m: int, rng: np.random.Generator | None = None) -> npt.NDArray[np.int64]:
        return np.arange(n, dtype=np.int64)

    monkeypatch.setattr(trainer, "random_subset", whole)


def _assert_refused_as_before(ring: HostileRing, task_id: str, tmp: Path) -> None:
    (report,) = [f for f in ring.failures if f.task_id == task_id]
    assert pb.FailureKind.Name(report.kind) == "BAD_INPUT"
    assert report.reason == WITHHELD_TEXT
    (row,) = _ledger(tmp)
    assert row["answer"] == "refusal"


# ====================================================================== evaluation
def _split(data: LocalData, split: str) -> npt.NDArray[np.int64]:
    y = data.test_y if split == "test" else data.val_y
    assert y is not None
    return np.asarray(y.numpy(), dtype=np.int64)


def _classes(model: GlobalModel, split: str) -> list[int]:
    """Constant heads: every class on the validation split (their counts then add up
    to the total), two on the test split (``max_evaluation_heads``)."""
    return list(range(model.num_classes)) if split == "validation" else [0, 1]


def _bounded_evaluation(
    tmp: Path, model: GlobalModel, data: LocalData, split: str, bound: float
) -> tuple[HostileRing, RingJob]:
    """One secure evaluation of constant heads with the job's bound set to ``bound``
    (the noise room as an honest coordinator sizes it)."""
    classes = _classes(model, split)
    sized, _ = _evaluation_job(ROSTER, len(classes))
    job = make_job(
        ROSTER,
        sized.spec.length,
        scale_bits=sized.spec.scale_bits,
        noise_bound=sized.spec.noise_bound,
        bound=float(bound),
    )
    code = pb.SPLIT_TEST if split == "test" else pb.SPLIT_VALIDATION
    ring = HostileRing(federation="fed", model=model)
    ring.script = [_evaluate(ring, model, "eval", job, classes, split=code)]
    run_target(target_settings(tmp), ring, data)
    return ring, job


def _pin_evaluation_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The site's noise draw is pinned to zero so that the test reads the counts it
    sent exactly; the release is still planned, recorded and charged as noised."""
    monkeypatch.setattr(
        evaluation_task, "sample_noise", lambda plan: np.zeros(plan.length, dtype=np.int64)
    )


def _bounds(n: int) -> list[float]:
    return [n - 1, n, n + 1, n - 0.5, 0.5, 3.0]


@pytest.mark.parametrize("split", ["test", "validation"])
@pytest.mark.parametrize("offset", range(6))
def test_an_evaluation_fits_any_bound_and_stays_a_noised_release(
    tmp_path: Path,
    model: GlobalModel,
    data: LocalData,
    monkeypatch: pytest.MonkeyPatch,
    split: str,
    offset: int,
) -> None:
    labels = _split(data, split)
    n = labels.shape[0]
    bound = _bounds(n)[offset]
    _pin_evaluation_noise(monkeypatch)
    ring, job = _bounded_evaluation(tmp_path, model, data, split, bound)
    assert ring.failures == []  # the site sent, whatever the bound
    release = job.target_release()
    expected_total = min(n, math.floor(bound))
    assert release[0] == expected_total
    heads = release[2:]
    classes = _classes(model, split)
    truth = np.array([np.sum(labels == c) for c in classes], dtype=np.float64)
    assert np.all(release[1:] <= expected_total) and np.all(heads <= truth)
    if split == "validation":  # every class: the heads' counts are the subset's histogram
        assert heads.sum() == expected_total
    if expected_total == n:
        np.testing.assert_array_equal(heads, truth)  # the whole split, as before
    (row,) = _ledger(tmp_path)
    assert row["state"] == "released" and row["answer"] == "input"
    assert row["kind"] == "evaluate" and row["noised"] == 1
    assert isinstance(row["epsilon"], float) and 0 < row["epsilon"] < np.inf


def test_an_evaluation_below_the_split_size_carries_the_sites_noise(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """Unpinned: the counts of the random subset leave with the site's own noise,
    within its hard bound."""
    n = _split(data, "test").shape[0]
    ring, job = _bounded_evaluation(tmp_path, model, data, "test", n - 1)
    assert ring.failures == []
    noise_bound = job.spec.noise_bound / 2.0**job.spec.scale_bits
    assert abs(job.target_release()[0] - (n - 1)) <= noise_bound


def test_mutation_an_evaluation_of_the_whole_split_refuses_below_its_size(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the fit, the bound one below the split's size is refused (and the one
    at it is not, in the test above): the exact size, one bit per evaluation."""
    _pin_evaluation_noise(monkeypatch)
    _no_fit(monkeypatch)
    n = _split(data, "test").shape[0]
    ring, job = _bounded_evaluation(tmp_path, model, data, "test", n - 1)
    assert job.result is None
    _assert_refused_as_before(ring, "eval", tmp_path)


# ====================================================================== statistics
def _fits(bound: float, n: int) -> int:
    """The most examples whose unit-norm statistics fit ``bound``, found here by
    trying every count up to ``n`` (``|entry| <= m(1 + slack)``): independent of the
    site's inversion."""
    counts = np.arange(n + 1)
    return int(counts[counts * (1.0 + UNIT_NORM_SLACK) <= bound].max())


def _bounded_statistics(
    tmp: Path, model: GlobalModel, data: LocalData, kind: pb.StatisticsKind, bound: float
) -> tuple[HostileRing, RingJob]:
    d, c = model.feature_dim, model.num_classes
    length = ffc_layout_size(d, c) if kind == pb.FFC else ccvr_layout_size(d, c)
    job = make_job(ROSTER, length, bound=float(bound))
    ring = HostileRing(federation="fed", model=model)
    name = "ffc" if kind == pb.FFC else "ccvr"
    ref = ring.publish("model", model.initial_vector)
    ring.script = [
        pb.Instruction(
            task_id="stats",
            statistics=pb.StatisticsTask(kind=kind, model=ref, secure=ring.secure(job, name)),
        )
    ]
    run_target(target_settings(tmp), ring, data)
    return ring, job


def _statistics_bounds(n: int) -> list[float]:
    exact = n * (1.0 + UNIT_NORM_SLACK)  # the bound a coordinator declaring n derives
    return [n - 1, n, n + 1, exact, float(np.nextafter(exact, 0.0)), exact + 1.5, 2.0, 0.5]


@pytest.mark.parametrize("offset", range(8))
def test_exact_unit_norm_statistics_fit_any_bound(
    tmp_path: Path, model: GlobalModel, data: LocalData, offset: int
) -> None:
    n = data.train_size
    bound = _statistics_bounds(n)[offset]
    ring, job = _bounded_statistics(tmp_path, model, data, pb.FFC, bound)
    assert ring.failures == []
    release = job.target_release()
    expected = min(n, _fits(bound, n))
    assert release[0] == pytest.approx(expected, abs=1e-6)  # FFC's count
    d = model.feature_dim
    rows, cols = np.triu_indices(d)
    trace = release[1 : 1 + rows.shape[0]][rows == cols].sum()
    assert trace == pytest.approx(expected, abs=1e-3)  # Σ‖z‖² of that many unit features
    assert np.max(np.abs(release)) <= bound
    (row,) = _ledger(tmp_path)
    assert row["state"] == "released" and row["answer"] == "input" and row["kind"] == "ffc"


def test_ccvr_below_the_count_is_a_subset_of_the_sites_classes(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    n = data.train_size
    ring, job = _bounded_statistics(tmp_path, model, data, pb.CCVR, n - 1)
    assert ring.failures == []
    counts = job.target_release()[: model.num_classes]
    truth = np.bincount(data.train_y.numpy(), minlength=model.num_classes)
    assert counts.sum() == pytest.approx(_fits(n - 1, n), abs=1e-6)
    assert np.all(counts <= truth + 1e-6)


def test_the_count_of_a_head_that_does_not_bound_its_features_fits_any_bound(
    tmp_path: Path, data: LocalData
) -> None:
    """A ``learnable`` head bounds no ``‖z‖``, but FFC's first entry is still the
    example count, and at the initial weights its features are small enough that the
    count is the largest entry. Until 2026-11-27 only unit-norm heads fitted it: a
    coordinator that chose a ``learnable`` head read the count from the refusal at a
    bound one below it. Now its counts fit any bound like a unit-norm head's (a
    random subset), and only a feature entry outside the bound is refused."""
    learnable = GlobalModel(ModelSettings(extractor="mlp", head="learnable").spec(0))
    n = data.train_size
    ring, job = _bounded_statistics(tmp_path, learnable, data, pb.FFC, n - 1)
    assert ring.failures == []
    release = job.target_release()
    assert release[0] == pytest.approx(_fits(n - 1, n), abs=1e-6)  # the count, fitted
    assert np.max(np.abs(release)) <= n - 1
    (row,) = _ledger(tmp_path)
    assert row["state"] == "released" and row["answer"] == "input"


def test_mutation_statistics_of_the_whole_split_refuse_below_its_count(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_fit(monkeypatch)
    n = data.train_size
    ring, job = _bounded_statistics(tmp_path, model, data, pb.FFC, n - 1)
    assert job.result is None
    _assert_refused_as_before(ring, "stats", tmp_path)


# ====================================================================== training
DRAW = 3
"""The site's training-weight noise, pinned: ñ = n + 3."""


def _bounded_round(
    tmp: Path,
    model: GlobalModel,
    data: LocalData,
    bound: float,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[HostileRing, RingJob]:
    monkeypatch.setattr(example_weight, "sample_noise", lambda plan: np.array([DRAW]))
    ring = HostileRing(federation="fed", model=model)
    job = make_job(ROSTER, model.length + 2, bound=float(bound))
    ring.script = [
        pb.Instruction(
            task_id="train",
            train=pb.TrainTask(
                round=0,
                model=ring.publish("global", model.initial_vector),
                seed=7,
                secure=ring.secure(job, "update"),
            ),
        )
    ]
    run_target(target_settings(tmp), ring, data)
    return ring, job


@pytest.mark.parametrize("offset", [-1, 0, 1, 2])
def test_a_training_weight_above_the_bound_is_fitted_not_refused(
    tmp_path: Path,
    model: GlobalModel,
    data: LocalData,
    monkeypatch: pytest.MonkeyPatch,
    offset: int,
) -> None:
    """Bounds around the released weight ñ = n + 3: the weight sent is
    ``min(ñ, ⌊B⌋)`` and the update is weighted by it (FedAvg's ``w·Δ``)."""
    n = data.train_size
    released = n + DRAW
    bound = released + offset
    ring, job = _bounded_round(tmp_path, model, data, bound, monkeypatch)
    assert ring.failures == []
    sent = job.target_release()
    weight = min(released, math.floor(bound))
    assert sent[model.length] == weight
    local = LocalTrainer(ring.joined, data).train(model.initial_vector, 7)
    expected = local.payload["delta"] * weight / n
    np.testing.assert_allclose(sent[: model.length], expected, rtol=0, atol=1e-4)
    assert sent[-1] == pytest.approx(local.mean_loss, abs=1e-6)
    (row,) = _ledger(tmp_path)
    assert row["state"] == "released" and row["answer"] == "input" and row["kind"] == "update"


@pytest.mark.parametrize("bound", [1.0, 0.25])
def test_a_tiny_bound_gets_a_small_weight_and_a_clipped_loss(
    tmp_path: Path,
    model: GlobalModel,
    data: LocalData,
    monkeypatch: pytest.MonkeyPatch,
    bound: float,
) -> None:
    """B = 1: a weight of 1 (the update is the site's mean ``Δ``, within the bound).
    B = 1/4: a weight of 0 (nothing of the update) and the loss (≈ 0.5) clipped to
    the bound. Nothing refused."""
    ring, job = _bounded_round(tmp_path, model, data, bound, monkeypatch)
    assert ring.failures == []
    sent = job.target_release()
    local = LocalTrainer(ring.joined, data).train(model.initial_vector, 7)
    weight = math.floor(bound)
    assert sent[model.length] == weight
    assert sent[-1] == pytest.approx(min(local.mean_loss, bound), abs=1e-6)
    assert local.mean_loss > 0.25  # there is a loss to clip at the smaller bound
    n = data.train_size
    expected = local.payload["delta"] * weight / n
    np.testing.assert_allclose(sent[: model.length], expected, rtol=0, atol=1e-4)


def test_mutation_the_released_weight_above_the_bound_refuses(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training_task, "weight_within_bound", lambda *args: args[3])
    ring, job = _bounded_round(tmp_path, model, data, data.train_size + DRAW - 1, monkeypatch)
    assert job.result is None
    _assert_refused_as_before(ring, "train", tmp_path)
