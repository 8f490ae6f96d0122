"""Model inconsistency: one secure job whose members were sent different models.

Secure aggregation hides the target's input among the others only if the others are
real inputs. A coordinator that sends the target the real model and every other
member a model whose output it knows (Pasquini et al. 2022) reads the target's input
from one sum, past every rule of the release ledger — here the others were "sent" a
network whose hidden units are all dead, so their FFC statistics are the known
moments of one constant feature vector. Every job is therefore bound to its task: the
spec's context is the task's digest (:mod:`spherecal.proto.task_context`), and the
spec's bytes are in every signature of the job. Played against a real site
(:class:`tests.security.hostile_ring.HostileRing`: real runner, trainer, data and
ledger):

* a spec bound to no task, to the others' task, or to the target's task under the
  plan the others were given (``lr = 0``: their updates would be zero), is refused
  before any key leaves (``RULE_TASK_NOT_BOUND``);
* a spec bound to the target's task while the others hold one bound to theirs cannot
  finish: the target rejects their key advertisements;
* mutation check: with the site's check off, the job finishes and the sum minus the
  others' known inputs is the target's exact statistics.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.participant import runner as runner_module
from spherecal.participant.data import LocalData
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.task_context import task_context
from spherecal.spherefed.stats import ffc_layout_size, ffc_statistics
from tests.security.hostile_plan import hostile_join_reply
from tests.security.hostile_ring import (
    HostileRing,
    RingJob,
    make_job,
    mlp_features,
    run_target,
    target_settings,
)

ROSTER = ("p0", "p1", "p2", "p3")


def _dead_network(model: GlobalModel) -> npt.NDArray[np.float64]:
    """Every hidden unit dead (weights in 0, bias -1): the features are one constant
    vector whatever the input, so a site's FFC statistics are known up to its counts."""
    vector = np.array(model.initial_vector, dtype=np.float64)
    d_in, hidden = 64, 256
    vector[: d_in * hidden] = 0.0
    vector[d_in * hidden : d_in * hidden + hidden] = -1.0
    return vector


def _statistics(ring: HostileRing, name: str, vector: npt.NDArray[np.float64]) -> pb.StatisticsTask:
    return pb.StatisticsTask(kind=pb.FFC, model=ring.publish(name, vector))


def _attack(
    tmp: Path,
    model: GlobalModel,
    data: LocalData,
    *,
    target_spec: str,
    others_spec: str = "target",
) -> tuple[HostileRing, RingJob]:
    """The target is sent the real model; the others (in-process, their inputs known)
    were sent the dead network. ``target_spec``/``others_spec``: which task each side's
    spec is bound to — ``"none"``, ``"target"`` (the real model's task) or ``"others"``."""
    ring = HostileRing(federation="fed", model=model)
    job = make_job(ROSTER, ffc_layout_size(model.feature_dim, model.num_classes))
    real = _statistics(ring, "real", model.initial_vector)
    dead = _statistics(ring, "dead", _dead_network(model))
    plan = hostile_join_reply(ring.federation, model, ring.peers).plan  # the target's
    frozen = pb.Plan()
    frozen.CopyFrom(plan)
    frozen.training.lr = 0.0  # a plan under which the others' updates would be zero
    contexts = {
        "none": b"",
        "target": task_context(real, plan),
        "others": task_context(dead, plan),
        "others' plan": task_context(real, frozen),
    }
    target = dataclasses.replace(job.spec, context=contexts[target_spec])
    others = dataclasses.replace(job.spec, context=contexts[others_spec])
    job.spec = target
    real.secure.CopyFrom(ring.secure(job, "ffc"))
    ring.bind_tasks = False  # the coordinator chooses what each side's spec is bound to
    ring.others_see = lambda _spec: others
    ring.script = [pb.Instruction(task_id="s", statistics=real)]
    run_target(target_settings(tmp), ring, data)
    return ring, job


@pytest.mark.parametrize("bound_to", ["none", "others", "others' plan"])
def test_a_job_not_bound_to_the_targets_task_is_refused_before_any_key(
    tmp_path: Path, model: GlobalModel, data: LocalData, bound_to: str
) -> None:
    ring, job = _attack(tmp_path, model, data, target_spec=bound_to, others_spec=bound_to)
    assert ring.refusal("s") == ("POLICY_REFUSAL", "RULE_TASK_NOT_BOUND")
    assert ring.target_stages == []  # not even its keys: the refusal came first
    assert job.result is None


def test_members_shown_different_tasks_cannot_finish_the_job(
    tmp_path: Path, model: GlobalModel, data: LocalData
) -> None:
    """The target's spec is bound to its own task; the server and the others hold the
    spec bound to theirs. The digests differ, so no signature crosses: nothing of the
    target's input is summed."""
    ring, job = _attack(tmp_path, model, data, target_spec="target", others_spec="others")
    assert job.result is None
    assert ring.target_stages == ["ADVERTISE"]  # its keys, refused by the server: no shares


def test_mutation_without_the_check_one_sum_gives_the_targets_statistics(
    tmp_path: Path, model: GlobalModel, data: LocalData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "require_task_bound", lambda _context, _task, _plan: None)
    ring, job = _attack(tmp_path, model, data, target_spec="none", others_spec="none")
    assert ring.failures == [] and job.result is not None
    z = mlp_features(np.asarray(model.initial_vector, dtype=np.float64), data.train_x.numpy())
    exact = ffc_statistics(z, data.train_y.numpy(), model.num_classes).pack()
    np.testing.assert_allclose(job.target_release(), exact, atol=1e-3)


def test_specs_that_differ_only_in_their_task_reject_each_others_keys() -> None:
    """The crypto layer's half: the context is in the signed bytes."""
    ids = ("p0", "p1", "p2")
    identities = {p: crypto.generate_identity() for p in ids}
    keys = {p: crypto.identity_public_bytes(k) for p, k in identities.items()}
    spec = crypto.JobSpec.create(ids, threshold=2, length=4, bound=1.0, context=b"\x01" * 32)
    other = dataclasses.replace(spec, context=b"\x02" * 32)
    server = crypto.SecAggServer(spec, keys)
    honest = crypto.SecAggParticipant(spec, "p1", identities["p1"], keys, ledger=MemoryJobLedger())
    server.receive(honest.advertise_keys(), sender="p1")
    shown_another = crypto.SecAggParticipant(
        other, "p2", identities["p2"], keys, ledger=MemoryJobLedger()
    )
    with pytest.raises(crypto.SecAggError):
        server.receive(shown_another.advertise_keys(), sender="p2")
