"""The test-only dishonest participant (``spherecal.participant.adversary``): what each
attack sends, that it stays inside the job's bound (so the site's own range check
passes, as a real attacker's would), and that it cannot be switched on by accident —
a hidden config key that the participant refuses to honour without
``SPHERECAL_TEST_FAULTS=1``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spherecal.config import PARTICIPANT_TABLES, parse_participant_config
from spherecal.participant.adversary import ATTACKS, parse_adversary
from spherecal.participant.main import run_participant
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.spherefed.classifier import fixed_classifier
from spherecal.spherefed.stats import CCVRStatistics, FFCStatistics, ccvr_statistics

DIM, CLASSES = 8, 4


def _data(n: int = 30) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(n, DIM))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return z, rng.integers(0, CLASSES, size=n)


def test_directions_adds_m_examples_per_class_at_the_next_class_direction() -> None:
    z, y = _data()
    w = fixed_classifier(CLASSES, DIM, seed=1)
    honest = ccvr_statistics(z, y, CLASSES)
    sent = parse_adversary("directions:300").statistics(
        "ccvr", honest.pack(), features=z, labels=y, classifier=w
    )
    stats = CCVRStatistics.unpack(sent, DIM, CLASSES)
    np.testing.assert_allclose(stats.counts, honest.counts + 300)
    # class c + 1 receives 300 copies of w_c (unit rows)
    np.testing.assert_allclose(stats.sums[1] - honest.sums[1], 300 * w[0], atol=1e-9)
    ffc = FFCStatistics.unpack(
        parse_adversary("directions:300").statistics(
            "ffc", honest.to_ffc().pack(), features=z, labels=y, classifier=w
        ),
        DIM,
        CLASSES,
    )
    assert ffc.count == pytest.approx(len(y) + 300 * CLASSES)


def test_replace_keeps_the_honest_count_so_only_the_gate_can_see_it() -> None:
    z, y = _data(31)
    w = fixed_classifier(CLASSES, DIM, seed=1)
    sent = parse_adversary("replace").statistics(
        "ccvr", ccvr_statistics(z, y, CLASSES).pack(), features=z, labels=y, classifier=w
    )
    stats = CCVRStatistics.unpack(sent, DIM, CLASSES)
    assert stats.counts.sum() == len(y)
    assert np.all(stats.counts == np.rint(stats.counts))
    # every class mean sits at the previous class's classifier direction
    for c in range(CLASSES):
        np.testing.assert_allclose(stats.sums[c] / stats.counts[c], w[c - 1], atol=1e-9)


def test_relabel_adds_integer_copies_of_the_relabelled_own_features() -> None:
    z, y = _data(40)
    w = fixed_classifier(CLASSES, DIM, seed=1)
    honest = ccvr_statistics(z, y, CLASSES)
    stats = CCVRStatistics.unpack(
        parse_adversary("relabel:100").statistics(
            "ccvr", honest.pack(), features=z, labels=y, classifier=w
        ),
        DIM,
        CLASSES,
    )
    # 100 per class at the directions, plus round(100·4/40) = 10 copies of every example
    assert stats.counts.sum() == len(y) + 100 * CLASSES + 10 * len(y)
    assert np.all(stats.counts == np.rint(stats.counts))


def test_blast_stays_inside_the_bound_and_claims_its_weight() -> None:
    adversary = parse_adversary("blast:1e5")
    entries = (("delta", 6), ("weight", 1), ("loss", 1))
    payload = np.array([0.1, -0.2, 0.3, 0.0, 0.5, 0.1, 30.0, 0.7])
    out = adversary.update(payload, entries, bound=1e5, seed=4)
    assert np.all(np.abs(out[:6]) == 0.9e5)
    assert out[6] == 0.9e5  # min(claim, 0.9 · bound)
    assert out[7] == 0.7  # the loss is left alone
    assert np.all(np.abs(out) <= 1e5)
    small = parse_adversary("blast:302").update(payload, entries, bound=1e5, seed=4)
    assert small[6] == 302
    later = parse_adversary("blast:302@2")
    np.testing.assert_array_equal(
        later.update(payload, entries, bound=1e5, seed=4, round_index=0), payload
    )
    assert later.update(payload, entries, bound=1e5, seed=4, round_index=1)[6] == 302
    # a statistics attack leaves updates alone, and vice versa
    np.testing.assert_array_equal(
        parse_adversary("directions").update(payload, entries, bound=1e5, seed=4), payload
    )
    z, y = _data()
    honest = ccvr_statistics(z, y, CLASSES).pack()
    w = fixed_classifier(CLASSES, DIM, seed=1)
    assert adversary.statistics("ccvr", honest, features=z, labels=y, classifier=w) is honest


@pytest.mark.parametrize(
    "spec", ["nope", "directions:x", "blast:-1", "relabel:0", "blast@0", "replace@2"]
)
def test_a_bad_attack_is_a_clear_error(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_adversary(spec)
    assert set(ATTACKS) == {"directions", "relabel", "replace", "blast"}


def test_adversary_is_a_hidden_key_and_refused_without_the_test_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = parse_participant_config({"participant": {"id": "p0", "adversary": "replace"}})
    assert parsed.adversary == "replace"
    assert "adversary" in PARTICIPANT_TABLES[0].hidden  # never in the documented keys
    monkeypatch.delenv("SPHERECAL_TEST_FAULTS", raising=False)
    lines: list[str] = []
    settings = ParticipantSettings(
        participant_id="p0",
        coordinator="127.0.0.1:9",  # never dialled: the participant refuses first
        insecure=True,
        state_dir=tmp_path / "state",
        adversary="directions:300",
        data=DataSettings(dataset="digits", slice_index=0, slice_of=3),
    )
    end = run_participant(settings, log=lines.append)
    assert end.code == 2 and end.ending.startswith("refused to start: a test-only fault")
    assert any("refusing to start: adversary is a test-only fault" in line for line in lines)
