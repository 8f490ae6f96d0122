"""The participant's [policy] table, release ledger, evaluation checks and typed rules."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from spherecal import crypto
from spherecal.config import ConfigError, dump_toml, parse_participant_config, participant_document
from spherecal.participant.dp_gate import NoiseRequired, PlaintextRefused, PrivacyRefused
from spherecal.participant.evaluation_checks import (
    check_evaluation,
    counts_vector,
    evaluation_content,
)
from spherecal.participant.failures import failure_kind, policy_rule
from spherecal.participant.policy import EvaluationRefused, PolicySettings, ReleaseRepeated
from spherecal.participant.release_ledger import (
    EVALUATE,
    MOMENTS,
    UPDATE,
    LedgerRules,
    Release,
    ReleaseLedger,
    family_of,
)
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for


# ====================================================================== [policy]
def test_defaults_are_safe_and_map_onto_secagg_policy() -> None:
    p = PolicySettings()
    assert p.relaxations() == ()
    assert p.secagg() == crypto.SecAggPolicy()
    weak = PolicySettings(min_inputs=2, one_release_per_model=False, max_evaluation_heads=5)
    text = " ".join(weak.relaxations())
    assert "min_inputs = 2" in text and "one_release_per_model" in text
    assert "max_evaluation_heads = 5" in text
    assert weak.secagg().min_inputs == 2
    assert PolicySettings().share_wait_s > 0  # shares before local work by default
    (off,) = PolicySettings(share_wait_s=0).relaxations()
    assert off.startswith("share_wait_s = 0") and "example count" in off
    assert PolicySettings(share_wait_s=5).relaxations() == ()
    (changed,) = PolicySettings(exact_moments_of_changed_data=True).relaxations()
    assert changed.startswith("exact_moments_of_changed_data = true")
    assert "changed records' statistics" in changed


@pytest.mark.parametrize(
    "bad",
    [
        {"min_participants": 1},
        {"min_inputs": "3"},
        {"require_consistency_round": 1},
        {"one_release_per_model": "yes"},
        {"exact_moments_of_changed_data": 1},
        {"max_evaluation_heads": -1},
        {"min_local_work_s": -1.0},
        {"min_local_work_s": True},
        {"share_wait_s": -1.0},
        {"share_wait_s": "60"},
        {"share_wait_s": 86400},
    ],
)
def test_bad_policy_values_are_config_errors(bad: dict[str, object]) -> None:
    document = {"participant": {"id": "p0"}, "policy": bad}
    with pytest.raises(ConfigError, match="policy"):
        parse_participant_config(document)


def test_policy_table_round_trips_and_refuses_unknown_keys() -> None:
    document = {
        "participant": {"id": "p0"},
        "policy": {"min_participants": 5, "min_inputs": 4, "max_evaluation_heads": 1},
    }
    settings = parse_participant_config(document)
    assert settings.policy == PolicySettings(
        min_participants=5, min_inputs=4, max_evaluation_heads=1
    )
    import tomllib

    again = parse_participant_config(tomllib.loads(dump_toml(participant_document(settings))))
    assert again.policy == settings.policy
    with pytest.raises(ConfigError, match="threshold"):
        parse_participant_config({"participant": {"id": "p0"}, "policy": {"threshold": 2}})
    assert parse_participant_config({"participant": {"id": "p0"}}).policy == PolicySettings()


def test_privacy_md_lists_every_policy_key_with_its_default() -> None:
    """docs/privacy.md, "Participant policy", shows a ``[policy]`` table of "the
    defaults" and a row per key: an operator copies the table to see every rule. It
    lacked ``example_count_noise_sd``; the block must be exactly the defaults, and every
    key must have its row."""
    import dataclasses
    import re
    import tomllib

    text = (Path(__file__).resolve().parents[3] / "docs" / "privacy.md").read_text()
    section = text.split("### Participant policy", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```toml\n(\[policy\].*?)```", section, re.S)
    assert block is not None
    document = tomllib.loads(block.group(1))
    fields = [f.name for f in dataclasses.fields(PolicySettings)]
    # a key whose default is "unset" (None, which TOML cannot write) is a comment
    unset = [f.name for f in dataclasses.fields(PolicySettings) if f.default is None]
    assert sorted(document["policy"]) == sorted(set(fields) - set(unset))
    for name in unset:
        assert re.search(rf"^# {name}\b.*unset", block.group(1), re.M), name
    settings = parse_participant_config({"participant": {"id": "p0"}, **document})
    assert settings.policy == PolicySettings()
    rows = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert set(fields) <= rows, sorted(set(fields) - rows)


def test_corrupt_shares_is_a_hidden_test_only_key() -> None:
    settings = parse_participant_config({"participant": {"id": "p0", "corrupt_shares": True}})
    assert settings.corrupt_shares is True
    from spherecal.config import PARTICIPANT_TABLES
    from spherecal.config_docs import BLOCKS  # noqa: F401 - the docs table is generated

    assert "corrupt_shares" in PARTICIPANT_TABLES[0].hidden


# ====================================================================== typed rules
@pytest.mark.parametrize(
    ("error", "kind", "rule"),
    [
        (
            crypto.ConsistencyRoundRequired("x"),
            pb.POLICY_REFUSAL,
            pb.RULE_CONSISTENCY_ROUND_REQUIRED,
        ),
        (crypto.ThresholdTooLow("x"), pb.POLICY_REFUSAL, pb.RULE_THRESHOLD_TOO_LOW),
        (crypto.TooFewParticipants("x"), pb.POLICY_REFUSAL, pb.RULE_TOO_FEW_PARTICIPANTS),
        (crypto.TooFewInputs("x"), pb.POLICY_REFUSAL, pb.RULE_TOO_FEW_INPUTS),
        (crypto.DoubleReveal("x"), pb.POLICY_REFUSAL, pb.RULE_DOUBLE_REVEAL),
        (crypto.OverlappingReveal("x"), pb.POLICY_REFUSAL, pb.RULE_BOTH_SHARE_KINDS),
        (crypto.KeySubstitution("x"), pb.POLICY_REFUSAL, pb.RULE_KEY_SUBSTITUTION),
        (ReleaseRepeated("x"), pb.POLICY_REFUSAL, pb.RULE_RELEASE_REPEATED),
        (EvaluationRefused("x"), pb.POLICY_REFUSAL, pb.RULE_EVALUATION_HEADS),
        (PlaintextRefused("x"), pb.POLICY_REFUSAL, pb.RULE_PLAINTEXT_REFUSED),
        (NoiseRequired("x"), pb.POLICY_REFUSAL, pb.RULE_DP_REQUIRED),
        (PrivacyRefused("x"), pb.POLICY_REFUSAL, pb.RULE_DP_PLAN),
        (crypto.ForgedShare("x"), pb.SHARE_AUTHENTICATION, pb.RULE_UNSPECIFIED),
    ],
)
def test_each_refusal_has_its_kind_and_rule(
    error: BaseException, kind: pb.FailureKind, rule: pb.PolicyRule
) -> None:
    assert failure_kind(error) == kind
    assert policy_rule(error) == rule


# ====================================================================== releases
def _stats(
    kind: str, federation: str, model: bytes, *, data: bytes = b"D", noised: bool = False
) -> Release:
    return Release(kind=kind, federation=federation, model=model, data=data, noised=noised)


def test_release_is_consumed_only_when_the_input_leaves(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path / "privacy.db")
    ledger.reserve(_stats("ffc", "F", b"m1"), job="j1")
    # j1 failed before its input left: a retry (new job id) is admitted
    ledger.reserve(_stats("ffc", "F", b"m1"), job="j2")
    ledger.consume("j2")
    ledger.consume("j2")  # idempotent (a retried upload)
    for job, federation, model in (("j3", "F", b"m1"), ("j4", "F", b"m2"), ("j5", "G", b"m1")):
        with pytest.raises(ReleaseRepeated):
            ledger.reserve(_stats("ffc", federation, model, data=b"other"), job=job)
    # j1 was reserved before j2 was released: consuming it now re-checks and refuses
    with pytest.raises(ReleaseRepeated):
        ledger.consume("j1")
    assert [r[0] for r in ledger.released()] == ["j2"]
    ledger.close()
    reopened = ReleaseLedger(tmp_path / "privacy.db")  # a restart does not reset it
    with pytest.raises(ReleaseRepeated):
        reopened.reserve(_stats("ffc", "F", b"m9", data=b"other"), job="j8")
    reopened.close()


def test_ffc_ccvr_lda_qda_are_one_family(tmp_path: Path) -> None:
    """CCVR's per-class moments determine FFC's: after one left, no other kind of the
    family leaves for the same federation or model."""
    ledger = ReleaseLedger(tmp_path / "privacy.db")
    ledger.reserve(_stats("ffc", "F", b"m"), job="a")
    ledger.consume("a")
    for kind in ("ccvr", "lda", "qda", "ffc_bias"):
        assert family_of(kind) == MOMENTS
        for federation, model in (("F", b"other"), ("G", b"m")):
            with pytest.raises(ReleaseRepeated, match="moments"):
                ledger.reserve(_stats(kind, federation, model, data=b"X"), job=f"{kind}{model!r}")
    ledger.close()


def test_exact_moments_of_the_same_data_leave_once_across_federations(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path / "privacy.db")
    ledger.reserve(_stats("ccvr", "F", b"m1"), job="a")
    ledger.consume("a")
    with pytest.raises(ReleaseRepeated, match="same data"):
        ledger.reserve(_stats("ccvr", "G", b"m2"), job="b")  # new federation and model
    ledger.reserve(_stats("ccvr", "G", b"m2", noised=True), job="c")  # DP noise: admitted
    ledger.consume("c")
    ledger.close()
    relaxed = ReleaseLedger(
        tmp_path / "privacy.db", rules=LedgerRules(exact_data_once=False)
    )  # [policy] reuse_data_across_federations = true: the mutation of this rule
    relaxed.reserve(_stats("ccvr", "K", b"m4"), job="e")
    relaxed.consume("e")
    relaxed.close()


def test_exact_moments_of_changed_data_leave_in_one_federation_only(tmp_path: Path) -> None:
    """The data grew between two federations: a second exact release would differ from
    the first by the new records' statistics (the coordinator can keep the features
    fixed while the executed model changes), so it needs DP noise or the key."""
    ledger = ReleaseLedger(tmp_path / "privacy.db")
    ledger.reserve(_stats("ccvr", "F", b"m1", data=b"january"), job="a")
    ledger.consume("a")
    with pytest.raises(ReleaseRepeated, match="the data changed since"):
        ledger.reserve(_stats("ffc", "G", b"m2", data=b"june"), job="b")
    ledger.reserve(_stats("ccvr", "G", b"m2", data=b"june", noised=True), job="c")  # DP noise
    ledger.consume("c")
    ledger.close()
    reopened = ReleaseLedger(tmp_path / "privacy.db")  # a restart does not reset it
    with pytest.raises(ReleaseRepeated, match="exact_moments_of_changed_data"):
        reopened.reserve(_stats("ccvr", "H", b"m3", data=b"december"), job="d")
    reopened.close()
    relaxed = ReleaseLedger(
        tmp_path / "privacy.db", rules=LedgerRules(exact_in_one_federation=False)
    )  # [policy] exact_moments_of_changed_data = true: the mutation of this rule
    relaxed.reserve(_stats("ccvr", "H", b"m3", data=b"december"), job="d")
    relaxed.consume("d")
    with pytest.raises(ReleaseRepeated, match="same data"):  # the same data: its own rule
        relaxed.reserve(_stats("ccvr", "K", b"m4", data=b"december"), job="e")
    relaxed.close()


def test_exact_moments_after_noised_ones_are_admitted_once(tmp_path: Path) -> None:
    """Only two *exact* releases difference exactly: after a noised one, the first
    exact release of changed data leaves, and it is the one the rule then holds."""
    ledger = ReleaseLedger(tmp_path / "privacy.db")
    ledger.reserve(_stats("ccvr", "F", b"m1", data=b"january", noised=True), job="a")
    ledger.consume("a")
    ledger.reserve(_stats("ccvr", "G", b"m2", data=b"june"), job="b")
    ledger.reserve(_stats("ccvr", "H", b"m3", data=b"july"), job="c")  # reserved, not left
    ledger.consume("b")
    with pytest.raises(ReleaseRepeated, match="the data changed since"):
        ledger.consume("c")  # re-checked the moment its input would leave
    ledger.close()


def test_training_releases_one_update_per_federation_and_round(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path / "privacy.db")

    def update(federation: str, rnd: int, model: bytes = b"m") -> Release:
        return Release(kind=UPDATE, federation=federation, model=model, round=rnd)

    ledger.reserve(update("F", 0), job="r0")
    ledger.reserve(update("F", 0), job="r0-retry")  # nothing left yet: a retry is admitted
    ledger.consume("r0")
    # the wire's round 0 is the coordinator's "round 1": the refusal counts as it does
    with pytest.raises(ReleaseRepeated, match=r"the update of round 1 already left"):
        ledger.reserve(update("F", 0, b"other model"), job="again")
    with pytest.raises(ReleaseRepeated):
        ledger.consume("r0-retry")
    ledger.reserve(update("F", 1), job="r1")  # the next round
    ledger.reserve(update("G", 0), job="g0")  # another federation
    ledger.close()
    relaxed = ReleaseLedger(tmp_path / "privacy.db", rules=LedgerRules(one_update_per_round=False))
    relaxed.reserve(update("F", 0), job="again")
    relaxed.consume("again")
    relaxed.close()


def test_evaluations_are_unique_per_executed_model_and_head_contents(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path / "privacy.db")

    def evaluation(model: bytes, content: bytes, federation: str = "F") -> Release:
        return Release(kind=EVALUATE, federation=federation, model=model, content=content)

    ledger.reserve(evaluation(b"round-1", b"H"), job="e1")
    ledger.consume("e1")
    ledger.reserve(evaluation(b"round-2", b"H"), job="e2")  # a new model
    ledger.consume("e2")
    ledger.reserve(evaluation(b"round-1", b"other heads"), job="e3")  # other heads
    with pytest.raises(ReleaseRepeated):
        ledger.reserve(evaluation(b"round-1", b"H", "G"), job="e4")  # renamed federation
    ledger.close()


def test_concurrent_jobs_for_one_release_cannot_both_be_consumed(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path / "privacy.db")
    # as many as the site starts for one purpose ([policy] max_unreleased_attempts)
    jobs = [f"job{k}" for k in range(3)]
    for job in jobs:
        ledger.reserve(_stats("ffc", "F", b"m"), job=job)
    outcomes: list[str] = []

    def consume(job: str) -> None:
        try:
            ledger.consume(job)
            outcomes.append("released")
        except ReleaseRepeated:
            outcomes.append("refused")

    threads = [threading.Thread(target=consume, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 2 + ["released"]
    ledger.close()


def test_unenforced_ledger_records_but_never_refuses(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path / "privacy.db", enforce=False)
    for job in ("a", "b"):
        ledger.reserve(_stats("ffc", "F", b"m"), job=job)
        ledger.consume(job)
    assert len(ledger.released()) == 2
    ledger.close()


# ====================================================================== evaluation
def _task(shapes: list[tuple[int, ...]], names: list[str] | None = None) -> pb.EvaluateTask:
    heads = []
    for k, shape in enumerate(shapes):
        name = names[k] if names else f"h{k}"
        header = header_for(np.zeros(shape))
        heads.append(pb.NamedTensorRef(name=name, tensor=pb.TensorRef(name=name, header=header)))
    model = pb.TensorRef(name="m", header=header_for(np.zeros(7)))
    return pb.EvaluateTask(model=model, heads=heads, round=-1)


def test_evaluation_heads_must_match_the_plan() -> None:
    ok = _task([(10, 4), (10, 4)], ["ffc", "ccvr"])
    check_evaluation(ok, num_classes=10, feature_dim=4, max_heads=2)
    for task, why in (
        (_task([(10, 4)] * 3), "heads"),
        (_task([(11, 4)]), "shape"),
        (_task([(10, 4), (10, 4)], ["a", "a"]), "distinct"),
        (_task([(10, 4)], ["none"]), "distinct"),
    ):
        with pytest.raises(EvaluationRefused, match=why):
            check_evaluation(task, num_classes=10, feature_dim=4, max_heads=2)


def test_counts_layout_and_content_key_without_names() -> None:
    task = _task([(10, 4), (10, 4)], ["ffc", "ccvr"])
    vector = counts_vector(task, 50, {"none": 30, "ccvr": 41, "ffc": 44})
    assert vector.tolist() == [50.0, 30.0, 44.0, 41.0]
    renamed = _task([(10, 4), (10, 4)], ["x", "y"])  # renaming heads is free: same key
    assert evaluation_content(task) == evaluation_content(renamed)
    assert evaluation_content(task) != evaluation_content(_task([(10, 4)], ["ffc"]))


def test_the_ledger_is_per_participant(tmp_path: Path) -> None:
    """One state directory holding two ids (tests, a shared host): their releases are
    their own."""
    a = ReleaseLedger(tmp_path / "privacy.db", participant="a")
    b = ReleaseLedger(tmp_path / "privacy.db", participant="b")
    a.reserve(_stats("ffc", "F", b"m"), job="j")
    a.consume("j")
    b.reserve(_stats("ffc", "F", b"m"), job="j")
    b.consume("j")
    with pytest.raises(ReleaseRepeated):
        a.reserve(_stats("ffc", "F", b"m"), job="k")
    a.close()
    b.close()
