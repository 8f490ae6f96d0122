"""A malicious coordinator against a real participant runner (issue #9, service half).

The double (:class:`HostileCoordinator`) implements the participant's ``Transport``
— the whole coordinator surface a participant sees — and plays a scripted list of
hostile instructions to a real :class:`spherecal.participant.runner.ParticipantRunner` with
its real trainer, data, crypto, policy and SQLite state directory. Each attack must
end in a *typed* withdrawal (``FailureReport.kind`` + ``rule``) and nothing of the
participant's data leaving: repeated statistics requests, the same statistic for
another model (and for the same model under another federation name, and after a
restart), crafted evaluation heads, plaintext counts, tiny jobs, a low threshold, a
job without the consistency round. ``test_each_policy_key_is_what_stops_its_attack``
weakens one ``[policy]`` key at a time and shows the matching attack then proceeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.participant.data import load_local_data
from spherecal.participant.policy import PolicySettings
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.transport import TransportError
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for
from tests.security.hostile_plan import HostileTransport, bind_to_task
from tests.security.hostile_ring import TARGET, target_settings

PEERS = ("p0", "p1", "p2", "p3", "p4")
ME = "p0"


class HostileCoordinator(HostileTransport):
    """Transport double: answers a real runner with scripted instructions, records
    everything it sends back."""

    def __init__(self, *, federation: str, model: GlobalModel, script: list[pb.Instruction]):
        self.federation = federation
        self.model = model
        self.peers = len(PEERS)
        self.script = list(script)
        self.tensors = {}
        self.failures: list[pb.FailureReport] = []
        self.uploads = []
        self.evaluations: list[pb.EvaluationReport] = []
        self.secagg: list[pb.SecAggSubmission] = []

    def publish(self, name: str, array: np.ndarray) -> pb.TensorRef:
        array = np.ascontiguousarray(array, dtype=np.float64)
        self.tensors[name] = array
        return pb.TensorRef(name=name, header=header_for(array))

    # ----------------------------------------------------------- Transport
    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self.script:
            instruction = self.script.pop(0)
            bind_to_task(instruction, self.joined)
            return instruction
        return pb.Instruction(done=pb.Done(status="completed", message="over"))

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        self.secagg.append(request)
        return pb.Receipt()

    def upload_masked(self, messages: Iterable[pb.MaskedUpload]) -> pb.UploadReceipt:
        list(messages)
        return pb.UploadReceipt()

    def report_evaluation(self, request: pb.EvaluationReport) -> pb.Receipt:
        self.evaluations.append(request)
        return pb.Receipt()

    def report_failure(self, request: pb.FailureReport) -> pb.Receipt:
        self.failures.append(request)
        return pb.Receipt()

    def get_status(self, request: pb.StatusRequest) -> pb.StatusReply:
        return pb.StatusReply()

    def close(self) -> None:
        pass

    # ----------------------------------------------------------- results
    def refusal(self, task_id: str) -> tuple[str, str]:
        """(kind, rule) of the one failure report for ``task_id``."""
        (report,) = [f for f in self.failures if f.task_id == task_id]
        return pb.FailureKind.Name(report.kind), pb.PolicyRule.Name(report.rule)


IDENTITIES = {p: crypto.generate_identity() for p in PEERS}


def _settings(tmp: Path, **overrides: object) -> ParticipantSettings:
    assert ME == TARGET
    return replace(target_settings(tmp), **overrides)  # type: ignore[arg-type]


def _run(
    settings: ParticipantSettings,
    coordinator: HostileCoordinator,
    log: Callable[[str], None] = lambda _m: None,
) -> int:
    data = load_local_data(settings.data)
    runner = ParticipantRunner(
        settings,
        coordinator,
        data,
        IDENTITIES[ME],
        MemoryJobLedger(),
        DirectoryTrust(None),
        log=log,
    )
    return runner.run()


def _directory(ids: tuple[str, ...]) -> list[pb.DirectoryEntry]:
    return [
        pb.DirectoryEntry(
            participant_id=p, identity_public_key=crypto.identity_public_bytes(IDENTITIES[p])
        )
        for p in ids
    ]


def _job(
    purpose: str, length: int, *, ids: tuple[str, ...] = PEERS, **spec: object
) -> pb.SecAggJob:
    arguments: dict[str, object] = {"threshold": len(ids) // 2 + 1, "length": length, "bound": 1e6}
    arguments.update(spec)
    job_spec = crypto.JobSpec.create(ids, **arguments)  # type: ignore[arg-type]
    return pb.SecAggJob(spec=job_spec.to_bytes(), directory=_directory(ids), purpose=purpose)


def _statistics(task_id: str, model_ref: pb.TensorRef) -> pb.Instruction:
    return pb.Instruction(
        task_id=task_id, statistics=pb.StatisticsTask(kind=pb.FFC, model=model_ref)
    )


def _ffc_length(model: GlobalModel) -> int:
    from spherecal.spherefed.stats import ffc_layout_size

    return ffc_layout_size(model.feature_dim, model.num_classes)


# ====================================================================== releases
def test_repeated_statistics_requests_are_refused_even_after_a_restart(
    tmp_path: Path, model: GlobalModel
) -> None:
    """Plaintext mode (allowed here) so the first release really leaves; then the
    same statistic again, for another model, and under another federation name."""
    settings = _settings(tmp_path, allow_plaintext=True)
    hostile = HostileCoordinator(federation="fed-A", model=model, script=[])
    m1 = hostile.publish("m1", model.initial_vector)
    m2 = hostile.publish("m2", model.initial_vector + 1e-3)
    hostile.script = [
        _statistics("first", m1),
        _statistics("again-same-model", m1),
        _statistics("other-model", m2),
    ]
    assert _run(settings, hostile) == 0
    assert hostile.uploads == ["first"]
    assert hostile.refusal("again-same-model") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    assert hostile.refusal("other-model") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")
    # a restarted participant (same state directory) under a new federation name
    renamed = HostileCoordinator(federation="fed-B", model=model, script=[])
    m1 = renamed.publish("m1", model.initial_vector)
    renamed.script = [_statistics("renamed-federation", m1)]
    assert _run(settings, renamed) == 0
    assert renamed.uploads == []
    assert renamed.refusal("renamed-federation") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")


def test_a_retry_after_a_failure_before_release_is_admitted(
    tmp_path: Path, model: GlobalModel
) -> None:
    """A secure job this participant never uploaded to (the coordinator moved on)
    consumed nothing: the coordinator's retry with a fresh job id is admitted."""
    settings = _settings(tmp_path)
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    ref = hostile.publish("final", model.initial_vector)
    length = _ffc_length(model)
    first = pb.Instruction(
        task_id="t1",
        statistics=pb.StatisticsTask(kind=pb.FFC, model=ref, secure=_job("ffc", length)),
    )
    retry = pb.Instruction(
        task_id="t2",
        statistics=pb.StatisticsTask(kind=pb.FFC, model=ref, secure=_job("ffc", length)),
    )
    hostile.script = [first, retry]
    assert _run(settings, hostile) == 0
    assert hostile.failures == []
    adverts = [s for s in hostile.secagg if s.stage == pb.ADVERTISE]
    assert len(adverts) == 2  # both jobs admitted (advertised) — nothing was released


# ====================================================================== evaluation
def _evaluate(
    hostile: HostileCoordinator, model: GlobalModel, task_id: str, heads: int, **extra: object
) -> pb.Instruction:
    ref = hostile.publish(f"model-{task_id}", model.initial_vector)
    shape: Any = extra.pop("shape", (model.num_classes, model.feature_dim))
    named = []
    for h in range(heads):
        weight = np.zeros(shape)
        if weight.ndim == 2 and weight.shape[0] > h:
            weight[h % weight.shape[0], :] = 1.0  # "always class h": a label counter
        named.append(
            pb.NamedTensorRef(name=f"h{h}", tensor=hostile.publish(f"{task_id}-h{h}", weight))
        )
    return pb.Instruction(
        task_id=task_id,
        evaluate=pb.EvaluateTask(model=ref, heads=named, round=-1, **extra),  # type: ignore[arg-type]
    )


def test_crafted_evaluation_heads_are_refused(tmp_path: Path, model: GlobalModel) -> None:
    settings = _settings(tmp_path, allow_plaintext=True)
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    hostile.script = [
        _evaluate(hostile, model, "ten-heads", 10),
        _evaluate(
            hostile, model, "wrong-shape", 1, shape=(model.num_classes + 5, model.feature_dim)
        ),
    ]
    assert _run(settings, hostile) == 0
    assert hostile.evaluations == []
    assert hostile.refusal("ten-heads") == ("POLICY_REFUSAL", "RULE_EVALUATION_HEADS")
    assert hostile.refusal("wrong-shape") == ("POLICY_REFUSAL", "RULE_EVALUATION_HEADS")


def test_plaintext_evaluation_counts_need_allow_plaintext(
    tmp_path: Path, model: GlobalModel
) -> None:
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    hostile.script = [_evaluate(hostile, model, "plain", 2)]
    assert _run(_settings(tmp_path), hostile) == 0
    assert hostile.evaluations == []
    assert hostile.refusal("plain") == ("POLICY_REFUSAL", "RULE_PLAINTEXT_REFUSED")


def test_the_same_evaluation_is_answered_once(tmp_path: Path, model: GlobalModel) -> None:
    settings = _settings(tmp_path, allow_plaintext=True)
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    first = _evaluate(hostile, model, "e1", 2)
    again = pb.Instruction()
    again.CopyFrom(first)
    again.task_id = "e2"
    hostile.script = [first, again]
    assert _run(settings, hostile) == 0
    assert [e.task_id for e in hostile.evaluations] == ["e1"]
    assert hostile.refusal("e2") == ("POLICY_REFUSAL", "RULE_RELEASE_REPEATED")


def _ulp_moved(hostile: HostileCoordinator, model: GlobalModel, k: int) -> pb.Instruction:
    """An evaluation of the model with its last weight moved by ``k`` float32 ulps: a
    new executed model (a new release key) whose counts are, almost surely, the
    same — the free "ask again" that averages fresh noise away."""
    vector = model.initial_vector.astype(np.float32)
    for _ in range(k):
        vector[-1] = np.nextafter(vector[-1], np.float32(np.inf))
    ref = hostile.publish(f"model-ulp{k}", vector.astype(np.float64))
    return pb.Instruction(
        task_id=f"ulp{k}", evaluate=pb.EvaluateTask(model=ref, heads=[], round=-1)
    )


def test_evaluations_of_ulp_moved_models_stop_at_the_federations_limit(
    tmp_path: Path, model: GlobalModel
) -> None:
    """Six evaluations of one model moved by an ulp each: the site answers its
    default four, then refuses with ``RULE_EVALUATIONS_EXHAUSTED`` (the coordinator
    would otherwise average the counts' fresh noise down)."""
    settings = _settings(tmp_path, allow_plaintext=True)
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    hostile.script = [_ulp_moved(hostile, model, k) for k in range(6)]
    assert _run(settings, hostile) == 0
    assert [e.task_id for e in hostile.evaluations] == ["ulp0", "ulp1", "ulp2", "ulp3"]
    for late in ("ulp4", "ulp5"):
        assert hostile.refusal(late) == ("POLICY_REFUSAL", "RULE_EVALUATIONS_EXHAUSTED")
    assert "max_evaluations_per_federation = 4" in hostile.failures[0].reason


def test_mutation_without_the_limit_every_ulp_is_a_fresh_answer(
    tmp_path: Path, model: GlobalModel
) -> None:
    """The policy key is what stops it: set to 0 (no limit), all six are answered."""
    settings = _settings(
        tmp_path,
        allow_plaintext=True,
        policy=PolicySettings(max_evaluations_per_federation=0),
    )
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    hostile.script = [_ulp_moved(hostile, model, k) for k in range(6)]
    assert _run(settings, hostile) == 0
    assert len(hostile.evaluations) == 6 and not hostile.failures


def _federations_of_ulps(
    model: GlobalModel, settings: ParticipantSettings, federations: int
) -> tuple[list[HostileCoordinator], list[list[str]]]:
    """The site started again for each of ``federations`` federations on the same
    state directory and data — as its operator would for each new one — and asked in
    each for two evaluations of the model moved by fresh ulps (new release keys, the
    same counts): the coordinators and the site's log of each run."""
    coordinators, logs = [], []
    for f in range(federations):
        hostile = HostileCoordinator(federation=f"fed-{f}", model=model, script=[])
        hostile.script = [_ulp_moved(hostile, model, 2 * f + k) for k in range(2)]
        lines: list[str] = []
        assert _run(settings, hostile, log=lines.append) == 0
        coordinators.append(hostile)
        logs.append(lines)
    return coordinators, logs


def test_evaluations_of_one_split_stop_across_federations(
    tmp_path: Path, model: GlobalModel
) -> None:
    """Each federation's count starts over, the test split's counts do not: two
    evaluations in each of three federations, each within the federation's limit —
    the site answers four in all (its split's lifetime, ``[policy]
    max_evaluations_per_split`` following ``max_evaluations_per_federation``), says at
    the third join that none are left, and refuses the third federation's with
    ``RULE_EVALUATIONS_EXHAUSTED``."""
    settings = _settings(tmp_path, allow_plaintext=True)
    coordinators, logs = _federations_of_ulps(model, settings, 3)
    answered = [[e.task_id for e in h.evaluations] for h in coordinators]
    assert answered == [["ulp0", "ulp1"], ["ulp2", "ulp3"], []]
    assert not coordinators[0].failures and not coordinators[1].failures
    for late in ("ulp4", "ulp5"):
        assert coordinators[2].refusal(late) == ("POLICY_REFUSAL", "RULE_EVALUATIONS_EXHAUSTED")
    reason = coordinators[2].failures[0].reason
    assert "max_evaluations_per_split = 4" in reason and "in 2 federation(s)" in reason
    (said,) = [line for line in logs[2] if "test split" in line]
    assert said.startswith("WARNING") and "4 of its 4" in said and "0 left" in said
    assert [line for line in logs[1] if "test split: 2 of its 4" in line]
    assert not [line for line in logs[0] if "test split" in line]


def test_mutation_without_the_split_limit_every_federation_starts_over(
    tmp_path: Path, model: GlobalModel
) -> None:
    """``max_evaluations_per_split = 0`` is what stops it: all six are answered, the
    same counts released six times."""
    settings = _settings(
        tmp_path, allow_plaintext=True, policy=PolicySettings(max_evaluations_per_split=0)
    )
    coordinators, _ = _federations_of_ulps(model, settings, 3)
    assert sum(len(h.evaluations) for h in coordinators) == 6
    assert not any(h.failures for h in coordinators)


def test_no_message_waits_for_a_hash_of_the_data(
    tmp_path: Path, model: GlobalModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The splits' fingerprints (the ledger's keys for "the same data", and the join's
    note on each split's evaluations) are taken before the first join: a hash takes
    time that follows a split's size, and inside the join or the first task it would
    delay a message the coordinator times — the first poll, the keys' advertisement."""
    from spherecal.participant import runner as runner_module

    events: list[str] = []
    hashed = runner_module.fingerprint

    def recorded(data: Any, split: str) -> bytes:
        events.append(f"hash {split}")
        return hashed(data, split)

    monkeypatch.setattr(runner_module, "fingerprint", recorded)

    class Watched(HostileCoordinator):
        def join(self, request: pb.JoinRequest) -> pb.JoinReply:
            events.append("join")
            return super().join(request)

    hostile = Watched(federation="fed", model=model, script=[])
    hostile.script = [_ulp_moved(hostile, model, 0), _ulp_moved(hostile, model, 1)]
    assert _run(_settings(tmp_path, allow_plaintext=True), hostile) == 0
    assert len(hostile.evaluations) == 2
    assert events == ["hash train", "hash test", "hash validation", "join"]


class CyclingCoordinator(HostileCoordinator):
    """After its script's first instruction, expires the session and answers the
    rejoin with a new federation: every per-federation bound would start over."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.joins = 0
        self.expired = False

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        self.joins += 1
        self.federation = f"fed-{self.joins}"
        return super().join(request)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self.evaluations and not self.expired:
            self.expired = True
            raise TransportError(
                grpc.StatusCode.UNAUTHENTICATED, "session expired", reason=pb.SESSION_EXPIRED
            )
        return super().next_instruction(request)


def test_a_coordinator_cannot_move_a_site_into_a_new_federation(
    tmp_path: Path, model: GlobalModel
) -> None:
    """The rejoin finds federation 2, not the one the process joined: the site stops
    (status 1) instead of answering the second federation's evaluations, whose
    per-federation count starts over."""
    hostile = CyclingCoordinator(federation="fed", model=model, script=[])
    hostile.script = [_ulp_moved(hostile, model, k) for k in range(3)]
    assert _run(_settings(tmp_path, allow_plaintext=True), hostile) == 1
    assert hostile.joins == 2
    assert [e.task_id for e in hostile.evaluations] == ["ulp0"]


def test_mutation_following_new_federations_restarts_every_bound(
    tmp_path: Path, model: GlobalModel
) -> None:
    """``[policy] follow_new_federation = true`` is what lets it through: the site
    answers on in federation 2."""
    settings = _settings(
        tmp_path, allow_plaintext=True, policy=PolicySettings(follow_new_federation=True)
    )
    hostile = CyclingCoordinator(federation="fed", model=model, script=[])
    hostile.script = [_ulp_moved(hostile, model, k) for k in range(3)]
    assert _run(settings, hostile) == 0
    assert [e.task_id for e in hostile.evaluations] == ["ulp0", "ulp1", "ulp2"]


# ====================================================================== job specs
def _train(
    hostile: HostileCoordinator, model: GlobalModel, task_id: str, job: pb.SecAggJob
) -> pb.Instruction:
    ref = hostile.publish(f"global-{task_id}", model.initial_vector)
    return pb.Instruction(
        task_id=task_id, train=pb.TrainTask(round=0, model=ref, seed=1, secure=job)
    )


ATTACKS = {
    "tiny": (lambda n: _job("update", n, ids=("p0", "p1")), "RULE_TOO_FEW_PARTICIPANTS"),
    "low-threshold": (lambda n: _job("update", n, threshold=2), "RULE_THRESHOLD_TOO_LOW"),
    "no-consistency": (
        lambda n: _job("update", n, consistency_check=False),
        "RULE_CONSISTENCY_ROUND_REQUIRED",
    ),
}


def test_tiny_jobs_low_thresholds_and_missing_consistency_are_refused(
    tmp_path: Path, model: GlobalModel
) -> None:
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    n = model.length + 2
    hostile.script = [_train(hostile, model, name, make(n)) for name, (make, _) in ATTACKS.items()]
    assert _run(_settings(tmp_path), hostile) == 0
    assert not [s for s in hostile.secagg if s.stage == pb.ADVERTISE]  # refused before keys
    for name, (_, rule) in ATTACKS.items():
        assert hostile.refusal(name) == ("POLICY_REFUSAL", rule), name


def _rounds_script(hostile: HostileCoordinator, model: GlobalModel) -> list[pb.Instruction]:
    """Round 2 of a one-round plan (``hostile_join_reply``), then its round 1."""
    n = model.length + 2
    ref = hostile.publish("global", model.initial_vector)
    return [
        pb.Instruction(
            task_id=task_id,
            train=pb.TrainTask(round=index, model=ref, seed=1, secure=_job("update", n)),
        )
        for task_id, index in (("beyond", 1), ("planned", 0))
    ]


def test_a_round_outside_the_plan_is_refused_before_any_key(
    tmp_path: Path, model: GlobalModel
) -> None:
    """One update per round bounds a site's updates only while the rounds are bounded:
    a round the plan does not have is refused; the plan's own is admitted."""
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    hostile.script = _rounds_script(hostile, model)
    assert _run(_settings(tmp_path), hostile) == 0
    assert hostile.refusal("beyond") == ("POLICY_REFUSAL", "RULE_ROUND_OUTSIDE_PLAN")
    assert "round 2 of a plan of 1 round(s)" in hostile.failures[0].reason
    assert len([s for s in hostile.secagg if s.stage == pb.ADVERTISE]) == 1  # "planned"


def test_mutation_without_the_round_check_every_round_is_a_fresh_update(
    tmp_path: Path, model: GlobalModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ParticipantRunner, "_require_planned_round", lambda self, r: None)
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    hostile.script = _rounds_script(hostile, model)
    assert _run(_settings(tmp_path), hostile) == 0
    assert not [f for f in hostile.failures if f.task_id == "beyond"]
    assert len([s for s in hostile.secagg if s.stage == pb.ADVERTISE]) == 2


WEAKENED = {
    "tiny": {"min_participants": 2},
    # a job with 2t <= holders cannot carry the consistency round at all (spherecal.crypto.spec)
    "low-threshold": {"require_majority_threshold": False, "require_consistency_round": False},
    "no-consistency": {"require_consistency_round": False},
}


@pytest.mark.parametrize("attack", sorted(WEAKENED))
def test_each_policy_key_is_what_stops_its_attack(
    tmp_path: Path, model: GlobalModel, attack: str
) -> None:
    """Mutation check through the config surface: with the matching [policy] key(s)
    weakened, the participant advertises keys for the hostile job."""
    make, _ = ATTACKS[attack]
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    hostile.script = [_train(hostile, model, attack, make(model.length + 2))]
    policy = PolicySettings(**WEAKENED[attack])  # type: ignore[arg-type]
    assert _run(_settings(tmp_path, policy=policy), hostile) == 0
    assert [s.stage for s in hostile.secagg] == [pb.ADVERTISE]
    assert hostile.failures == []


def test_the_threshold_rule_alone_stops_a_low_threshold(tmp_path: Path, model: GlobalModel) -> None:
    make, _ = ATTACKS["low-threshold"]
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    hostile.script = [_train(hostile, model, "low", make(model.length + 2))]
    policy = PolicySettings(require_consistency_round=False)
    assert _run(_settings(tmp_path, policy=policy), hostile) == 0
    assert hostile.refusal("low") == ("POLICY_REFUSAL", "RULE_THRESHOLD_TOO_LOW")


def test_release_key_weakened_lets_the_repeat_through(tmp_path: Path, model: GlobalModel) -> None:
    """Both rules that key exact moments (per federation/model, and per data) off."""
    policy = PolicySettings(one_release_per_model=False, reuse_data_across_federations=True)
    settings = _settings(tmp_path, allow_plaintext=True, policy=policy)
    hostile = HostileCoordinator(federation="fed", model=model, script=[])
    m1 = hostile.publish("m1", model.initial_vector)
    hostile.script = [_statistics("a", m1), _statistics("b", m1)]
    assert _run(settings, hostile) == 0
    assert hostile.uploads == ["a", "b"]
