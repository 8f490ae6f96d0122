"""The service's privacy wiring in isolation: ``[privacy]`` parsing, the participant's
gate (plan, verify, charge, refuse), simulate's validation and the audit's tests."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spherecal.audit import byte_chi_square, ring_difference
from spherecal.config import ConfigError, parse_coordinator_config, parse_participant_config
from spherecal.crypto import JobSpec
from spherecal.participant.dp_gate import BudgetExceeded, ParticipantPrivacy, PrivacyRefused
from spherecal.proto import spherecal_pb2 as pb
from spherecal.simulate import SimulationSettings
from spherecal.spherefed.privacy.plan import plan_calibration_release
from spherecal.spherefed.privacy.settings import PrivacySettings
from spherecal.spherefed.reference import ReferenceConfig

IDS = ["p0", "p1", "p2", "p3"]
DIM, CLASSES, T = 8, 3, 3


def _release(epsilon: float = 1.0, **changes: object) -> pb.DPRelease:
    fields: dict[str, object] = {
        "kind": "ffc",
        "dim": DIM,
        "num_classes": CLASSES,
        "participants": len(IDS),
        "min_contributors": T,
        "max_examples": 1000,
        "epsilon": epsilon,
        "delta": 1e-5,
        "mechanism": "skellam",
        "quant_bits": 10,
        "colluders": 0,
    }
    fields.update(changes)
    return pb.DPRelease(**fields)  # type: ignore[arg-type]


def _spec(epsilon: float = 1.0, *, noise_scale: float = 1.0) -> JobSpec:
    plan = plan_calibration_release(
        "ffc",
        dim=DIM,
        num_classes=CLASSES,
        participants=len(IDS),
        min_contributors=T,
        epsilon_target=epsilon,
        delta=1e-5,
        max_examples=1000,
    )
    args = plan.job_spec_arguments()
    args["noise_bound"] = int(args["noise_bound"] * noise_scale)
    return JobSpec.create(IDS, threshold=T, **args)


def _admit(
    gate: ParticipantPrivacy, spec: JobSpec, release: pb.DPRelease, federation: str = "f1"
) -> Any:
    return gate.admit(
        spec.job_id.hex(), release, spec, dim=DIM, num_classes=CLASSES, federation=federation
    )


# ----------------------------------------------------------------- config
def test_privacy_tables_parse_for_both_roles() -> None:
    p = parse_participant_config(
        {
            "participant": {"id": "a"},
            "privacy": {"enabled": True, "epsilon": 2, "total_epsilon": 5.0, "delta": 1e-6},
        }
    )
    assert p.privacy == PrivacySettings(enabled=True, epsilon=2.0, total_epsilon=5.0, delta=1e-6)
    c, _ = parse_coordinator_config(
        {
            "federation": {"participants": IDS},
            "privacy": {"enabled": True, "epsilon": 1.5, "mechanism": "dgauss", "colluders": 1},
        }
    )
    assert c.privacy.enabled and c.privacy.mechanism == "dgauss" and c.privacy.colluders == 1
    assert parse_participant_config({"participant": {"id": "a"}}).privacy.enabled is False


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"enabled": True}, "needs epsilon"),
        ({"mechanism": "laplace"}, "mechanism"),
        ({"epsilon": -1.0}, "positive"),
        ({"budget": 1.0}, "unknown key"),
    ],
)
def test_privacy_table_errors(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_participant_config({"participant": {"id": "a"}, "privacy": table})


def test_coordinator_privacy_needs_secure_statistics() -> None:
    with pytest.raises(ConfigError, match="secure statistics"):
        parse_coordinator_config(
            {
                "federation": {"participants": IDS},
                "secure_aggregation": {"statistics": False},
                "privacy": {"enabled": True, "epsilon": 1.0},
            }
        )


def test_simulate_epsilon_needs_secure_statistics(tmp_path: Path) -> None:
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3),
        out=tmp_path,
        secure_statistics=False,
        epsilon=1.0,
    )
    with pytest.raises(ValueError, match="secure statistics"):
        settings.validate()


# ----------------------------------------------------------------- participant gate
def test_participant_admits_charges_then_refuses_over_budget(tmp_path: Path) -> None:
    gate = ParticipantPrivacy(
        PrivacySettings(enabled=True, epsilon=1.0, total_epsilon=1.2), "p1", tmp_path
    )
    plan, noise, entry = _admit(gate, _spec(), _release())
    assert noise.min_contributors == T and plan.length == noise.length
    assert entry["epsilon"] == pytest.approx(1.0, rel=1e-6)
    # another job of the same federation: the same charge, not a second one
    assert _admit(gate, _spec(), _release())[2] == entry
    with pytest.raises(BudgetExceeded) as caught:
        _admit(gate, _spec(), _release(), federation="f2")
    numbers = caught.value.numbers()
    assert numbers["limit"] == "total" and numbers["budget_epsilon"] == 1.2
    assert numbers["spent_epsilon"] == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(BudgetExceeded, match="per-release target"):
        _admit(gate, _spec(2.0), _release(2.0), federation="f3")
    gate.close()
    # the ledger lives in the participant's state directory and survives restarts
    again = ParticipantPrivacy(gate.settings, "p1", tmp_path)
    assert again.ledger(1e-5).spent("p1").releases == 1
    again.close()


def test_one_budget_comparison_per_federation_whatever_the_epsilon(tmp_path: Path) -> None:
    """The sweep attack: a coordinator lowers each job's ε until the site admits one,
    reading what the site spent elsewhere (with local DP-SGD its example count) from
    the first ε admitted. The first comparison of a federation is its only one."""
    settings = PrivacySettings(enabled=True, epsilon=2.0, total_epsilon=1.5)
    gate = ParticipantPrivacy(settings, "p1", tmp_path)
    _admit(gate, _spec(1.0), _release(1.0), federation="before")  # spent: 1.0
    with pytest.raises(BudgetExceeded):  # 1.0 and 1.5 exceed 1.5: the federation's answer
        _admit(gate, _spec(1.5), _release(1.5))
    for epsilon in (1.2, 0.9, 0.5, 0.1):  # never compared (0.1 fits: below)
        with pytest.raises(PrivacyRefused, match="already put to this site's budget"):
            _admit(gate, _spec(epsilon), _release(epsilon))
    with pytest.raises(PrivacyRefused, match="was refused: it would exceed"):
        _admit(gate, _spec(1.5), _release(1.5))  # the same plan: the same answer
    gate.close()
    again = ParticipantPrivacy(settings, "p1", tmp_path)  # and after a restart
    with pytest.raises(PrivacyRefused, match="already put to this site's budget"):
        _admit(again, _spec(0.5), _release(0.5))
    assert again.ledger(1e-5).spent("p1").releases == 1  # nothing charged in "f1"
    _admit(again, _spec(0.1), _release(0.1), federation="g")  # fits, asked in its own
    again.close()


def test_participant_refuses_mismatched_or_unsafe_jobs(tmp_path: Path) -> None:
    gate = ParticipantPrivacy(PrivacySettings(enabled=True, epsilon=5.0), "p1", tmp_path)
    with pytest.raises(PrivacyRefused, match="noise bound"):
        _admit(gate, _spec(noise_scale=0.5), _release())
    with pytest.raises(PrivacyRefused, match="δ"):
        _admit(gate, _spec(), _release(delta=1e-3))
    with pytest.raises(PrivacyRefused, match="l=9"):
        _admit(gate, _spec(), _release(dim=9))
    with pytest.raises(PrivacyRefused, match="DP plan"):
        gate.require_noise(pb.StatisticsTask(kind=pb.FFC))
    assert gate.ledger(1e-5).spent("p1").releases == 0  # nothing charged for refusals
    gate.close()


# ----------------------------------------------------------------- audit statistics
def test_chi_square_of_bytes_matches_pearson_by_hand() -> None:
    """Exact statistic from the counts; the p-value against the Wilson–Hilferty normal
    approximation of the χ²(255) tail (an independent formula, ~1 % accurate here)."""
    flat = bytes(range(256)) * 8  # every byte value exactly 8 times
    assert byte_chi_square(flat) == (0.0, 1.0)
    counts = np.full(256, 64)
    counts[:40] += 16
    counts[40:80] -= 16  # Σ (o - e)² / e = 80 · 256 / 64 = 320
    data = np.repeat(np.arange(256, dtype=np.uint8), counts).tobytes()
    stat, p = byte_chi_square(data)
    assert stat == pytest.approx(320.0, rel=1e-12)
    k = 255.0
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    assert p == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=0.02)
    assert 1e-4 < p < 1e-2


def test_chi_square_separates_random_from_structured_bytes() -> None:
    random_bytes = os.urandom(1 << 16)
    assert byte_chi_square(random_bytes)[1] > 1e-9
    plain = np.linspace(0.0, 1.0, 8192).tobytes()
    assert byte_chi_square(plain)[1] < 1e-30
    a = np.frombuffer(os.urandom(8 * 4096), dtype="<u8")
    b = (a + np.arange(4096, dtype=np.uint64)).astype("<u8")
    diff = np.frombuffer(ring_difference(b.tobytes(), a.tobytes()), dtype="<u8")
    assert np.array_equal(diff, np.arange(4096, dtype=np.uint64))
