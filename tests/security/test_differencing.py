"""Differencing attacks of a hostile coordinator against a real site (issue #19).

Each attack is played by :class:`tests.security.hostile_ring.HostileRing` — a
coordinator that runs real secure-aggregation jobs (real ``SecAggServer``) around a
real :class:`ParticipantRunner` (real trainer, data, policy, SQLite release ledger)
whose fellow roster members are in-process participants *colluding* with it (they
add no noise, and their inputs are known): ``sum − others`` is exactly what the
target released. Every attack ends at default ``[policy]`` in a typed refusal
(``RULE_RELEASE_REPEATED`` / ``RULE_DP_REQUIRED``) or in counts carrying the site's
own DP noise, with the release and its ε in the site's ledger; and each has its
mutation check: weakening exactly the matching rule (a ``[policy]`` key, or the
ledger's key function monkeypatched back to the old, weaker one) lets the attack
through, recovering the site's value exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.crypto.dp import guaranteed_contributors
from spherecal.participant import evaluation_task, release_ledger, release_rules
from spherecal.participant.data import LocalData
from spherecal.participant.failures import WITHHELD_TEXT
from spherecal.participant.trainer import LocalTrainer
from spherecal.proto import spherecal_pb2 as pb
from spherecal.site_audit import read_site_audit, run_site_audit
from spherecal.spherefed.privacy.evaluation_noise import (
    DEFAULT_EVALUATION_NOISE_SD,
    evaluation_epsilon,
    plan_evaluation_noise,
)
from spherecal.spherefed.privacy.settings import PrivacySettings
from spherecal.spherefed.stats import ccvr_layout_size, ffc_layout_size, ffc_statistics
from tests.security.hostile_ring import (
    TARGET,
    HostileRing,
    RingJob,
    dead_unit,
    make_job,
    mlp_features,
    run_target,
    target_settings,
)

ROSTER = ("p0", "p1", "p2", "p3")
OTHER_ROSTER = ("p0", "p1", "p2", "p4")


_settings = target_settings
_run = run_target


def _ledger(tmp: Path) -> list[dict[str, object]]:
    conn = sqlite3.connect(tmp / "state" / "privacy.db")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM site_releases ORDER BY reserved")]
    finally:
        conn.close()


def _released(tmp: Path) -> list[dict[str, object]]:
    return [r for r in _ledger(tmp) if r["state"] == "released"]


# ====================================================================== evaluation
def _constant_head(ring: HostileRing, model: GlobalModel, name: str, c: int) -> pb.NamedTensorRef:
    """ "Always class c": weight 0, bias e_c — its correct count is the number of
    local examples of class c."""
    bias = np.zeros(model.num_classes)
    bias[c] = 1.0
    weight = np.zeros((model.num_classes, model.feature_dim))
    return pb.NamedTensorRef(
        name=name,
        kind=pb.HEAD_AFFINE,
        tensor=ring.publish(f"{name}-w-{c}", weight),
        bias=ring.publish(f"{name}-b-{c}", bias),
    )


def _evaluation_job(
    roster: tuple[str, ...], heads: int, *, noise_room: bool = True
) -> tuple[RingJob, float]:
    """A job sized as an honest coordinator sizes it (noise bound of the default
    plan); returns it and the bound on the noise of the target's entries."""
    length = 2 + heads
    probe = crypto.JobSpec.create(roster, threshold=len(roster) // 2 + 1, length=length, bound=1e6)
    noise = plan_evaluation_noise(
        DEFAULT_EVALUATION_NOISE_SD,
        participants=len(roster),
        min_contributors=guaranteed_contributors(probe),
        length=length,
    )
    spec: dict[str, Any] = {"scale_bits": noise.scale_bits}
    if noise_room:
        spec["noise_bound"] = noise.plan.noise_bound
    return make_job(roster, length, **spec), noise.plan.noise_bound / 2.0**noise.scale_bits


def _evaluate(
    ring: HostileRing,
    model: GlobalModel,
    task_id: str,
    job: RingJob,
    classes: list[int],
    *,
    names: str = "h",
    split: pb.EvaluationSplit = pb.SPLIT_TEST,
    vector: npt.NDArray[np.float64] | None = None,
) -> pb.Instruction:
    ref = ring.publish(f"model-{task_id}", model.initial_vector if vector is None else vector)
    heads = [_constant_head(ring, model, f"{names}{k}", c) for k, c in enumerate(classes)]
    return pb.Instruction(
        task_id=task_id,
        evaluate=pb.EvaluateTask(
            model=ref, heads=heads, round=3, split=split, secure=ring.secure(job, "evaluate")
        ),
    )


def _exact_counts(data: LocalData, classes: list[int], split: str) -> npt.NDArray[np.float64]:
    """The label histogram entries the constant heads count, computed from the data
    directly (independently of the site's evaluation code): total, then per head."""
    y = (data.test_y if split == "test" else data.val_y).numpy()  # type: ignore[union-attr]
    return np.array([len(y), *(int(np.sum(y == c)) for c in classes)], dtype=np.float64)


def _counts_attack(
    tmp: Path, model: GlobalModel, data: LocalData, split: str, **policy: object
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float]:
    """Constant heads over every class on ``split``: (what the coordinator recovers
    of the target's counts — total and per class —, the truth, the noise bound)."""
    classes = list(range(model.num_classes))
    if split == "test":
        classes = classes[:2]  # max_evaluation_heads: 2 heads a job suffice, job by job
    code = pb.SPLIT_TEST if split == "test" else pb.SPLIT_VALIDATION
    ring = HostileRing(federation="fed", model=model)
    job, bound = _evaluation_job(ROSTER, len(classes))
    ring.script = [_evaluate(ring, model, "counts", job, classes, split=code)]
    _run(_settings(tmp, **policy), ring, data)
    assert ring.failures == []
    release = job.target_release()
    recovered = np.concatenate([release[:1], release[2:]])  # drop the model's own count
    return recovered, _exact_counts(data, classes, split), bound


@pytest.mark.parametrize("split", ["test", "validation"])
def test_constant_heads_get_only_noised_counts(
    tmp_path: Path, model: GlobalModel, data: LocalData, split: str
) -> None:
    recovered, exact, bound = _counts_attack(tmp_path, model, data, split)
    assert exact[0] > 0 and exact[1:].sum() > 0  # there is a histogram to steal
    assert np.any(recovered != exact)  # never exact
    assert np.all(np.abs(recovered - exact) <= bound)  # the site's own bounded noise
    (row,) = _released(tmp_path)
    assert row["kind"] == "evaluate" and row["noised"] == 1
    assert isinstance(row["epsilon"], float) and 0 < row["epsilon"] < np.inf
    assert json.loads(str(row["survivors"])) == list(ROSTER)


@pytest.mark.parametrize("split", ["test", "validation"])
def test_mutation_exact_counts_give_the_label_histogram(
    tmp_path: Path, model: GlobalModel, data: LocalData, split: str
) -> None:
    """``[policy] evaluation_noise_sd = 0``: one job gives the exact histogram (on the
    validation split, all classes at once)."""
    recovered, exact, _ = _counts_attack(tmp_path, model, data, split, evaluation_noise_sd=0.0)
    np.testing.assert_array_equal(recovered, exact)


def test_a_job_without_room_for_the_noise_is_refused(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring = HostileRing(federation="fed", model=model)
    job, _ = _evaluation_job(ROSTER, 2, noise_room=False)
    ring.script = [_evaluate(ring, model, "no-noise", job, [0, 1])]
    _run(_settings(tmp_path), ring, data)
    assert ring.refusal("no-noise") == ("POLICY_REFUSAL", "RULE_DP_REQUIRED")
    assert job.result is None and _released(tmp_path) == []


def test_an_evaluation_is_recorded_at_the_noise_it_left_with(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The site plans an evaluation's noise, and records its ε, from the job spec the
    task comes with. An evaluation reserved under a spec of ``scale_bits`` 0 and
    refused before its keys were made (its directory lacks a member), then run under
    the same job id with ``scale_bits`` 10, left with the second plan's noise and was
    recorded with the first plan's ε: about 4.2 where it cost about 14.2, and the
    site's audit summed the 4.2."""
    length = 2 + 2
    probe = crypto.JobSpec.create(ROSTER, threshold=3, length=length, bound=1e6)
    plans = {
        bits: plan_evaluation_noise(
            DEFAULT_EVALUATION_NOISE_SD,
            participants=len(ROSTER),
            min_contributors=guaranteed_contributors(probe),
            length=length,
            scale_bits=bits,
        )
        for bits in (0, 10)
    }
    cheap, dear = (evaluation_epsilon(plans[bits]) for bits in (0, 10))
    assert dear > 3 * cheap
    reused = b"one evaluation job id"
    jobs = {
        bits: make_job(
            ROSTER,
            length,
            job_id=reused,
            scale_bits=bits,
            noise_bound=plans[bits].plan.noise_bound * 4,
        )
        for bits in (0, 10)
    }
    ring = HostileRing(federation="fed", model=model)
    first = _evaluate(ring, model, "first", jobs[0], [0, 1])
    del first.evaluate.secure.directory[-1]  # refused before any key is made
    ring.script = [first, _evaluate(ring, model, "again", jobs[10], [0, 1])]
    _run(_settings(tmp_path), ring, data)
    assert [f.task_id for f in ring.failures] == ["first"]
    assert jobs[10].result is not None
    (row,) = _released(tmp_path)
    assert row["epsilon"] == pytest.approx(dear)
    assert json.loads(str(row["noise"]))["noise_bound"] == plans[10].plan.noise_bound
    report = json.loads(run_site_audit(tmp_path / "state", as_json=True)[1])
    assert report["epsilon_total"][TARGET] == pytest.approx(dear)


def _renamed_heads(tmp: Path, model: GlobalModel, data: LocalData, **policy: object) -> HostileRing:
    """The same constant heads, renamed, over two rosters on one model."""
    ring = HostileRing(federation="fed", model=model)
    first, _ = _evaluation_job(ROSTER, 2)
    second, _ = _evaluation_job(OTHER_ROSTER, 2)
    ring.script = [
        _evaluate(ring, model, "first", first, [3, 4], names="a"),
        _evaluate(ring, model, "renamed", second, [3, 4], names="b"),
    ]
    _run(_settings(tmp, **policy), ring, data)
    return ring


def test_renamed_heads_are_the_same_evaluation(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring = _renamed_heads(tmp_path, model, data)
    assert ring.refusal("renamed") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    assert len(_released(tmp_path)) == 1


def test_mutation_names_in_the_key_admit_renamed_heads(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = evaluation_task.evaluation_content

    def with_names(task: pb.EvaluateTask) -> bytes:
        names = "\0".join(h.name for h in task.heads).encode()
        return hashlib.sha256(original(task) + names).digest()

    monkeypatch.setattr(evaluation_task, "evaluation_content", with_names)
    ring = _renamed_heads(tmp_path, model, data)
    assert ring.failures == []
    assert len(_released(tmp_path)) == 2


def test_near_constant_heads_count_the_same_labels(model: GlobalModel, data: LocalData) -> None:
    """Why feature-independent heads are not refused: a head with a 1e-9 weight and
    the same bias predicts the same class everywhere, so a refusal of zero weights
    would be cosmetic; the noise protects the counts whatever the heads."""
    from spherecal.spherefed.discriminant import CalibratedHead

    trainer = LocalTrainer(
        HostileRing(federation="f", model=model).join(pb.JoinRequest()).plan, data
    )
    bias = np.zeros(model.num_classes)
    bias[2] = 1.0
    zero = CalibratedHead(weight=np.zeros((model.num_classes, model.feature_dim)), bias=bias)
    tiny = CalibratedHead(
        weight=np.full((model.num_classes, model.feature_dim), 1e-9), bias=bias.copy()
    )
    _, counts = trainer.evaluate(model.initial_vector, {"zero": zero, "tiny": tiny})
    assert counts["zero"] == counts["tiny"] == int(np.sum(data.test_y.numpy() == 2))


# ====================================================================== statistics
def _statistics(
    ring: HostileRing,
    task_id: str,
    kind: pb.StatisticsKind,
    job: RingJob,
    vector: npt.NDArray[np.float64],
) -> pb.Instruction:
    ref = ring.publish(f"model-{task_id}", vector)
    name = "ffc" if kind == pb.FFC else "ccvr"
    return pb.Instruction(
        task_id=task_id,
        statistics=pb.StatisticsTask(kind=kind, model=ref, secure=ring.secure(job, name)),
    )


def _ffc_then_ccvr(tmp: Path, model: GlobalModel, data: LocalData) -> HostileRing:
    d, c = model.feature_dim, model.num_classes
    ring = HostileRing(federation="fed", model=model)
    ffc = make_job(ROSTER, ffc_layout_size(d, c))
    ccvr = make_job(OTHER_ROSTER, ccvr_layout_size(d, c))
    ring.script = [
        _statistics(ring, "ffc", pb.FFC, ffc, model.initial_vector),
        _statistics(ring, "ccvr", pb.CCVR, ccvr, model.initial_vector),
    ]
    _run(_settings(tmp), ring, data)
    assert ffc.result is not None  # the first release is a real, finished sum
    return ring


def test_ccvr_after_ffc_is_the_same_release(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring = _ffc_then_ccvr(tmp_path, model, data)
    assert ring.refusal("ccvr") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    assert [r["kind"] for r in _released(tmp_path)] == ["ffc"]


def test_mutation_separate_kinds_let_ccvr_difference_ffc(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(release_rules, "family_of", lambda kind: kind)
    ring = _ffc_then_ccvr(tmp_path, model, data)
    assert ring.failures == []
    assert [r["kind"] for r in _released(tmp_path)] == ["ffc", "ccvr"]


def _one_ulp(vector: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    moved = np.array(vector, dtype=np.float64)
    moved[0] = np.nextafter(moved[0], np.inf)
    assert moved[0] != vector[0] and np.float32(moved[0]) == np.float32(vector[0])
    return moved


def _renamed_federation(
    tmp: Path,
    model: GlobalModel,
    data: LocalData,
    second: npt.NDArray[np.float64],
    **policy: object,
) -> tuple[HostileRing, RingJob, RingJob]:
    """FFC in federation A; the restarted site asked again in federation B."""
    length = ffc_layout_size(model.feature_dim, model.num_classes)
    first_ring = HostileRing(federation="fed-A", model=model)
    a = make_job(ROSTER, length)
    first_ring.script = [_statistics(first_ring, "a", pb.FFC, a, model.initial_vector)]
    _run(_settings(tmp, **policy), first_ring, data)
    ring = HostileRing(federation="fed-B", model=model)
    b = make_job(OTHER_ROSTER, length)
    ring.script = [_statistics(ring, "b", pb.FFC, b, second)]
    _run(_settings(tmp, **policy), ring, data)
    return ring, a, b


def test_a_one_ulp_model_under_a_renamed_federation_is_the_same_model(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """With the data rule relaxed, the executed-model digest alone refuses it."""
    ring, a, b = _renamed_federation(
        tmp_path, model, data, _one_ulp(model.initial_vector), reuse_data_across_federations=True
    )
    assert a.result is not None and b.result is None
    assert ring.refusal("b") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")


def test_mutation_a_digest_of_the_float64_bytes_releases_identical_statistics(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    def raw(_self: LocalTrainer, vector: npt.NDArray[np.float64]) -> bytes:
        return hashlib.sha256(np.asarray(vector, dtype=np.float64).tobytes()).digest()

    monkeypatch.setattr(LocalTrainer, "executed_digest", raw)
    ring, a, b = _renamed_federation(
        tmp_path, model, data, _one_ulp(model.initial_vector), reuse_data_across_federations=True
    )
    assert ring.failures == []
    # the "new" model's statistics are bit-identical: differencing is exact
    np.testing.assert_array_equal(a.target_release(), b.target_release())


def test_a_new_federation_on_the_same_data_needs_noise(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """A genuinely different model under another federation name: the data rule."""
    ring, a, b = _renamed_federation(tmp_path, model, data, model.initial_vector + 1e-3)
    assert ring.refusal("b") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    assert b.result is None


def test_mutation_reusing_data_across_federations_releases_again(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring, a, b = _renamed_federation(
        tmp_path, model, data, model.initial_vector + 1e-3, reuse_data_across_federations=True
    )
    assert ring.failures == [] and b.result is not None


def test_a_key_reserved_for_a_noised_release_admits_no_exact_one(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The coordinator picks job ids. A statistics task with a DP plan that the site
    refuses once its release is reserved (the plan names another kind) leaves the key
    reserved as a noised release; the exact statistics asked next under the same job
    id passed the key check (the noise was no part of it), left, and were recorded as
    noised. The site's audit then showed no exact release, and the rule that refuses
    the same data's exact moments in a second federation, which counts exact releases
    only, let them leave again — from a model with the same features, over a roster
    one site different: differencing gave the site's exact statistics. The key now
    admits only the release it was reserved for; the exact statistics leave under a
    key of their own, recorded as exact, and the second federation is refused."""
    length = ffc_layout_size(model.feature_dim, model.num_classes)
    reused = b"one job id, two releases"
    ring = HostileRing(federation="fed-A", model=model)
    noised = make_job(ROSTER, length, job_id=reused)
    exact = make_job(ROSTER, length, job_id=reused)
    fresh = make_job(ROSTER, length)
    planned = _statistics(ring, "dp", pb.FFC, noised, dead_unit(model, 0.0))
    planned.statistics.privacy.CopyFrom(pb.DPRelease(kind="ccvr", epsilon=1.0))
    ring.script = [
        planned,
        _statistics(ring, "exact", pb.FFC, exact, dead_unit(model, 0.0)),
        _statistics(ring, "fresh", pb.FFC, fresh, dead_unit(model, 0.0)),
    ]
    _run(_settings(tmp_path), ring, data)
    assert ring.refusal("dp") == ("POLICY_REFUSAL", "RULE_DP_PLAN")
    assert ring.refusal("exact") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    assert fresh.result is not None
    second = HostileRing(federation="fed-B", model=model)
    b = make_job(OTHER_ROSTER, length)
    second.script = [_statistics(second, "b", pb.FFC, b, dead_unit(model, 0.5))]
    _run(_settings(tmp_path), second, data)
    assert second.refusal("b") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    assert b.result is None
    # what left is recorded as it left: one exact release
    assert [(r["federation"], r["noised"]) for r in _released(tmp_path)] == [("fed-A", 0)]
    (moments,) = [r for r in read_site_audit(tmp_path / "state").releases if r.state == "released"]
    assert not moments.noised


def test_the_site_audit_pairs_exact_moments_of_the_same_data_from_two_models(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """With ``[policy] reuse_data_across_federations`` (a logged weakening), exact
    moments of the same data leave in a second federation from a model whose
    features are the first one's (a dead unit's outgoing weights changed), over a
    roster one site different: the two sums give the site's statistics, bit for bit.
    The site's audit listed neither a differencing pair (the executed models differ)
    nor changed data (the data did not): "OK", exit 0. It now pairs them, as the rule
    that the weakening relaxed refuses them."""
    length = ffc_layout_size(model.feature_dim, model.num_classes)
    jobs = []
    for name, roster, outgoing in (("fed-A", ROSTER, 0.0), ("fed-B", OTHER_ROSTER, 0.5)):
        ring = HostileRing(federation=name, model=model)
        job = make_job(roster, length)
        ring.script = [_statistics(ring, name, pb.FFC, job, dead_unit(model, outgoing))]
        _run(_settings(tmp_path, reuse_data_across_federations=True), ring, data)
        assert ring.failures == []
        jobs.append(job)
    np.testing.assert_array_equal(jobs[0].target_release(), jobs[1].target_release())
    audit = read_site_audit(tmp_path / "state")
    assert len({r.model for r in audit.releases}) == 2 and audit.changed_data == []
    (pair,) = audit.pairs
    assert pair.exact and pair.family == "moments"
    assert (pair.only_in_first, pair.only_in_second) == (["p3"], ["p4"])
    assert "same data" in pair.why
    assert run_site_audit(tmp_path / "state")[0] == 1


# ====================================================================== data that grew
def _grown(data: LocalData) -> LocalData:
    """The site's training split six months on: one record more (the first test image)."""
    return dataclasses.replace(
        data,
        train_x=torch.cat([data.train_x, data.test_x[:1]]),
        train_y=torch.cat([data.train_y, data.test_y[:1]]),
    )


def _grown_data_in_a_new_federation(
    tmp: Path, model: GlobalModel, data: LocalData, **policy: object
) -> tuple[HostileRing, RingJob, RingJob]:
    """Exact FFC in federation A; the site's data grows by one record; FFC again in
    federation B from a model that differs only in weights the features do not read."""
    length = ffc_layout_size(model.feature_dim, model.num_classes)
    first_ring = HostileRing(federation="fed-A", model=model)
    a = make_job(ROSTER, length)
    first_ring.script = [_statistics(first_ring, "a", pb.FFC, a, dead_unit(model, 0.0))]
    _run(_settings(tmp, **policy), first_ring, data)
    ring = HostileRing(federation="fed-B", model=model)
    b = make_job(OTHER_ROSTER, length)
    ring.script = [_statistics(ring, "b", pb.FFC, b, dead_unit(model, 0.5))]
    _run(_settings(tmp, **policy), ring, _grown(data))
    assert a.result is not None  # the first release is a real, finished sum
    return ring, a, b


def test_exact_moments_of_grown_data_need_noise_in_a_new_federation(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring, _, b = _grown_data_in_a_new_federation(tmp_path, model, data)
    assert ring.refusal("b") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    assert b.result is None
    assert [r["federation"] for r in _released(tmp_path)] == ["fed-A"]


def test_mutation_exact_moments_of_changed_data_give_the_new_record(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """With the key on, the coordinator subtracts the two sums (the colluding others'
    inputs known) and reads the added record's ``z zᵀ``, ``z onehotᵀ`` and count."""
    ring, a, b = _grown_data_in_a_new_federation(
        tmp_path, model, data, exact_moments_of_changed_data=True
    )
    assert ring.failures == [] and b.result is not None
    record = data.test_x[:1].numpy().astype(np.float64)
    z = mlp_features(dead_unit(model, 0.5), record)
    label = data.test_y[:1].numpy()
    expected = ffc_statistics(z, label, model.num_classes).pack()
    recovered = b.target_release() - a.target_release()
    assert recovered[0] == pytest.approx(1.0, abs=1e-3)  # the count: one record more
    np.testing.assert_allclose(recovered, expected, atol=1e-6)  # float32 features


# ====================================================================== training
def _training_over_two_rosters(
    tmp: Path, model: GlobalModel, data: LocalData, rounds: tuple[int, int], **policy: object
) -> HostileRing:
    """Training tasks for ``rounds`` (0-based) as two secure jobs over two rosters that
    differ by one site, each from the same model with the round's seed (``7 + r``):
    one round asked twice, or two rounds of one federation — an honest dropout is
    enough for the second. With the others' inputs known, each job gives the
    target's input."""
    ring = HostileRing(federation="fed", model=model)
    ring.rounds = max(rounds) + 1
    length = model.length + 2
    jobs = [make_job(ROSTER, length), make_job(OTHER_ROSTER, length)]
    ring.script = [
        ring.train(model.initial_vector, job, round_index=r, name=k, seed=7 + r)
        for k, (r, job) in enumerate(zip(rounds, jobs, strict=True))
    ]
    _run(_settings(tmp, **policy), ring, data)
    return ring


def _repeated_round(
    tmp: Path, model: GlobalModel, data: LocalData, **policy: object
) -> HostileRing:
    """One round, one model, one seed, as two secure jobs over two rosters."""
    return _training_over_two_rosters(tmp, model, data, (0, 0), **policy)


def test_the_same_training_round_leaves_once(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring = _repeated_round(tmp_path, model, data)
    first, second = ring.jobs.values()
    assert first.result is not None and second.result is None
    assert ring.refusal("train-1") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    # the site's audit counts rounds as the coordinator's log and summary do (1-based;
    # the ledger keeps the wire's 0-based index), in its JSON, its text and the refusal
    status, text = run_site_audit(tmp_path / "state", as_json=True)
    report = json.loads(text)
    assert [r["round"] for r in report["releases"] if r["kind"] == "update"] == [1]
    (refusal,) = report["refusals"]
    assert "the update of round 1 already left this site" in refusal["reason"]
    assert " round 1 " in run_site_audit(tmp_path / "state")[1]


def test_mutation_two_updates_of_one_round_are_identical(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring = _repeated_round(tmp_path, model, data, one_update_per_round=False)
    first, second = ring.jobs.values()
    assert ring.failures == []
    # the same update twice, in two sums over rosters that differ: differencing works
    np.testing.assert_array_equal(first.target_release(), second.target_release())


def _rounds_over_two_rosters(
    tmp: Path, model: GlobalModel, data: LocalData, **policy: object
) -> tuple[HostileRing, float]:
    """Rounds 1 and 2 of one federation over two rosters: each job's ``weight``
    entry is what the site weights its update by."""
    ring = _training_over_two_rosters(tmp, model, data, (0, 1), **policy)
    assert ring.failures == []
    return ring, float(data.train_size)


def test_rounds_over_two_rosters_give_only_the_released_count(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count is the same every round, so any number of rounds gives it: the site
    sends the one value it drew for the federation, noised, kept in its ledger with
    its ε. The draw is pinned here (+3) so the test sees which value left."""
    from spherecal.participant import example_weight

    monkeypatch.setattr(example_weight, "sample_noise", lambda plan: np.array([3]))
    ring, n = _rounds_over_two_rosters(tmp_path, model, data)
    weights = [job.target_release()[model.length] for job in ring.jobs.values()]
    assert weights == [n + 3, n + 3]
    (kept,) = release_ledger.ReleaseLedger(
        tmp_path / "state" / "privacy.db", participant=TARGET
    ).example_counts()
    assert (kept.federation, kept.count, kept.released, kept.sd) == ("fed", n, n + 3, 4)
    assert kept.epsilon is not None and 0.9 < kept.epsilon < 1.1
    # the update is weighted by the same value (FedAvg's step is then Σ ñ Δ / Σ ñ):
    # round 1's delta entries are the site's own n·Δ, computed here, times (n + 3)/n
    local = LocalTrainer(ring.joined, data).train(model.initial_vector, 7)
    expected = local.payload["delta"] * (n + 3) / n
    first = next(iter(ring.jobs.values())).target_release()
    np.testing.assert_allclose(first[: model.length], expected, rtol=0, atol=1e-4)
    assert np.max(np.abs(expected)) > 1e-2
    report = json.loads(run_site_audit(tmp_path / "state", as_json=True)[1])
    assert [(c["federation"], c["sd"]) for c in report["example_counts"]] == [("fed", 4)]
    assert report["epsilon_total"][TARGET] == pytest.approx(kept.epsilon)  # no other ε here
    text = run_site_audit(tmp_path / "state", html_path=tmp_path / "site.html")[1]
    assert f"fed: {int(n) + 3} sent for {int(n)} examples (sd 4, ε=" in text
    page = (tmp_path / "site.html").read_text()
    assert "Training weights (one per federation)" in page
    assert f"<td>{int(n)}</td><td>{int(n) + 3}</td><td>4</td>" in page


def _one_round_per_federation(
    tmp: Path, model: GlobalModel, data: LocalData, names: tuple[str, ...]
) -> list[float]:
    """One training round in each of several federations on the same data (the
    site's operator starts it again for each: ``follow_new_federation`` is off),
    each over its own roster; the weight each federation's sum gave for the site. Each
    federation trains with its own seed: the same model and seed would ask for an
    update that already left, which the site refuses in any federation
    (``test_the_same_update_in_a_second_federation_is_refused``)."""
    weights = []
    for k, name in enumerate(names):
        ring = HostileRing(federation=name, model=model)
        job = make_job(ROSTER if k % 2 == 0 else OTHER_ROSTER, model.length + 2)
        ring.script = [ring.train(model.initial_vector, job, name=name, seed=7 + k)]
        _run(_settings(tmp), ring, data)
        assert ring.failures == []
        weights.append(float(job.target_release()[model.length]))
    return weights


def test_renamed_federations_on_the_same_data_get_the_same_count(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking again under new federation names is free for the coordinator; fresh
    noise each time would average to the count (sd 4/√k). The site sends its first
    draw again. The sampler is scripted (+3, −2, +5) so the test sees which left."""
    from spherecal.participant import example_weight

    draws = iter([3, -2, 5])
    monkeypatch.setattr(example_weight, "sample_noise", lambda plan: np.array([next(draws)]))
    n = float(data.train_size)
    assert _one_round_per_federation(tmp_path, model, data, ("a", "b", "c")) == [n + 3] * 3
    report = json.loads(run_site_audit(tmp_path / "state", as_json=True)[1])
    assert [c["drawn_in"] for c in report["example_counts"]] == ["a", "a", "a"]
    text = run_site_audit(tmp_path / "state")[1]
    assert text.count("sent again from a: no new release") == 2


def test_mutation_a_draw_per_federation_averages_to_the_count(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spherecal.participant import example_weight

    draws = iter([3, -2, 5])
    monkeypatch.setattr(example_weight, "sample_noise", lambda plan: np.array([next(draws)]))
    monkeypatch.setattr(release_ledger.ReleaseLedger, "example_count_of_data", lambda *_: None)
    n = float(data.train_size)
    weights = _one_round_per_federation(tmp_path, model, data, ("a", "b", "c"))
    assert weights == [n + 3, n - 2, n + 5]  # three draws: their mean is n + 2, sd 4/√3


def test_mutation_an_exact_count_leaves_in_every_round(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    ring, n = _rounds_over_two_rosters(tmp_path, model, data, example_count_noise_sd=0)
    weights = [job.target_release()[model.length] for job in ring.jobs.values()]
    assert weights == [n, n]  # the site's exact count, from either round


def _ulp_apart(vector: npt.NDArray[np.float64]) -> tuple[np.ndarray, np.ndarray]:
    """``vector`` and the same moved by one float64 ulp in every entry: the same float32
    network, other wire bytes."""
    first = np.array(vector, dtype=np.float64)
    second = np.nextafter(first, np.inf)
    assert np.all(second != first)
    assert np.array_equal(second.astype(np.float32), first.astype(np.float32))
    return first, second


def _rounds_from_one_executed_model(
    tmp: Path,
    model: GlobalModel,
    data: LocalData,
    models: tuple[np.ndarray, np.ndarray] | None = None,
    **policy: object,
) -> tuple[HostileRing, list[RingJob], list[bytes]]:
    """Rounds 1 and 2 of one federation over rosters that differ by one site, from one
    executed model with one seed: the two rounds' models are ``models``, by default
    :func:`_ulp_apart` — so neither the round index nor the model's wire digest is
    repeated. (The ring, its two jobs, the job ids the target uploaded a masked input
    to.)"""
    ring = HostileRing(federation="fed", model=model)
    ring.rounds = 2
    length = model.length + 2
    jobs = [make_job(ROSTER, length), make_job(OTHER_ROSTER, length)]
    first, second = models if models is not None else _ulp_apart(model.initial_vector)
    ring.script = [
        ring.train(vector, job, round_index=k)
        for k, (vector, job) in enumerate(zip((first, second), jobs, strict=True))
    ]
    uploaded: list[bytes] = []
    upload = ring.upload_masked

    def watched(messages: Any) -> pb.UploadReceipt:  # which jobs got the site's input
        messages = list(messages)
        uploaded.extend({bytes(m.job_id) for m in messages if m.job_id})
        return upload(messages)

    ring.upload_masked = watched  # type: ignore[method-assign]
    _run(_settings(tmp, **policy), ring, data)
    return ring, jobs, uploaded


def test_a_second_round_of_the_same_update_is_refused(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The second round is the first's update bit for bit (same executed model, seed
    and local training), so the site refuses it before any training, typed, and
    nothing of it leaves: the two sums' difference gives nothing."""
    ring, (first, second), uploaded = _rounds_from_one_executed_model(tmp_path, model, data)
    assert first.result is not None and second.result is None
    assert ring.refusal("train-1") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    assert uploaded == [first.job_id]
    status, text = run_site_audit(tmp_path / "state", as_json=True)
    report = json.loads(text)
    updates = [(r["round"], r["state"]) for r in report["releases"] if r["kind"] == "update"]
    assert updates == [(1, "released"), (2, "reserved")]  # the second never left
    # (the ring then asks the abandoned job's next step: the site holds no state for it)
    (refusal,) = [r for r in report["refusals"] if r["task"] == "train-1"]
    assert refusal["rule"] == "RULE_RELEASE_REPEATED"
    assert "this update" in refusal["reason"] and "round 1's" in refusal["reason"]
    assert status == 0  # no pair: one update left


def test_the_site_audit_pairs_rounds_from_one_executed_model(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """With the rule off (``one_update_per_round = false``) the site admits both
    rounds, and the two updates are identical, so their sums' difference is the
    missing site's update. The site's audit pairs the two by the executed model: by
    the wire digest the ledger reserves training under, it saw two unrelated updates
    and passed."""
    ring, jobs, uploaded = _rounds_from_one_executed_model(
        tmp_path, model, data, one_update_per_round=False
    )
    assert ring.failures == []
    assert uploaded == [job.job_id for job in jobs]
    a, b = (job.target_release() for job in jobs)
    np.testing.assert_array_equal(a, b)  # the same update: differencing is exact
    audit = read_site_audit(tmp_path / "state")
    (pair,) = audit.pairs
    assert pair.exact and pair.family == "training"
    assert (pair.only_in_first, pair.only_in_second) == (["p3"], ["p4"])
    assert "the same model" in pair.why
    rounds = [r for r in audit.releases if r.kind == "update"]
    assert len({r.model for r in rounds}) == 1  # shown as the one executed model
    assert run_site_audit(tmp_path / "state")[0] == 1


def _signed_zero(vector: npt.NDArray[np.float64]) -> tuple[np.ndarray, np.ndarray]:
    """``vector`` with its first entry ``+0.0``, and the same with ``-0.0``: one network
    (the coordinator chooses the model, a zero weight among its entries), other bytes
    in float64 and in float32 alike."""
    plus = np.array(vector, dtype=np.float64)
    plus[0] = 0.0
    minus = plus.copy()
    minus[0] = -0.0
    assert plus.astype(np.float32).tobytes() != minus.astype(np.float32).tobytes()
    return plus, minus


@pytest.mark.parametrize("one_update_per_round", [True, False])
def test_the_site_audit_pairs_rounds_from_a_model_whose_zero_changed_sign(
    tmp_path: Path, model: GlobalModel, data: LocalData, one_update_per_round: bool
) -> None:
    """As above, with the second round's model the first with one zero weight's sign
    flipped: the same network, the same update bit for bit. Until 2026-11-27 the
    executed-model digest hashed the float32 bytes as they were, so the two rounds were
    two models and the audit passed (exit 0, no pair). By default the second round is
    now refused as the same update; with that rule off both leave and the audit pairs
    them."""
    ring, jobs, _ = _rounds_from_one_executed_model(
        tmp_path,
        model,
        data,
        _signed_zero(model.initial_vector),
        one_update_per_round=one_update_per_round,
    )
    if one_update_per_round:  # the default: the second round is the same update, refused
        assert jobs[0].result is not None and jobs[1].result is None
        assert ring.refusal("train-1") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
        return
    assert ring.failures == []
    a, b = (job.target_release() for job in jobs)
    np.testing.assert_array_equal(a, b)  # the same update: differencing is exact
    audit = read_site_audit(tmp_path / "state")
    (pair,) = audit.pairs
    assert pair.exact and pair.family == "training"
    assert len({r.model for r in audit.releases if r.kind == "update"}) == 1
    assert run_site_audit(tmp_path / "state")[0] == 1


def test_a_model_whose_zero_changed_sign_under_a_renamed_federation_is_the_same_model(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """With the data rule relaxed, the executed-model digest alone refuses exact
    statistics of one network again — a zero weight of the other sign included (until
    2026-11-27 they left again, bit for bit the first federation's)."""
    plus, minus = _signed_zero(model.initial_vector)
    length = ffc_layout_size(model.feature_dim, model.num_classes)
    first_ring = HostileRing(federation="fed-A", model=model)
    a = make_job(ROSTER, length)
    first_ring.script = [_statistics(first_ring, "a", pb.FFC, a, plus)]
    settings = _settings(tmp_path, reuse_data_across_federations=True)
    _run(settings, first_ring, data)
    ring = HostileRing(federation="fed-B", model=model)
    b = make_job(OTHER_ROSTER, length)
    ring.script = [_statistics(ring, "b", pb.FFC, b, minus)]
    _run(settings, ring, data)
    assert a.result is not None and b.result is None
    assert ring.refusal("b") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")


def _one_round_in_two_federations(
    tmp: Path, model: GlobalModel, data: LocalData, **policy: object
) -> tuple[HostileRing, HostileRing]:
    """Round 1 of federation A over one roster; the site started again (as its operator
    would for a new federation) and asked round 1 of federation B from the same model
    with the same seed over a roster without one of A's sites: every site that sends
    its update again sends A's bit for bit, so B's sum subtracted from A's is the
    missing site's update."""
    length = model.length + 2
    rings = []
    for federation, roster in (("fed-A", ROSTER), ("fed-B", OTHER_ROSTER)):
        ring = HostileRing(federation=federation, model=model)
        ring.rounds = 1
        ring.script = [ring.train(model.initial_vector, make_job(roster, length), seed=7)]
        _run(_settings(tmp, **policy), ring, data)
        rings.append(ring)
    return rings[0], rings[1]


def test_the_same_update_in_a_second_federation_is_refused(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The round index and the federation are new, the update is not: refused before
    any training, typed, and the site's own log says which federation it left in."""
    first, second = _one_round_in_two_federations(tmp_path, model, data)
    (a,) = first.jobs.values()
    (b,) = second.jobs.values()
    assert a.result is not None and b.result is None
    assert second.refusal("train-0") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    report = json.loads(run_site_audit(tmp_path / "state", as_json=True)[1])
    (refusal,) = [
        r
        for r in report["refusals"]
        if r["federation"] == "fed-B" and r["rule"] == "RULE_RELEASE_REPEATED"
    ]
    assert "federation 'fed-A', not this one" in refusal["reason"]
    assert [r["federation"] for r in _released(tmp_path)] == ["fed-A"]


def test_mutation_updates_once_per_federation_resend_it_bit_for_bit(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule as it was until 2026-11-28 — the same update refused within its
    federation only — lets the second federation's job through: the two updates are
    identical, so the two sums' difference is exact."""
    within = release_rules.ReleaseConflicts.repeated_update

    def per_federation(self: Any, release: Any, job: str) -> str | None:
        found = within(self, release, job)
        return None if found is None or "not this one" in found else found

    monkeypatch.setattr(release_rules.ReleaseConflicts, "repeated_update", per_federation)
    first, second = _one_round_in_two_federations(tmp_path, model, data)
    assert first.failures == [] and second.failures == []
    (a,) = first.jobs.values()
    (b,) = second.jobs.values()
    np.testing.assert_array_equal(a.target_release(), b.target_release())


def test_an_honest_next_round_from_the_same_model_is_admitted(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The round gate's rollback trains the next round from the same model with that
    round's own seed (``derive_seed(seed, "train", r, k)``): another update, admitted."""
    ring = _training_over_two_rosters(tmp_path, model, data, (0, 1))
    assert ring.failures == []
    a, b = (job.target_release() for job in ring.jobs.values())
    assert not np.array_equal(a, b)


# ====================================================================== the site's audit
def test_the_site_audit_flags_the_differencing_pair(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """Relaxed rules let the same exact evaluation leave twice over rosters that
    differ by one site: the site's own audit (its ledger alone) flags it."""
    ring = _renamed_heads(
        tmp_path, model, data, one_release_per_model=False, evaluation_noise_sd=0.0
    )
    assert ring.failures == []
    audit = read_site_audit(tmp_path / "state")
    (pair,) = audit.pairs
    assert pair.exact and pair.family == "evaluation"
    assert (pair.only_in_first, pair.only_in_second) == (["p3"], ["p4"])
    status, text = run_site_audit(tmp_path / "state", html_path=tmp_path / "site.html")
    assert status == 1 and "EXACT" in text
    from spherecal.cli.app import main

    assert main(["audit", "--site", str(tmp_path / "state")]) == 1
    assert "EXACT DIFFERENCING PAIR FOUND" in (tmp_path / "site.html").read_text()


def test_the_site_audit_lists_refusals_and_passes_at_defaults(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    _renamed_heads(tmp_path, model, data)
    status, text = run_site_audit(tmp_path / "state", as_json=True)
    assert status == 0
    report = json.loads(text)
    assert report["differencing_pairs"] == []
    assert [r["rule"] for r in report["refusals"]] == ["RULE_RELEASE_REPEATED"]
    (released,) = [r for r in report["releases"] if r["state"] == "released"]
    assert released["survivors"] == list(ROSTER) and released["epsilon"] > 0
    assert report["epsilon_total"][TARGET] == pytest.approx(released["epsilon"])
    from spherecal.cli.app import main  # the command itself: exit 0, nothing flagged

    assert main(["audit", "--site", str(tmp_path / "state")]) == 0


def test_the_site_audit_needs_a_ledger(tmp_path: Path) -> None:
    status, text = run_site_audit(tmp_path)
    assert status == 2 and "no release ledger" in text


def test_local_training_that_diverges_is_withheld_not_an_exit(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """Whether local training diverges on a model the coordinator chose depends on the
    site's data: the site withholds that round's input to the masked step (charged as
    the round's release, like any failed local work) and goes on — it used to leave
    the federation (an uncaught ``FloatingPointError``), an answer at once."""
    ring = HostileRing(federation="fed", model=model)
    job = make_job(ROSTER, model.length + 2)
    exploding = model.initial_vector * 1e30  # every forward pass overflows
    ring.script = [ring.train(exploding, job)]
    _run(_settings(tmp_path), ring, data)  # the site ends normally (asserts exit 0)
    (failure,) = ring.failures
    assert failure.reason == WITHHELD_TEXT  # one sentence whatever the cause
    # its shares went as for any input; the refusal came in its masked input's place
    assert ring.target_stages[-1] == "SHARE" and "MASKED" not in ring.target_stages
    conn = sqlite3.connect(tmp_path / "state" / "privacy.db")
    try:
        (answer,) = conn.execute("SELECT answer FROM site_releases").fetchone()
    finally:
        conn.close()
    assert answer == "refusal"  # charged as the round's release


def test_local_dpsgd_training_that_fails_is_withheld_not_refused_at_once(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """With local DP-SGD the round is admitted and charged before training; whether
    its training then fails depends on the site's data (here: a training split with
    no examples, which DP-SGD cannot sample from), so the round's input is withheld
    to the masked step and counted as the round's release, like any failed local
    work. It used to be refused at once — an answer outside every release."""
    ring = HostileRing(federation="fed", model=model)
    job = make_job(ROSTER, model.length + 2)
    ring.script = [ring.train(model.initial_vector, job)]
    privacy = PrivacySettings(
        enabled=True, epsilon=1e6, total_epsilon=1e6, dpsgd=True, dpsgd_noise_multiplier=1.0
    )
    empty = dataclasses.replace(data, train_x=data.train_x[:0], train_y=data.train_y[:0])
    _run(dataclasses.replace(_settings(tmp_path), privacy=privacy), ring, empty)
    (failure,) = ring.failures
    assert failure.reason == WITHHELD_TEXT  # one sentence whatever the cause
    # its shares went as for any input; the refusal came in its masked input's place
    assert ring.target_stages[-1] == "SHARE" and "MASKED" not in ring.target_stages
    (release,) = _ledger(tmp_path)
    assert release["answer"] == "refusal"  # counted as the round's release
    conn = sqlite3.connect(tmp_path / "state" / "privacy.db")
    try:  # and the round's DP-SGD charge stays in the budget ledger
        charged = [r[0] for r in conn.execute("SELECT release_id FROM privacy_ledger")]
    finally:
        conn.close()
    assert charged == ["local-dpsgd/fed/round-0"]


def test_local_dpsgd_rounds_are_in_the_site_audit_with_their_epsilon(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """Each local DP-SGD round is charged to the site's budget ledger before it
    trains; its row of the release ledger carries that ε, so the site's audit lists
    it and counts it in the site's total. It listed the rounds as noised with no ε,
    and a total of the training weight's ε alone (≈ 1 where two rounds cost ≈ 4 each)."""
    ring = HostileRing(federation="fed", model=model)
    ring.rounds = 2
    jobs = [make_job(ROSTER, model.length + 2) for _ in range(2)]
    ring.script = [
        ring.train(model.initial_vector, job, round_index=k) for k, job in enumerate(jobs)
    ]
    privacy = PrivacySettings(
        enabled=True, epsilon=1e6, total_epsilon=1e6, dpsgd=True, dpsgd_noise_multiplier=1.0
    )
    _run(dataclasses.replace(_settings(tmp_path), privacy=privacy), ring, data)
    assert ring.failures == []
    conn = sqlite3.connect(tmp_path / "state" / "privacy.db")
    try:
        charged = [float(e) for (e,) in conn.execute("SELECT epsilon FROM privacy_ledger")]
    finally:
        conn.close()
    assert len(charged) == 2 and all(e > 1 for e in charged)
    report = json.loads(run_site_audit(tmp_path / "state", as_json=True)[1])
    rounds = [r for r in report["releases"] if r["kind"] == "update"]
    assert [r["epsilon"] for r in rounds] == pytest.approx(charged)
    assert all(r["noise"]["mechanism"] == "dpsgd" for r in rounds)
    (weight,) = report["example_counts"]
    assert report["epsilon_total"][TARGET] == pytest.approx(sum(charged) + weight["epsilon"])
    assert "ε=" in run_site_audit(tmp_path / "state")[1].splitlines()[2]
