"""A coordinator re-planning one federation to ask a site's data checks again
(``spherecal.participant.fixed_plan``).

The attack: the site checks the plan it joins under against its own data — its labels
must fit the model's classes — and stops when they do not. Expiring the session is
free, so a coordinator could answer each rejoin with the same federation id and a plan
one class smaller, and read the site's highest label from the plan at which it
stopped. Played against a real :class:`ParticipantRunner` (real data files, real
SQLite release ledger) through its main loop: every poll is answered ``SESSION_EXPIRED``
and every join with the next plan of the attack.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from spherecal import crypto
from spherecal.crypto.replay import MemoryJobLedger
from spherecal.participant.data import LocalData, load_local_data
from spherecal.participant.release_ledger import ReleaseLedger
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.participant.transport import TransportError
from spherecal.participant.trust import DirectoryTrust
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import model_spec_to_proto
from spherecal.proto.plan_terms import plan_terms
from spherecal.spherefed.network import ModelSpec
from tests.security.hostile_plan import Presence

IDENTITY = crypto.generate_identity()


def _plan(classes: int, *, federation: str = "f", heartbeat_ms: int = 1000) -> pb.Plan:
    return pb.Plan(
        federation_id=federation,
        model=model_spec_to_proto(ModelSpec(extractor="mlp", num_classes=classes)),
        training=pb.LocalTraining(epochs=1, batch_size=32, lr=0.1, loss="mse"),
        rounds=1,
        heartbeat_interval_ms=heartbeat_ms,
        num_participants=5,
        example_count_noise_sd=4,
    )


class Replanning:
    """Joins get ``plans`` in turn; every poll expires the session; then ``done``."""

    def __init__(self, plans: list[pb.Plan]) -> None:
        self.plans = plans
        self.joins = 0
        self.reports: list[pb.FailureReport] = []

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        plan = self.plans[min(self.joins, len(self.plans) - 1)]
        self.joins += 1
        return pb.JoinReply(session=f"s{self.joins}", plan=plan)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self.joins < len(self.plans):
            raise TransportError(
                grpc.StatusCode.UNAUTHENTICATED, "session expired", reason=pb.SESSION_EXPIRED
            )
        return pb.Instruction(done=pb.Done(status="completed", message="over"))

    def presence(self, request: pb.HeartbeatRequest) -> Presence:
        return Presence()

    def report_failure(self, request: pb.FailureReport) -> pb.Receipt:
        self.reports.append(request)  # a site refusing the plan says so as it leaves
        return pb.Receipt()

    def close(self) -> None:
        pass


def _site_data(tmp: Path, top_label: int) -> LocalData:
    """A site's own ``.npz`` whose labels reach ``top_label`` (its label range comes
    from the labels: no ``[data] num_classes``)."""
    rng = np.random.default_rng(top_label)
    path = tmp / f"labels-to-{top_label}.npz"
    np.savez(
        path,
        x=rng.standard_normal((60, 1, 8, 8)).astype(np.float32),
        y=np.arange(60) % (top_label + 1),
    )
    return load_local_data(DataSettings(dataset="npz", root=str(path)))


LAST: list[pb.FailureReport] = []
"""What the site told the coordinator as it left, in the last :func:`_run`."""


def _run(tmp: Path, data: LocalData, plans: list[pb.Plan]) -> tuple[int, list[str], int]:
    lines: list[str] = []
    transport = Replanning(plans)
    runner = ParticipantRunner(
        ParticipantSettings(
            participant_id="p0", coordinator="127.0.0.1:1", insecure=True, state_dir=tmp / "st"
        ),
        transport,  # type: ignore[arg-type]
        data,
        IDENTITY,
        MemoryJobLedger(),
        DirectoryTrust(None),
        log=lines.append,
    )
    code = runner.run()
    LAST.clear()
    LAST.extend(transport.reports)
    return code, lines, transport.joins


ATTACK = [_plan(k) for k in range(10, 0, -1)]  # one class fewer at every rejoin


@pytest.mark.parametrize("top_label", [9, 6, 3])
def test_a_replanned_federation_stops_the_site_whatever_its_labels(
    tmp_path: Path, top_label: int
) -> None:
    code, lines, joins = _run(tmp_path, _site_data(tmp_path, top_label), ATTACK)
    assert code == 2
    # the first changed plan ends it, before its classes are checked against the
    # labels: the same join for every site, so the coordinator learns nothing
    assert joins == 2
    changed = "changed the plan of federation f since this site accepted it (model)"
    assert any(changed in line for line in lines)
    assert not any("local labels reach" in line for line in lines)
    # and told the coordinator why it left, in words the same for every site
    (report,) = LAST
    assert report.task_id == "" and changed in report.reason


def test_the_fixed_plan_outlives_the_site_process(tmp_path: Path) -> None:
    data = _site_data(tmp_path, 9)
    code, _, _ = _run(tmp_path, data, [_plan(10)])
    assert code == 0
    # a new process of the site (same state directory) is asked with 9 classes
    code, lines, joins = _run(tmp_path, data, [_plan(9)])
    assert (code, joins) == (2, 1)
    assert any("changed the plan of federation f" in line for line in lines)
    assert not any("local labels reach" in line for line in lines)


def test_the_same_plan_again_and_pacing_changes_are_accepted(tmp_path: Path) -> None:
    """A restarted coordinator sends the same terms (perhaps another heartbeat): the
    site goes on; another federation's plan is its own."""
    data = _site_data(tmp_path, 9)
    plans = [_plan(10), _plan(10, heartbeat_ms=2500), _plan(10)]
    code, lines, joins = _run(tmp_path, data, plans)
    assert (code, joins) == (0, 3), lines
    code, lines, _ = _run(tmp_path, data, [_plan(12, federation="g")])
    assert code == 0, lines
    ledger = ReleaseLedger(tmp_path / "st" / "privacy.db", participant="p0")
    try:
        assert ledger.fix_plan("f", plan_terms(_plan(10))) is None
        assert ledger.fix_plan("g", plan_terms(_plan(12, federation="g"))) is None
    finally:
        ledger.close()


def test_without_the_fixed_plan_the_attack_reads_the_highest_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation check: with the rule removed, the plan at which the site stops is
    its highest label."""
    import spherecal.participant.plan_refusal as plan_refusal

    monkeypatch.setattr(plan_refusal, "fix_plan", lambda ledger, plan: None)
    for top_label in (9, 6, 3):
        tmp = tmp_path / str(top_label)
        tmp.mkdir()
        code, lines, joins = _run(tmp, _site_data(tmp, top_label), ATTACK)
        assert code == 2
        stopped_at = 10 - (joins - 1)  # the classes of the plan it refused
        assert stopped_at == top_label
        assert any("local labels reach" in line for line in lines)
        (report,) = LAST  # what it is told is made of the plan alone (its class count)
        assert report.reason.startswith(
            f"this site's labels do not fit the plan's model of {stopped_at} classes"
        )
        assert "reach" not in report.reason
