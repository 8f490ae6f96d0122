"""SecAggPolicy: defaults, validation, spec-time refusals, and the error tree."""

from __future__ import annotations

import inspect
import pickle
import re

import pytest

import spherecal.crypto._exceptions as exceptions_module
from spherecal import crypto
from spherecal.crypto import (
    ConsistencyRoundRequired,
    InvalidSpec,
    JobSpec,
    MemoryJobLedger,
    PolicyViolation,
    SecAggError,
    SecAggParticipant,
    SecAggPolicy,
    ThresholdTooLow,
    TooFewParticipants,
    generate_identity,
    identity_public_bytes,
)
from spherecal.crypto.policy import check_threshold


def _participant(
    spec: JobSpec, policy: SecAggPolicy | None = None
) -> tuple[object, MemoryJobLedger]:
    ids = spec.participants
    keys = {p: generate_identity() for p in ids}
    directory = {p: identity_public_bytes(k) for p, k in keys.items()}
    ledger = MemoryJobLedger()
    client = SecAggParticipant(spec, ids[0], keys[ids[0]], directory, ledger=ledger, policy=policy)
    return client, ledger


def test_defaults_are_the_safe_setting_and_relaxations_are_listed() -> None:
    policy = SecAggPolicy()
    assert policy.require_consistency_round and policy.require_majority_threshold
    assert (policy.min_participants, policy.min_inputs) == (3, 3)
    assert policy.relaxations() == ()
    relaxed = SecAggPolicy(
        require_consistency_round=False,
        require_majority_threshold=False,
        min_participants=2,
        min_inputs=2,
    )
    text = " ".join(relaxed.relaxations())
    for key in (
        "require_consistency_round",
        "require_majority_threshold",
        "min_participants",
        "min_inputs",
    ):
        assert key in text
    assert SecAggPolicy(min_participants=5, min_inputs=4).relaxations() == ()  # stricter


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_participants": 1},
        {"min_inputs": 1},
        {"min_inputs": True},
        {"min_participants": 2.5},
        {"require_consistency_round": 0},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec):
        SecAggPolicy(**kwargs)  # type: ignore[arg-type]


def test_from_mapping_reads_a_toml_table_and_refuses_unknown_keys() -> None:
    assert SecAggPolicy.from_mapping({"min_inputs": 4}) == SecAggPolicy(min_inputs=4)
    with pytest.raises(InvalidSpec, match="unknown policy keys"):
        SecAggPolicy.from_mapping({"min_input": 4})
    with pytest.raises(TypeError):
        SecAggPolicy(False)  # type: ignore[call-arg]  # keyword-only


def test_spec_time_refusals_claim_no_job_id() -> None:
    ids = [f"p{i}" for i in range(5)]
    no_round = JobSpec.create(ids, threshold=3, length=4, bound=1.0, consistency_check=False)
    with pytest.raises(ConsistencyRoundRequired):
        _participant(no_round)
    low = JobSpec.create(ids, threshold=2, length=4, bound=1.0)
    with pytest.raises(ThresholdTooLow, match="2t > 5"):
        _participant(low)
    pair = JobSpec.create(ids[:2], threshold=2, length=4, bound=1.0)
    with pytest.raises(TooFewParticipants):
        _participant(pair)
    strict = SecAggPolicy(min_participants=6)
    with pytest.raises(TooFewParticipants, match="at least 6"):
        _participant(JobSpec.create(ids, threshold=3, length=4, bound=1.0), strict)
    client, ledger = _participant(JobSpec.create(ids, threshold=3, length=4, bound=1.0))
    assert client is not None and len(ledger._seen) == 1
    # A refused participant claimed nothing: the same job may be accepted later.
    ledger2 = MemoryJobLedger()
    keys = {p: generate_identity() for p in ids}
    directory = {p: identity_public_bytes(k) for p, k in keys.items()}
    with pytest.raises(ConsistencyRoundRequired):
        SecAggParticipant(no_round, "p0", keys["p0"], directory, ledger=ledger2)
    assert ("p0", no_round.job_id) not in ledger2


def test_threshold_rule_counts_the_largest_harary_neighbourhood() -> None:
    """Odd degree on an odd number of participants: one vertex has k+2 holders."""
    ids = [f"p{i}" for i in range(9)]
    spec = JobSpec.create(
        ids, threshold=3, length=4, bound=1.0, graph="harary", degree=3, consistency_check=False
    )
    with pytest.raises(ThresholdTooLow, match="2t > 5"):  # k+2 = 5 holders; 2*2 = 4
        check_threshold(
            SecAggPolicy(),
            JobSpec.create(ids, threshold=2, length=4, bound=1.0, graph="harary", degree=3),
        )
    check_threshold(SecAggPolicy(), spec)  # 6 > 5
    check_threshold(
        SecAggPolicy(require_majority_threshold=False),
        JobSpec.create(ids, threshold=2, length=4, bound=1.0, graph="harary", degree=3),
    )


def _tree_names() -> set[str]:
    doc = exceptions_module.__doc__ or ""
    return set(re.findall(r"[├└]── (\w+)", doc))


def test_every_error_is_in_the_documented_tree_with_a_unique_stable_kind() -> None:
    classes = {
        name: obj
        for name, obj in inspect.getmembers(exceptions_module, inspect.isclass)
        if issubclass(obj, SecAggError)
    }

    # Every subclass anywhere in the package (e.g. defined in another module) too.
    def walk(cls: type) -> set[type]:
        out: set[type] = {cls}
        subclasses: list[type] = type.__subclasses__(cls)
        for sub in subclasses:
            out |= walk(sub)
        return out

    assert {c.__name__ for c in walk(SecAggError)} - {"SecAggError"} <= _tree_names()
    assert set(classes) - {"SecAggError"} == _tree_names()
    kinds = [c.kind for c in classes.values()]
    assert len(kinds) == len(set(kinds))
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", k) for k in kinds)
    # Kinds the wire layer relies on (never change once released).
    assert crypto.ThresholdTooLow.kind == "threshold_too_low"
    assert crypto.OverlappingReveal.kind == "both_share_kinds"
    assert crypto.ConsistencyRoundRequired.kind == "consistency_round_required"
    assert crypto.TooFewInputs.kind == "too_few_inputs"
    for name in (
        "ConsistencyRoundRequired",
        "ThresholdTooLow",
        "TooFewParticipants",
        "TooFewInputs",
        "DoubleReveal",
        "OverlappingReveal",
        "KeySubstitution",
    ):
        assert issubclass(classes[name], PolicyViolation)
    assert issubclass(crypto.RingOverflowRisk, crypto.InvalidSpec)
    assert set(exceptions_module.__all__) == set(classes)
    assert set(exceptions_module.__all__) <= set(crypto.__all__)


def test_errors_with_attributes_survive_pickling_for_process_pools() -> None:
    err = crypto.ForgedShare("x", complaint=None)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is crypto.ForgedShare and again.complaint is None
    over = crypto.RingOverflowRisk(participants=3, bound=1.0, scale_bits=62, noise_bound=0)
    assert pickle.loads(pickle.dumps(over)).cause == "values"
