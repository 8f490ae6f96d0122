"""A DP job's public bound on a site's examples is met by sampling, never by refusing.

Why: a refusal because the site holds more than the job's ``max_examples`` costs no
release and no ε, and the coordinator chooses the bound per job — asking again with
other bounds, a binary search gives the site's exact count. So a site above the bound
contributes a uniformly random subset of exactly ``max_examples`` of its training
examples, drawn with its own randomness, and only its own log says so.

* :func:`random_subset`: size, uniqueness, range, order, freshness, uniformity;
* :meth:`LocalTrainer.private_statistics` on the digits split (1,213 examples): the
  count the statistics carry is the bound when the split is larger and the split's
  size otherwise, and the statistics are exactly those of the drawn rows;
* a DP calibration release and a distributed DP-SGD step with a bound below the
  site's count: admitted and computed (nothing refused), within the job's bound — an
  encode into the job's ring succeeds, where the whole split's would overflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
import torch

from spherecal.crypto import EncodingOverflow, JobSpec
from spherecal.crypto.ring import encode
from spherecal.participant.distributed_dpsgd import admit_step, distributed_step, step_input
from spherecal.participant.dp_gate import ParticipantPrivacy
from spherecal.participant.release_ledger import LedgerRules
from spherecal.participant.statistics_task import _private_statistics
from spherecal.participant.trainer import LocalTrainer, random_subset
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.fl import count_correct, state_vector
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.dpsgd_step import clipped_gradient_sum
from spherecal.spherefed.privacy.plan import plan_calibration_release
from spherecal.spherefed.privacy.sensitivity import exact_ccvr_statistics
from spherecal.spherefed.privacy.settings import PrivacySettings
from spherecal.spherefed.stats import (
    CCVRStatistics,
    FFCStatistics,
    ccvr_statistics,
    ffc_statistics,
)
from tests.unit.participant.helpers import digits_trainer

IDS = ["p0", "p1", "p2"]
QUANT_BITS = 10


@pytest.fixture(scope="module")
def trainer() -> LocalTrainer:
    torch.manual_seed(0)
    return digits_trainer()


def _vector(trainer: LocalTrainer) -> npt.NDArray[np.float64]:
    return state_vector(trainer.model, trainer.keys).astype(np.float64)


def _count(trainer: LocalTrainer, kind: str, packed: npt.NDArray[np.float64]) -> float:
    """The example count packed statistics carry (FFC's count, CCVR's Σ_c N_c)."""
    d, c = trainer.feature_dim, trainer.num_classes
    if kind == "ffc":
        return FFCStatistics.unpack(packed, d, c, isometric=True).count
    return float(CCVRStatistics.unpack(packed, d, c, isometric=True).counts.sum())


# ----------------------------------------------------------------- random_subset
@pytest.mark.parametrize(("n", "m"), [(1000, 10), (1000, 999), (50, 1), (3, 0)])
def test_a_random_subset_is_m_distinct_indices_in_range_and_in_order(n: int, m: int) -> None:
    idx = random_subset(n, m)
    assert idx.dtype == np.int64 and idx.shape == (m,)
    assert np.unique(idx).shape == (m,)
    assert np.all(np.diff(idx) > 0)
    assert m == 0 or (idx.min() >= 0 and idx.max() < n)


@pytest.mark.parametrize(("n", "m"), [(7, 7), (7, 100), (0, 5)])
def test_at_or_below_the_bound_every_index_is_kept_in_order(n: int, m: int) -> None:
    np.testing.assert_array_equal(random_subset(n, m), np.arange(n))


def test_a_random_subset_is_drawn_afresh_and_uniformly() -> None:
    draws = [random_subset(1000, 10) for _ in range(4)]
    assert any(not np.array_equal(draws[0], d) for d in draws[1:])  # equal: prob. ~1e-70
    # each of 10 records is drawn in 3/10 of 3,000 subsets: 900 ± 25 (sd); 6 sd allowed
    counts = np.bincount(np.concatenate([random_subset(10, 3) for _ in range(3000)]))
    assert counts.shape == (10,)
    assert np.all(np.abs(counts - 900) < 6 * np.sqrt(3000 * 0.3 * 0.7))


def test_a_random_subset_follows_a_given_generator() -> None:
    a = random_subset(500, 20, np.random.default_rng(5))
    b = random_subset(500, 20, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)


def test_negative_sizes_are_errors() -> None:
    with pytest.raises(ValueError, match="m=-1"):
        random_subset(5, -1)


# ----------------------------------------------------------------- private statistics
@pytest.mark.parametrize("kind", ["ffc", "ccvr"])
def test_private_statistics_count_at_most_the_public_bound(
    trainer: LocalTrainer, kind: str
) -> None:
    vector, n = _vector(trainer), trainer.data.train_size
    assert n == 1213
    below = trainer.private_statistics(vector, kind, quant_bits=QUANT_BITS, max_examples=100)
    assert _count(trainer, kind, below) == 100
    above = trainer.private_statistics(vector, kind, quant_bits=QUANT_BITS, max_examples=5000)
    unbounded = trainer.private_statistics(vector, kind, quant_bits=QUANT_BITS)
    assert _count(trainer, kind, above) == n
    np.testing.assert_array_equal(above, unbounded)  # the whole split, nothing drawn


def test_private_statistics_are_those_of_the_drawn_rows(trainer: LocalTrainer) -> None:
    vector, n, m = _vector(trainer), trainer.data.train_size, 100
    got = trainer.private_statistics(
        vector, "ccvr", quant_bits=QUANT_BITS, max_examples=m, rng=np.random.default_rng(11)
    )
    rows = torch.from_numpy(random_subset(n, m, np.random.default_rng(11)))
    x, y = trainer.data.train_x[rows], trainer.data.train_y[rows].numpy()
    want = exact_ccvr_statistics(trainer.features(x), y, trainer.num_classes, quant_bits=QUANT_BITS)
    np.testing.assert_array_equal(got, want.pack(isometric=True))
    np.testing.assert_array_equal(
        CCVRStatistics.unpack(got, trainer.feature_dim, trainer.num_classes, isometric=True).counts,
        np.bincount(y, minlength=trainer.num_classes),
    )
    # the site's own draws: three releases, three subsets
    fresh = [
        trainer.private_statistics(vector, "ffc", quant_bits=QUANT_BITS, max_examples=m)
        for _ in range(3)
    ]
    assert all(_count(trainer, "ffc", f) == m for f in fresh)
    assert not (np.array_equal(fresh[0], fresh[1]) and np.array_equal(fresh[0], fresh[2]))


# ----------------------------------------------------------------- a secure job's bound
@pytest.mark.parametrize("kind", ["ffc", "ccvr"])
def test_exact_statistics_are_those_of_the_drawn_rows(trainer: LocalTrainer, kind: str) -> None:
    """Fitted to a secure job's bound (``statistics_task``): the exact statistics of a
    random ``max_examples`` of the rows, the whole split at or above its size."""
    vector, n, m = _vector(trainer), trainer.data.train_size, 100
    got = trainer.statistics(vector, kind, max_examples=m, rng=np.random.default_rng(3))
    rows = torch.from_numpy(random_subset(n, m, np.random.default_rng(3)))
    z = trainer.features(trainer.data.train_x[rows])
    y = trainer.data.train_y[rows].numpy()
    want = ffc_statistics(z, y, trainer.num_classes) if kind == "ffc" else None
    if want is None:
        np.testing.assert_array_equal(got, ccvr_statistics(z, y, trainer.num_classes).pack())
    else:
        np.testing.assert_array_equal(got, want.pack())
    whole = trainer.statistics(vector, kind)
    np.testing.assert_array_equal(trainer.statistics(vector, kind, max_examples=n), whole)
    assert trainer.statistics(vector, kind, max_examples=0).max() == 0.0  # no rows: zeros


@pytest.mark.parametrize("split", ["test", "validation"])
def test_an_evaluation_counts_the_drawn_rows(trainer: LocalTrainer, split: str) -> None:
    """Fitted to a secure job's bound (``evaluation_task``): the total is
    ``max_examples`` and the model's correct count is that of the drawn rows."""
    vector = _vector(trainer)
    data = trainer.data
    x, y = (data.test_x, data.test_y) if split == "test" else (data.val_x, data.val_y)
    if x is None or y is None:
        pytest.skip("no validation split")
    n, m = int(y.shape[0]), 17
    total, counts = trainer.evaluate(
        vector, {}, split=split, max_examples=m, rng=np.random.default_rng(4)
    )
    rows = torch.from_numpy(random_subset(n, m, np.random.default_rng(4)))
    trainer.load(vector)
    assert total == m
    assert counts["none"] == count_correct(trainer.model, x[rows], y[rows], 512)
    assert trainer.evaluate(vector, {}, split=split, max_examples=n) == trainer.evaluate(
        vector, {}, split=split
    )
    assert trainer.evaluate(vector, {}, split=split, max_examples=0) == (0, {"none": 0})


# ----------------------------------------------------------------- the site's tasks
class _Secure:
    """The secure session's calls a DP task makes, recorded."""

    def __init__(self) -> None:
        self.inputs: list[npt.NDArray[np.float64]] = []
        self.abandoned: list[BaseException] = []

    def start(self, task_id: str, job: pb.SecAggJob, **kwargs: Any) -> object:
        return object()

    def set_input(
        self, task_id: str, session: object, vector: npt.NDArray[np.float64], **kwargs: Any
    ) -> None:
        self.inputs.append(np.array(vector))

    def abandon(self, task_id: str, session: object, exc: BaseException) -> None:
        self.abandoned.append(exc)


class _Releases:
    rules = LedgerRules()

    def annotate(self, key: str, **fields: Any) -> None:
        pass

    def record_executed(self, key: str, digest: bytes) -> None:
        pass


class _Runner:
    """What ``_private_statistics`` uses of a participant runner."""

    def __init__(self, trainer: LocalTrainer, privacy: ParticipantPrivacy) -> None:
        self.trainer, self.privacy, self.data = trainer, privacy, trainer.data
        self.secure, self.releases = _Secure(), _Releases()
        self.messages: list[str] = []
        self.refusals: list[BaseException] = []

    def _trainer(self) -> LocalTrainer:
        return self.trainer

    def _refuse(self, task_id: str, exc: BaseException) -> None:
        self.refusals.append(exc)

    def _download(self, ref: pb.TensorRef, shape: tuple[int, ...]) -> npt.NDArray[np.float64]:
        return _vector(self.trainer)

    def _federation(self) -> str:
        return "f"

    def log(self, message: str) -> None:
        self.messages.append(message)


def test_a_dp_release_above_the_bound_is_computed_from_a_subset_not_refused(
    trainer: LocalTrainer, tmp_path: Path
) -> None:
    bound = 100  # the site holds 1,213
    plan = plan_calibration_release(
        "ffc",
        dim=trainer.feature_dim,
        num_classes=trainer.num_classes,
        participants=len(IDS),
        min_contributors=3,
        epsilon_target=1.0,
        delta=1e-5,
        max_examples=bound,
        quant_bits=QUANT_BITS,
    )
    spec = JobSpec.create(IDS, threshold=3, **plan.job_spec_arguments())
    release = pb.DPRelease(
        kind="ffc",
        dim=trainer.feature_dim,
        num_classes=trainer.num_classes,
        participants=len(IDS),
        min_contributors=3,
        max_examples=bound,
        epsilon=1.0,
        delta=1e-5,
        mechanism=plan.mechanism,
        quant_bits=QUANT_BITS,
        colluders=0,
    )
    task = pb.StatisticsTask(
        kind=pb.FFC, secure=pb.SecAggJob(spec=spec.to_bytes()), privacy=release
    )
    privacy = ParticipantPrivacy(PrivacySettings(enabled=True, epsilon=1.0), "p0", tmp_path)
    runner = _Runner(trainer, privacy)
    _private_statistics(cast(Any, runner), "t1", task, "ffc", "release-1")
    assert runner.refusals == [] and runner.secure.abandoned == []
    (stats,) = runner.secure.inputs
    assert _count(trainer, "ffc", stats) == bound
    encode(stats, scale_bits=spec.scale_bits, bound=spec.bound, ring_bits=spec.ring_bits)
    assert any(
        "holds 1213 examples, above the job's public bound 100" in m for m in runner.messages
    )
    assert len(privacy.ledger(1e-5).store.entries("p0")) == 1
    privacy.close()


def _dpsgd_job(trainer: LocalTrainer, bound: int) -> tuple[pb.DPSGDStep, JobSpec]:
    """A step at q = 1 (every record of the subset in the batch), C = 1."""
    plan = DistributedDpsgdPlan(1.0, 1.0, max_grad_norm=1.0, min_contributors=3)
    args = plan.job_spec_arguments(trainer.length, len(IDS), bound)
    spec = JobSpec.create(IDS, threshold=3, min_participants=3, **args)
    step = pb.DPSGDStep(
        noise_multiplier=1.0,
        sample_rate=1.0,
        max_grad_norm=1.0,
        min_contributors=3,
        delta=1e-5,
        mechanism=plan.mechanism,
        scale_bits=plan.scale_bits,
        max_examples=bound,
    )
    return step, spec


def test_a_distributed_step_input_above_the_bound_stays_within_the_jobs_bound(
    trainer: LocalTrainer, tmp_path: Path
) -> None:
    bound = 10
    step, spec = _dpsgd_job(trainer, bound)
    privacy = ParticipantPrivacy(PrivacySettings(updates="distributed"), "p0", tmp_path)
    admitted = admit_step(
        privacy,
        step,
        spec,
        model_length=trainer.length,
        federation="f",
        round_index=0,
        plan_rounds=1,
    )
    clipped, noise = step_input(trainer, _vector(trainer), admitted)
    assert clipped.batch_size == bound
    encode(clipped.vector, scale_bits=spec.scale_bits, bound=spec.bound, ring_bits=spec.ring_bits)
    # what the test guards against: the whole split's clipped sum leaves the bound
    whole = clipped_gradient_sum(
        trainer.model,
        trainer.data.train_x,
        trainer.data.train_y,
        loss=trainer.config.loss,
        max_grad_norm=1.0,
        sample_rate=1.0,
        indices=np.arange(trainer.data.train_size),
    )
    with pytest.raises(EncodingOverflow):
        encode(whole.vector, scale_bits=spec.scale_bits, bound=spec.bound)
    privacy.close()


def test_a_distributed_step_above_the_bound_is_taken_not_refused(
    trainer: LocalTrainer, tmp_path: Path
) -> None:
    bound = 10
    step, spec = _dpsgd_job(trainer, bound)
    task = pb.TrainTask(round=0, secure=pb.SecAggJob(spec=spec.to_bytes()), dpsgd=step)
    privacy = ParticipantPrivacy(PrivacySettings(updates="distributed"), "p0", tmp_path)
    secure, refusals, messages = _Secure(), list[BaseException](), list[str]()
    distributed_step(
        task_id="t1",
        task=task,
        release_key="update-1",
        trainer=trainer,
        privacy=privacy,
        secure=cast(Any, secure),
        releases=cast(Any, _Releases()),
        download=lambda ref, shape: _vector(trainer),
        refuse=lambda task_id, exc: refusals.append(exc),
        log=messages.append,
        federation="f",
        plan_rounds=1,
    )
    assert refusals == [] and secure.abandoned == []
    (vector,) = secure.inputs
    encode(vector, scale_bits=spec.scale_bits, bound=spec.bound, ring_bits=spec.ring_bits)
    assert any("holds 1213 examples, above the step's public bound 10" in m for m in messages)
    privacy.close()
