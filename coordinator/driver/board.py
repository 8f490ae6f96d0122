"""The board: what the RPC handlers read to answer "what does participant p do next?".

Why a separate object: the federation driver runs on one thread and the gRPC
handlers on many. Everything they share — the current task, the published tensors,
the secure jobs, the phase, the final ``Done`` — lives here behind one condition
variable, and nothing else is shared. The driver *writes* the board (publish a
tensor, set a task, finish); the handlers *read* it and feed results into the task
objects it hands out, then :meth:`notify_driver` so the waiting driver wakes up.

Two wake-ups, on purpose: the driver is woken by every submission, the long-polling
handlers (``NextInstruction``, one per waiting participant) only when what they
could be told changes — a new task, a secure-aggregation stage closed, the end.
Waking every long poll on every submission made one stage cost O(n) wake-ups per
submission, O(n²) in all: at 1,000 participants a million re-evaluated
instructions per stage, all on the coordinator's CPU (``bench/long_poll.py``).

Two kinds of long poll: :meth:`Board.wait_instruction` blocks a thread (the
in-process engine, ``spherecal.inprocess_transport``); :meth:`Board.wait_instruction_async`
is what the gRPC server's polls await (issue #14) — one asyncio future per event
loop and *generation* (between two wake-ups), resolved from the waking thread with
``call_soon_threadsafe``, so n waiting polls cost no thread and a wake-up costs one
cross-thread call per loop, not n.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spherecal.coordinator.driver.secure_job import SecureJob
from spherecal.coordinator.driver.tasks import Task
from spherecal.coordinator.errors import FederationFailed
from spherecal.coordinator.state.registry import Member
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.codec import header_for
from spherecal.proto.federation_end import STOPPING_STATUS

__all__ = ["Board", "Published", "end_told_to_sites", "stopping_message"]


def stopping_message(reason: str) -> str:
    """What a participant is told when the coordinator process stops mid-federation."""
    return (
        f"coordinator stopping ({reason}); the federation is not over and resumes when "
        "the coordinator is restarted"
    )


def end_told_to_sites(status: str, message: str) -> str:
    """What every site is told of the federation's end (``Done``, and a join after
    it): the status, never the reasons.

    Why: the reasons name sites and what they sent — "first cause: p2 withdrew at
    masked: BAD_INPUT: this site withholds its input …", a budget refusal naming a
    site's ε limit, a plan refused for its labels — and a withheld input is a bit of
    that site's data, charged as a release to the coordinator alone. Relayed in
    ``Done`` it reached every other site (until 2026-11-27). The reasons stay in the
    operator's views: ``spherecal status``, the summary, the events."""
    if status == "completed":
        return "federation completed"
    return (
        f"federation {status}; its reasons are in the coordinator's status and summary "
        "(its operator's view)"
    )


@dataclass(frozen=True)
class Published:
    """A read-only tensor participants download by name (global model, heads, …)."""

    header: pb.TensorHeader
    array: npt.NDArray[np.float64]


class Board:
    """Shared, lock-protected federation state (see the module docstring)."""

    recheck_s: float = 5.0
    """A waiting long poll's safety re-check between the wake-ups that matter. At
    0.5 s, 1,000 waiting polls were 2,000 thread wake-ups a second queueing for the
    GIL (docs/scaling.md)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.phase = "starting"
        self.task: Task | None = None
        self.past_tasks: dict[str, str] = {}
        self.jobs: dict[str, SecureJob] = {}
        self.tensors: dict[str, Published] = {}
        self.done: tuple[str, str] | None = None
        self.done_delivered: set[str] = set()
        self.status_polled_at: float | None = None
        """When an operator's status view was last served (monotonic), if ever."""
        self.final_status_served = False
        """Whether a status view showing the federation's end was served."""
        self.federation_id = ""
        self.stopping: str | None = None
        self.suspended: str | None = None
        """Set by :meth:`suspend`: the process stops, the federation is not over."""
        self._polls = threading.Condition(threading.Lock())
        self._epoch = 0
        """Bumped whenever an instruction may have changed (see the docstring)."""
        self.parked_polls = 0
        """How many times a long poll evaluated its instruction, got Wait and went back
        to waiting: what a test waits on instead of sleeping and hoping the server
        has looked."""
        self._generations: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = {}
        """Per event loop, the future the async polls of this epoch await."""

    # ---------------------------------------------------------------- driver side
    def notify(self) -> None:
        """Instructions may have changed (a stage closed): wake the driver and every
        long poll."""
        with self.cond:
            self.cond.notify_all()
        self._wake_polls()

    def notify_driver(self) -> None:
        """A submission arrived: wake the driver only (it closes stages and then
        calls :meth:`notify`)."""
        with self.cond:
            self.cond.notify_all()

    def _wake_polls(self) -> None:
        with self._polls:
            self._epoch += 1
            self._polls.notify_all()
            generations, self._generations = self._generations, {}
        for loop, changed in generations.items():
            with contextlib.suppress(RuntimeError):  # that loop closed: its polls are gone
                loop.call_soon_threadsafe(_resolve, changed)

    def wait(self, seconds: float) -> None:
        """Sleep until notified or ``seconds`` passed (the driver's polling step)."""
        with self.cond:
            self.cond.wait(seconds)

    def stop(self, reason: str) -> None:
        """Ask the driver to end the federation now (SIGTERM, tests)."""
        with self.cond:
            self.stopping = reason
            self.cond.notify_all()
        self._wake_polls()

    def suspend(self, reason: str) -> None:
        """Stop this coordinator *process* (SIGTERM, a storage fault): the driver
        ends as for :meth:`stop`, but the participants are told ``stopping``
        (``spherecal.proto.federation_end``) and wait for a restart, which resumes
        the federation, instead of taking it as over."""
        with self.cond:
            if self.suspended is None and self.done is None:
                self.suspended = reason
        self.stop(reason)

    def check_stop(self) -> None:
        if self.stopping is not None:
            raise FederationFailed(f"stopped: {self.stopping}")

    def publish(self, name: str, array: npt.NDArray[np.float64]) -> pb.TensorRef:
        """Freeze a copy of ``array`` under ``name`` and return the reference to send."""
        frozen = np.ascontiguousarray(array, dtype=np.float64).copy()
        frozen.setflags(write=False)
        header = header_for(frozen)
        with self.cond:
            self.tensors[name] = Published(header, frozen)
        return pb.TensorRef(name=name, header=header)

    def unpublish(self, name: str) -> None:
        with self.cond:
            self.tensors.pop(name, None)

    def set_task(self, task: Task | None, phase: str) -> None:
        with self.cond:
            if self.task is not None:
                self.past_tasks[self.task.task_id] = self.task.kind
            self.task = task
            self.phase = phase
            if task is not None and task.job is not None:
                self.jobs[task.job.job_hex] = task.job
            self.cond.notify_all()
        self._wake_polls()

    def finish(self, status: str, message: str) -> None:
        """The federation is over: every later instruction is ``Done(status)``."""
        self.set_task(None, status)
        with self.cond:
            self.done = (status, message)
            self.cond.notify_all()
        self._wake_polls()

    # ---------------------------------------------------------------- handler side
    def status_served(self, *, final: bool) -> None:
        """An operator's status view was served (``final``: it showed the end). A
        watching ``spherecal status --watch`` then gets its last view before the
        process exits (:meth:`Federation.linger <spherecal.coordinator.driver.
        federation.Federation.linger>`)."""
        with self.cond:
            self.status_polled_at = time.monotonic()
            if final:
                self.final_status_served = True
            self.cond.notify_all()

    def instruction_for(self, member: Member, session: str | None = None) -> pb.Instruction:
        """What ``member`` does next, for the poll that authenticated with ``session``
        (default: the member's current one).

        Why the poll's own session: a task's instruction is handed out once per
        session (``Task.instruction_for``). A participant process that dies with a
        long poll open and restarts fast (a crash and a supervisor restart, or a
        forked test participant) joins again — a new session on the same
        :class:`Member` — while the dead incarnation's poll may still be waiting
        here. Woken by the next task, that zombie poll must not claim the new
        session's instruction for a connection nobody reads (seen as a federation
        stuck until the round deadline); it answers Wait instead."""
        pid = member.participant_id
        current = member.session
        if _superseded(current, session):
            return pb.Instruction(wait=pb.Wait(retry_after_ms=200, reason="session replaced"))
        with self.cond:
            if self.done is not None:
                self.done_delivered.add(pid)
                status, message = self.done
                if self.suspended is not None:
                    status, message = STOPPING_STATUS, stopping_message(self.suspended)
                else:
                    message = end_told_to_sites(status, message)
                return pb.Instruction(done=pb.Done(status=status, message=message))
            task = self.task
            phase = self.phase
        if task is not None and current is not None:
            instruction = task.instruction_for(pid, current)
            if instruction is not None:
                return instruction
            if task.job is not None and pid in task.expected:
                step = task.job.step_for(pid)
                if step is not None:
                    return pb.Instruction(task_id=task.task_id, secagg=step)
        return pb.Instruction(wait=pb.Wait(retry_after_ms=200, reason=phase))

    def wait_instruction(
        self, member: Member, timeout_s: float, session: str | None = None
    ) -> pb.Instruction:
        """Long poll: the next non-Wait instruction, or Wait after ``timeout_s``
        (``session``: the poll's own, see :meth:`instruction_for`)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._polls:
                epoch = self._epoch
            instruction = self.instruction_for(member, session)
            if _superseded(member.session, session):
                return instruction  # a newer join replaced this poll's session: end it
            remaining = deadline - time.monotonic()
            if not instruction.HasField("wait") or remaining <= 0:
                return instruction
            with self._polls:
                self.parked_polls += 1
                if self._epoch == epoch:  # nothing changed since we looked
                    # Woken by _wake_polls; the timeout is only a safety net.
                    self._polls.wait(min(remaining, self.recheck_s))

    async def wait_instruction_async(
        self, member: Member, timeout_s: float, executor: Executor, session: str | None = None
    ) -> pb.Instruction:
        """:meth:`wait_instruction` for a coroutine: awaits this generation's future
        instead of blocking a thread. The instruction is evaluated on ``executor``
        (it may wait for a secure job's lock, which the event loop must not)."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._polls:  # taken before evaluating: no wake-up can be missed
                changed = self._generations.get(loop)
                if changed is None:
                    changed = self._generations[loop] = loop.create_future()
            instruction = await loop.run_in_executor(
                executor, self.instruction_for, member, session
            )
            if _superseded(member.session, session):
                return instruction  # a newer join replaced this poll's session: end it
            remaining = deadline - time.monotonic()
            if not instruction.HasField("wait") or remaining <= 0:
                return instruction
            with self._polls:
                self.parked_polls += 1
            # asyncio.wait, not wait_for: a timeout must not cancel the shared future.
            await asyncio.wait((changed,), timeout=min(remaining, self.recheck_s))

    def tensor(self, name: str) -> Published | None:
        with self.cond:
            return self.tensors.get(name)

    def current_task(self, task_id: str) -> Task | str:
        """The current task with that id, or why there is none ("over"/"unknown")."""
        with self.cond:
            if self.task is not None and self.task.task_id == task_id:
                return self.task
            return "over" if task_id in self.past_tasks else "unknown"

    def job(self, job_id: bytes) -> SecureJob | None:
        with self.cond:
            return self.jobs.get(bytes(job_id).hex())

    def all_jobs(self) -> list[SecureJob]:
        with self.cond:
            return list(self.jobs.values())


def _superseded(current: str | None, session: str | None) -> bool:
    """Whether a poll that authenticated with ``session`` is no longer the member's
    (constant-time: the session is a bearer token)."""
    if session is None:
        return False
    return current is None or not secrets.compare_digest(current, session)


def _resolve(future: asyncio.Future[None]) -> None:
    """Wake every poll awaiting ``future`` (runs on its loop)."""
    if not future.done():
        future.set_result(None)
