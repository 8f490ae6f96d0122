"""``spherecal simulate --engine threads``: every participant a virtual participant
in *this* process.

The coordinator is the same real OS process as with ``--engine processes``; the
participants are :class:`~spherecal.engines.virtual.VirtualParticipant` threads of
the calling process, hosted by one :class:`~spherecal.engines.virtual.ParticipantHost`
— each with its own Ed25519 identity key, its own gRPC channel (own TCP connection),
ledgers, state directory and data slice, running the same
:class:`~spherecal.participant.runner.ParticipantRunner` over real gRPC to the real
coordinator, with secure aggregation exactly as configured. It is the Ray engine
(:mod:`spherecal.engines.ray`) with one local worker and no Ray.

Why: with one process per participant, a small federation spends most of its wall
time starting interpreters and importing torch (measured on the 2-core development
box: a 10-participant, 15-round digits cell of ``spherecal experiment --engine
service`` took 38–105 s, of which the 10 participant processes took ~34 s to join
and the federation itself ~13 s; see ``docs/baselines.md``). Here the import, the
dataset load and torch's first-call warm-up are paid once.

What changes for the participants: nothing they compute. The one process-global
thing a participant touches, torch's global RNG while building its model, is
guarded in :func:`spherecal.spherefed.network.build_model`; the aggregate is an exact sum in
the ring, independent of arrival order. Tests assert the numbers equal the process
engine's and the in-process reference's.

A participant killed by ``--drop`` has its channel cut at that point
(:mod:`spherecal.engines.virtual`); restarting one participant (``start_participants
(only=...)``) is not supported — a chaos test that restarts participants uses the
process engine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from spherecal.config import load_participant_config
from spherecal.engines.virtual import ParticipantHost, VirtualParticipant
from spherecal.results_schema import SimulationResults
from spherecal.simulate import (
    Progress,
    Simulation,
    SimulationError,
    SimulationSettings,
    run_simulation,
)
from spherecal.simulate.results import dropped_entry

__all__ = ["ThreadSimulation", "run_threads_simulation"]


class ThreadSimulation(Simulation):
    """:class:`~spherecal.simulate.Simulation` with the participants as threads here."""

    def __init__(self, settings: SimulationSettings, progress: Progress | None = None) -> None:
        self._host: ParticipantHost | None = None
        super().__init__(settings, progress)

    def start_participants(self, only: Sequence[str] | None = None) -> None:
        """Start every participant as a thread of this process (``only`` is not
        supported: the roster starts at once)."""
        if only is not None:
            raise SimulationError("the threads engine starts the whole roster at once")
        if self.port is None:
            raise SimulationError("start the coordinator first")
        if self._host is not None:
            raise SimulationError("the participants are already started")
        port = self.port
        roster = [
            VirtualParticipant(load_participant_config(self.participant_config(k, port)))
            for k in range(len(self.settings.participant_ids))
        ]
        self._host = ParticipantHost(
            log_path=self.out / "logs" / "participants.log",
            threads=self.settings.threads,
            compute_slots=os.cpu_count() or 1,  # this process's CPUs (docs/scaling.md)
        )
        self._host.start(roster)
        self.progress(f"[simulate] threads: {len(roster)} virtual participants in this process")

    def kill_participant(self, pid: str, why: str = "connection cut by the harness") -> None:
        """Cut participant ``pid``'s connection now (what the coordinator sees of a
        SIGKILL); it sends nothing more."""
        if self._host is None or pid not in self.settings.participant_ids:
            raise SimulationError(f"no virtual participant {pid!r}")
        self._host.kill(pid)
        with self._lock:
            self.dropped.append(
                {
                    "participant": pid,
                    "stage": "external",
                    "job": "-",
                    "task_or_job_id": "",
                    "how": why,
                    "at_s": round(_elapsed(self), 3),
                }
            )

    def wait_participants(self, timeout: float = 30.0) -> dict[str, int | None]:
        codes: dict[str, int | None] = {pid: None for pid in self.settings.participant_ids}
        if self._host is None:
            return codes
        report = self._host.wait(timeout)
        codes.update(report.exit_codes)
        offset = _unix_at_start(self)
        for record in report.dropped:
            entry = dropped_entry(record, float(record["at_unix"]) - offset)
            with self._lock:
                self.dropped.append(entry)
        for error in report.errors:
            self.progress(f"[simulate] threads: {error}")
        return codes

    def results(self, exit_codes: dict[str, int | None], wall_s: float) -> SimulationResults:
        out = super().results(exit_codes, wall_s)
        out["engine"] = {"name": "threads"}
        return out

    def close(self) -> None:
        host, self._host = self._host, None
        try:
            super().close()  # the coordinator first: its streams end, threads unwind
        finally:
            if host is not None:
                host.wait(0.0)
                host.close()


def _elapsed(sim: Simulation) -> float:
    return time.monotonic() - sim._t0


def _unix_at_start(sim: Simulation) -> float:
    return time.time() - _elapsed(sim)


def run_threads_simulation(
    settings: SimulationSettings, progress: Progress | None = None
) -> SimulationResults:
    """:func:`~spherecal.simulate.run_simulation` with the threads engine."""
    return run_simulation(settings, progress, factory=ThreadSimulation)
