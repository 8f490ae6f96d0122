"""Many participants in one process: *virtual participants*, one thread each.

A simulation engine that hosts hundreds of participants per worker process (the Ray
engine, :mod:`spherecal.engines.ray`) runs each one exactly as ``spherecal
participant`` would — its own Ed25519 identity key, its own gRPC channel (own TCP
connection, a local subchannel pool; driven by the host's one event loop,
``spherecal.participant.loop_transport``, so a waiting participant costs no wake-ups), TLS
credentials, job ledger, privacy ledger, state directory and data slice, the same
:class:`~spherecal.participant.runner.ParticipantRunner` speaking the real protocol to the
real coordinator — but as a thread of a shared process, so the torch import, the
dataset and the interpreter are paid once per worker instead of once per
participant.

What may not be shared is kept apart: nothing in the participant code is
process-global except torch's thread count (set once per host, identically for
all). Fault injection is the one place where "process" mattered: a halted process
participant announces itself on stdout and is SIGKILLed by the harness. Here the
participant's :class:`~spherecal.participant.faults.Halter` calls :meth:`ParticipantHost`'s
kill instead, at exactly the same point: the participant's channel is closed (every
call in flight is cut, its presence stream ends, a masked upload breaks off
mid-stream — what the coordinator sees of a SIGKILL) and its thread unwinds with
:class:`ParticipantKilled`; any later call it attempts fails the same way, so it
never sends another byte.

Secrets (TLS key, identity key) shipped to a host are written to the participant's
own state directory with mode 0600; nothing here logs data, statistics or keys.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, TypeVar

import torch

from spherecal.crypto import identity_public_bytes
from spherecal.participant.data import LocalData, load_local_slices
from spherecal.participant.enrolment import load_or_enrol
from spherecal.participant.loop_transport import EventLoopThread, LoopTransport, _LoopPresence
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.secure_session import SqliteJobLedger
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.transport import TransportError
from spherecal.participant.trust import site_directory_trust
from spherecal.proto import spherecal_pb2 as pb

__all__ = [
    "KILLED_EXIT_CODE",
    "ComputeSlots",
    "HostReport",
    "ParticipantHost",
    "ParticipantKilled",
    "VirtualParticipant",
]

T = TypeVar("T")

KILLED_EXIT_CODE = -9
"""Exit code reported for a killed virtual participant (a SIGKILLed process's)."""

TLS_FILES = {
    "ca": "ca.pem",
    "cert": "cert.pem",
    "key": "key.pem",
    "identity": "identity.pem",
    "peers": "peers.txt",
}
"""The files a host may be shipped, and the names they get in ``state_dir/tls``:
the TLS credentials, the identity key, and the members the sites pinned (``[tls]
peer_keys``: a site that has it on the submitting machine keeps it on the host)."""


class ParticipantKilled(RuntimeError):
    """The participant was killed by fault injection; it sends nothing more."""


@dataclass(frozen=True)
class VirtualParticipant:
    """One participant to host: its settings, plus the TLS/identity files it needs
    (``ca``, ``cert``, ``key``, ``identity``, ``peers`` → bytes) when the host may run on
    another machine than the one that issued them."""

    settings: ParticipantSettings
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def participant_id(self) -> str:
        return self.settings.participant_id

    def materialise(self) -> ParticipantSettings:
        """Write the shipped files into the state directory (0600) and point the
        settings at them."""
        s = self.settings
        if not self.files:
            return s
        unknown = set(self.files) - set(TLS_FILES)
        if unknown:
            raise ValueError(f"unknown shipped file(s) {sorted(unknown)}")
        folder = s.state_dir / "tls"
        folder.mkdir(parents=True, exist_ok=True)
        paths: dict[str, Path] = {}
        for name, content in self.files.items():
            path = folder / TLS_FILES[name]
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
            paths[name] = path
        tls = replace(
            s.tls,
            ca=paths.get("ca", s.tls.ca),
            cert=paths.get("cert", s.tls.cert),
            key=paths.get("key", s.tls.key),
            peer_keys=paths.get("peers", s.tls.peer_keys),
        )
        return replace(s, tls=tls, identity_key=paths.get("identity", s.identity_key))


class _DeadPresence:
    """The presence stream of a killed participant: ends at once."""

    def __iter__(self) -> Iterator[pb.HeartbeatReply]:
        return iter(())

    def cancel(self) -> None:
        pass


class ComputeSlots:
    """At most ``slots`` participants of a host compute at once.

    A participant holds a slot while it builds its trainer or carries out an
    instruction, and gives it back while it waits for the coordinator inside one
    (a download, a submission): the slots bound the threads that want the CPU —
    hundreds of threads queueing for the GIL is what stalled a host
    (docs/scaling.md) — without serialising the round trips."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a host needs at least one compute slot")
        self.slots = slots
        self._semaphore = threading.BoundedSemaphore(slots)
        self._mine = threading.local()

    def _holding(self) -> bool:
        return bool(getattr(self._mine, "holding", False))

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        if self._holding():  # nested: already counted
            yield
            return
        self._semaphore.acquire()
        self._mine.holding = True
        try:
            yield
        finally:
            self._mine.holding = False
            self._semaphore.release()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Give this thread's slot back for the duration (if it holds one)."""
        if not self._holding():
            yield
            return
        self._mine.holding = False
        self._semaphore.release()
        try:
            yield
        finally:
            self._semaphore.acquire()
            self._mine.holding = True


class KillableTransport(LoopTransport):
    """The participant's gRPC transport with a kill switch (see module docstring)."""

    def __init__(
        self,
        settings: ParticipantSettings,
        loop: EventLoopThread,
        slots: ComputeSlots | None = None,
    ) -> None:
        super().__init__(settings, loop, while_waiting=slots.waiting if slots else None)
        self._killed = threading.Event()

    @property
    def killed(self) -> bool:
        return self._killed.is_set()

    def kill(self) -> None:
        """Cut the connection: every call in flight fails, every later one too."""
        self._killed.set()
        self.close()

    def _check(self) -> None:
        if self._killed.is_set():
            raise ParticipantKilled("this participant was killed")

    def _unary(self, fn: Any, request: object, timeout: float | None = None) -> Any:
        self._check()
        try:
            return super()._unary(fn, request, timeout)
        except (TransportError, ValueError):  # ValueError: call on a closed channel
            self._check()
            raise

    def download_tensor(self, request: pb.DownloadRequest) -> Iterator[pb.TensorChunk]:
        self._check()
        try:
            yield from super().download_tensor(request)
        except (TransportError, ValueError):
            self._check()
            raise

    def presence(self, request: pb.HeartbeatRequest) -> _LoopPresence | _DeadPresence:  # type: ignore[override]
        if self._killed.is_set():
            return _DeadPresence()
        try:
            return super().presence(request)
        except ValueError:  # the channel closed between the check and the call
            return _DeadPresence()


@dataclass
class HostReport:
    """What a host tells the driver at the end (plain data: it crosses process and
    machine boundaries)."""

    exit_codes: dict[str, int | None] = field(default_factory=dict)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    """Like the process engine's records; ``at_unix`` is wall-clock time."""
    errors: list[str] = field(default_factory=list)
    node: str = ""


class ParticipantHost:
    """Runs virtual participants in threads of this process."""

    def __init__(self, *, log_path: Path, threads: int = 1, compute_slots: int = 1) -> None:
        self.slots = ComputeSlots(compute_slots)
        if threads > 0:
            torch.set_num_threads(threads)
        self._loop = EventLoopThread(name="vp-grpc")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[str] = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - close()
        self._log_lock = threading.Lock()
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._transports: dict[str, KillableTransport] = {}
        self.report = HostReport(node=os.uname().nodename)

    # ---------------------------------------------------------------- logging
    def log(self, pid: str, message: str) -> None:
        line = f"[{pid} {time.strftime('%H:%M:%S')}] {message}\n"
        with self._log_lock:
            self._log.write(line)
            self._log.flush()

    # ---------------------------------------------------------------- lifecycle
    def start(self, participants: Sequence[VirtualParticipant]) -> None:
        """Load every participant's data (one dataset load per distinct partition),
        then start one thread per participant."""
        ids = [p.participant_id for p in participants]
        if len(set(ids)) != len(ids) or set(ids) & set(self._threads):
            raise ValueError("a host runs each participant once")
        settings = [p.materialise() for p in participants]
        data = load_local_slices([s.data for s in settings])
        for s, local in zip(settings, data, strict=True):
            thread = threading.Thread(
                target=self._run_one, args=(s, local), name=f"vp-{s.participant_id}", daemon=True
            )
            self._threads[s.participant_id] = thread
        for pid in ids:
            self._threads[pid].start()

    def _run_one(self, settings: ParticipantSettings, data: LocalData) -> None:
        pid = settings.participant_id
        code: int | None
        try:
            code = self._participate(settings, data)
        except ParticipantKilled:
            code = KILLED_EXIT_CODE
        except Exception as exc:  # one participant's crash is reported, not fatal
            self.log(pid, f"crashed: {type(exc).__name__}: {exc}")
            with self._lock:
                self.report.errors.append(f"{pid}: {type(exc).__name__}: {exc}")
            code = 1
        with self._lock:
            self.report.exit_codes[pid] = code

    def _participate(self, settings: ParticipantSettings, data: LocalData) -> int:
        """``spherecal.participant.main.run_participant`` minus the process-wide parts."""
        pid = settings.participant_id

        def say(message: str) -> None:
            self.log(pid, message)

        settings.state_dir.mkdir(parents=True, exist_ok=True)
        identity = load_or_enrol(settings, say)
        trust = site_directory_trust(settings, identity_public_bytes(identity), say)
        transport = KillableTransport(settings, self._loop, self.slots)
        with self._lock:
            self._transports[pid] = transport
        ledger = SqliteJobLedger(settings.state_dir / "jobs.db")

        def on_halt(stage: str, purpose: str, what: str) -> None:
            transport.kill()
            record = {
                "participant": pid,
                "stage": stage,
                "job": purpose,
                "task_or_job_id": what,
                "how": "connection cut by its virtual-participant host",
                "at_unix": time.time(),
            }
            with self._lock:
                self.report.dropped.append(record)
            say(f"killed at stage {stage} of {purpose}")
            raise ParticipantKilled(f"{pid} killed at {stage} of {purpose}")

        try:
            runner = ParticipantRunner(
                settings, transport, data, identity, ledger, trust,
                log=say, on_halt=on_halt, compute_slot=self.slots.hold,
                hold_jobs=False,  # no virtual participant is restarted from its disk
            )  # fmt: skip
            code = runner.run()
            if transport.killed:
                raise ParticipantKilled(pid)
            return code
        finally:
            transport.close()
            ledger.close()

    def kill(self, pid: str) -> None:
        with self._lock:
            transport = self._transports.get(pid)
        if transport is not None:
            transport.kill()

    def wait(self, timeout_s: float) -> HostReport:
        """Wait for every participant to finish (killing the stragglers after
        ``timeout_s``); the report of the host."""
        deadline = time.monotonic() + timeout_s
        for pid, thread in self._threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self.kill(pid)
        for pid, thread in self._threads.items():
            thread.join(15.0)
            with self._lock:
                if thread.is_alive():
                    self.report.exit_codes[pid] = None
                    self.report.errors.append(f"{pid}: did not stop")
        with self._lock:
            return replace(self.report, exit_codes=dict(self.report.exit_codes))

    def close(self) -> None:
        for pid in list(self._threads):
            self.kill(pid)
        self._loop.stop()
        with self._log_lock:
            self._log.close()
