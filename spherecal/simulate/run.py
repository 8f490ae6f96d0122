"""``run_simulation``: one simulated federation start to finish, ``results.json`` out."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable

from spherecal.results_schema import SimulationResults
from spherecal.simulate.processes import Simulation
from spherecal.simulate.settings import Progress, SimulationSettings

__all__ = ["run_simulation"]


def run_simulation(
    settings: SimulationSettings,
    progress: Progress | None = None,
    *,
    factory: Callable[[SimulationSettings, Progress], Simulation] = Simulation,
    listen: str = "127.0.0.1:0",
) -> SimulationResults:
    """Run the whole simulated federation; writes and returns ``results.json``.

    ``factory`` picks the engine (``spherecal.engines.ray`` passes its own
    :class:`Simulation`); ``listen`` is the coordinator's address."""
    say = progress or (lambda _m: None)
    if settings.out.exists():
        for stale in ("coordinator", "participants", "state", "logs"):
            shutil.rmtree(settings.out / stale, ignore_errors=True)
    t0 = time.monotonic()
    ref = settings.reference
    with factory(settings, say) as sim:
        port = sim.start_coordinator(listen)
        say(
            f"[simulate] coordinator on {listen.rpartition(':')[0]}:{port}; starting "
            f"{ref.participants} participants ({ref.dataset}, {ref.partition}"
            + (f" alpha={ref.alpha}" if ref.partition == "dirichlet" else "")
            + f", {ref.rounds} rounds, secure {'on' if settings.secure_updates else 'off'}/"
            + f"{'on' if settings.secure_statistics else 'off'})"
        )
        sim.start_participants()
        sim.wait_coordinator(settings.timeout_s)
        codes = sim.wait_participants()
        results = sim.results(codes, time.monotonic() - t0)
    path = settings.out / "results.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    say(f"[simulate] wrote {path}")
    return results
