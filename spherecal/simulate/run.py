"""``run_simulation``: one simulated federation start to finish, ``results.json`` out."""

from __future__ import annotations

import json
import shutil
import time
from typing import Any

from .processes import Simulation
from .settings import Progress, SimulationSettings

__all__ = ["run_simulation"]


def run_simulation(
    settings: SimulationSettings, progress: Progress | None = None
) -> dict[str, Any]:
    """Run the whole simulated federation; writes and returns ``results.json``."""
    say = progress or (lambda _m: None)
    if settings.out.exists():
        for stale in ("coordinator", "participants", "state", "logs"):
            shutil.rmtree(settings.out / stale, ignore_errors=True)
    t0 = time.monotonic()
    ref = settings.reference
    with Simulation(settings, say) as sim:
        port = sim.start_coordinator()
        say(
            f"[simulate] coordinator on 127.0.0.1:{port}; starting {ref.participants} "
            f"participants ({ref.dataset}, {ref.partition}"
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
