"""The stderr lines of a :class:`~spherecal.simulate.Simulation`, and a wait for one:
the integration tests that halt or kill the coordinator at a named point wait for the
line the halt prints, never for a fixed time."""

from __future__ import annotations

import threading
import time

from spherecal.simulate import Simulation


class Lines:
    """Every line the simulation's processes print (the simulation's line callback)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, line: str) -> None:
        with self._cond:
            self.lines.append(line)
            self._cond.notify_all()

    def wait_for(self, needle: str, since: int, sim: Simulation, timeout_s: float) -> None:
        """Until a line from index ``since`` on holds ``needle``; fails after
        ``timeout_s`` or as soon as the coordinator exited without printing it."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not any(needle in line for line in self.lines[since:]):
                assert time.monotonic() < deadline, f"never saw {needle!r}: {self.lines[-10:]}"
                proc = sim.coordinator
                assert proc is None or proc.popen.poll() is None, (
                    f"the coordinator exited before {needle!r}: {self.lines[-10:]}"
                )
                self._cond.wait(0.5)
