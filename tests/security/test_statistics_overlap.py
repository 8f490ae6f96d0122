"""A secure statistics job's feature pass may run while its keys and shares are
exchanged — only where the masked upload's moment is not held back (issue #24;
``spherecal.participant.statistics_task``).

A real participant runner against the sharing coordinator double of
``test_share_before_work``, given a secure FFC statistics task. The double gives
the share step only once the runner's feature pass has *finished* (or after a
bounded wait): with ``[policy] min_local_work_s = 0`` the feature pass runs
concurrently with the exchange, so it finishes before the shares are asked for;
with ``min_local_work_s > 0`` (a site that hides its local work's duration) the
order stays strict — advertisement, shares, then the feature pass — whatever the
coordinator does. The assertions are about the order of what the runner sends and
computes, never about time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from spherecal import crypto
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.participant.policy import PolicySettings
from spherecal.participant.trainer import LocalTrainer
from spherecal.proto import spherecal_pb2 as pb
from tests.security.test_malicious_coordinator_service import (
    _ffc_length,
    _job,
    _settings,
)
from tests.security.test_share_before_work import SharingCoordinator, _run

FALLBACK_S = 3.0
"""How long the double withholds the share step for a feature pass that never comes
before it (the strict order): then it gives the step anyway."""


class StatisticsSharing(SharingCoordinator):
    """Gives the share step of a secure statistics task once ``computed`` is set (the
    feature pass finished) or :data:`FALLBACK_S` passed since the advertisement."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.computed = threading.Event()

    def secure_statistics(self, model: GlobalModel, task_id: str) -> pb.Instruction:
        ref = self.publish(f"global-{task_id}", model.initial_vector)
        job = _job("ffc", _ffc_length(model))
        self.answer[crypto.JobSpec.from_bytes(job.spec).job_id] = task_id
        return pb.Instruction(
            task_id=task_id, statistics=pb.StatisticsTask(kind=pb.FFC, model=ref, secure=job)
        )

    def _share_step(self, job_id: bytes, advertisement: bytes) -> pb.Instruction:
        # the parent finds the job among train tasks: present it as one
        self.instructions = [
            pb.Instruction(task_id=i.task_id, train=pb.TrainTask(secure=i.statistics.secure))
            if i.HasField("statistics")
            else i
            for i in self.instructions
        ]
        return super()._share_step(job_id, advertisement)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        if self._step is not None and not self.computed.is_set():
            left = self._ready_at + FALLBACK_S - time.monotonic()
            if left > 0 and not self.computed.wait(min(left, request.wait_ms / 1000.0)):
                return pb.Instruction(wait=pb.Wait(retry_after_ms=50, reason="sharing"))
        return super().next_instruction(request)


def _recording(coordinator: StatisticsSharing, monkeypatch: pytest.MonkeyPatch) -> None:
    real = LocalTrainer.statistics

    def statistics(
        self: LocalTrainer, vector: npt.NDArray[np.float64], kind: str, **options: Any
    ) -> Any:
        out = real(self, vector, kind, **options)
        coordinator.events.append("statistics computed")
        coordinator.computed.set()
        return out

    monkeypatch.setattr(LocalTrainer, "statistics", statistics)


@pytest.mark.parametrize("hidden", [False, True])
def test_the_feature_pass_overlaps_the_key_exchange_only_where_its_time_is_not_hidden(
    tmp_path: Path, model: GlobalModel, monkeypatch: pytest.MonkeyPatch, hidden: bool
) -> None:
    coordinator = StatisticsSharing(federation="fed", model=model, script=[])
    _recording(coordinator, monkeypatch)
    coordinator.play([coordinator.secure_statistics(model, "s1")])
    settings = replace(
        _settings(tmp_path, allow_plaintext=False),
        policy=PolicySettings(min_local_work_s=0.01 if hidden else 0.0),
    )
    code, lines = _run(settings, coordinator)
    assert code == 0, lines
    assert coordinator.failures == []
    events = coordinator.events
    assert events[0] == "download global-s1", events
    if hidden:  # strictly: keys, shares, then the feature pass
        assert events[1:] == ["submit ADVERTISE", "submit SHARE", "statistics computed"]
        assert any("shared keys before the local work" in line for line in lines), lines
    else:  # the feature pass ran during the exchange: done before the shares were asked
        assert sorted(events[1:3]) == ["statistics computed", "submit ADVERTISE"], events
        assert events[3:] == ["submit SHARE"], events
        assert any("shared keys while the local work runs" in line for line in lines), lines
    # either way the input computed is the one set for the job: one statistics line
    assert len([line for line in lines if "ffc statistics:" in line]) == 1


class NextStepRecorder(StatisticsSharing):
    """Gives the share step at once; records when the instruction after it (the end of
    the federation, here) is handed to the runner, in ``events`` and ``next_given``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.computed.set()  # no gating of the share step on the feature pass
        self.shared = False
        self.next_given = threading.Event()

    def submit_secagg(self, request: pb.SecAggSubmission) -> pb.Receipt:
        if request.stage == pb.SHARE:
            self.shared = True
        return super().submit_secagg(request)

    def next_instruction(self, request: pb.InstructionRequest) -> pb.Instruction:
        instruction = super().next_instruction(request)
        if self.shared and instruction.WhichOneof("kind") not in ("wait", None):
            self.events.append(f"given {instruction.WhichOneof('kind')}")
            self.next_given.set()
        return instruction


def test_the_next_step_is_fetched_while_the_overlapped_feature_pass_runs(
    tmp_path: Path, model: GlobalModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the overlap, once the shares are answered the runner waits for the job's
    next instruction while its feature pass is still running (so the masked step is in
    hand when the input is set). The double's feature pass does not finish until that
    instruction was handed out (or :data:`FALLBACK_S` passed, which fails the order
    asserted): the runner acts on it only after the pass — the task's one statistics
    line comes before the federation's end is logged."""
    coordinator = NextStepRecorder(federation="fed", model=model, script=[])
    real = LocalTrainer.statistics

    def statistics(
        self: LocalTrainer, vector: npt.NDArray[np.float64], kind: str, **options: Any
    ) -> Any:
        coordinator.next_given.wait(FALLBACK_S)
        out = real(self, vector, kind, **options)
        coordinator.events.append("statistics computed")
        return out

    monkeypatch.setattr(LocalTrainer, "statistics", statistics)
    coordinator.play([coordinator.secure_statistics(model, "s1")])
    settings = replace(
        _settings(tmp_path, allow_plaintext=False), policy=PolicySettings(min_local_work_s=0.0)
    )
    code, lines = _run(settings, coordinator)
    assert code == 0, lines
    assert coordinator.failures == []
    events = coordinator.events
    assert events.index("submit SHARE") < events.index("given done"), events
    assert events.index("given done") < events.index("statistics computed"), events
    assert _line(lines, "ffc statistics:") < _line(lines, "coordinator says done"), lines


def _line(lines: list[str], text: str) -> int:
    (found,) = [i for i, line in enumerate(lines) if text in line]
    return found
