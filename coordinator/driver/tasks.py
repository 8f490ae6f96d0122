"""Work handed to participants: train a round, compute statistics, evaluate.

A :class:`Task` knows whom it expects, the instruction each of them gets, and what
came back. Delivery is *once per session*: a participant that reconnects (new
session) before finishing gets the instruction again, one that merely polls again
does not (it is busy with it). For secure tasks "finished" means "has advertised its
keys to the task's job" — from then on the job's stages drive the participant.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.proto import spherecal_pb2 as pb

__all__ = ["EvaluationResult", "PlainUpload", "Task"]


@dataclass(frozen=True)
class PlainUpload:
    path: Path
    sha256: str
    num_samples: int = 0
    mean_loss: float = 0.0
    num_steps: int = 0


@dataclass(frozen=True)
class EvaluationResult:
    total: int
    correct: dict[str, int]


@dataclass
class Task:
    kind: str  # "train", "statistics" or "evaluate"
    expected: frozenset[str]
    instructions: dict[str, pb.Instruction]
    round: int | None = None
    purpose: str = ""
    job: SecureJob | None = None
    expected_shape: tuple[int, ...] = ()
    heads: tuple[str, ...] = ()
    task_id: str = field(default_factory=lambda: secrets.token_hex(8))
    delivered: dict[str, str] = field(default_factory=dict)
    uploads: dict[str, PlainUpload] = field(default_factory=dict)
    evaluations: dict[str, EvaluationResult] = field(default_factory=dict)
    withdrawn: dict[str, str] = field(default_factory=dict)
    _uploading: set[str] = field(default_factory=set)
    _sessions: dict[str, str] = field(default_factory=dict)
    """The session each participant last polled this task with."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for instruction in self.instructions.values():
            instruction.task_id = self.task_id

    def finished(self, participant: str) -> bool:
        if participant in self.withdrawn:
            return True
        if self.job is not None:
            return self.job.has_advertised(participant)
        return participant in self.uploads or participant in self.evaluations

    def instruction_for(self, participant: str, session: str) -> pb.Instruction | None:
        with self.lock:
            if participant not in self.expected:
                return None
            if self.job is not None:  # a comeback after a cut connection: deliver again
                session = f"{session}#{self.job.comebacks(participant)}"
            before = self._sessions.get(participant)
            self._sessions[participant] = session
            if before is not None and before != session and self.job is not None:
                self.job.rejoined(participant)  # back with a new session (issue #20)
            if self.finished(participant):
                return None
            if self.delivered.get(participant) == session:
                return None
            self.delivered[participant] = session
            return self.instructions[participant]

    def outstanding(self, alive: frozenset[str]) -> frozenset[str]:
        """Expected, alive, not yet finished (plaintext tasks)."""
        with self.lock:
            return frozenset(p for p in self.expected if p in alive and not self.finished(p))

    def begin_upload(self, participant: str) -> bool:
        with self.lock:
            if participant in self._uploading:
                return False
            self._uploading.add(participant)
            return True

    def end_upload(self, participant: str) -> None:
        with self.lock:
            self._uploading.discard(participant)

    def add_upload(self, participant: str, upload: PlainUpload) -> bool:
        with self.lock:
            if participant in self.uploads:
                return False
            self.uploads[participant] = upload
            return True

    def add_evaluation(self, participant: str, result: EvaluationResult) -> bool:
        with self.lock:
            if participant in self.evaluations:
                return False
            self.evaluations[participant] = result
            return True

    def withdraw(self, participant: str, reason: str) -> None:
        with self.lock:
            if participant in self.expected and participant not in self.withdrawn:
                self.withdrawn[participant] = reason
        if self.job is not None:
            self.job.withdraw(participant, reason)
