"""``spherecal simulate``: a whole federation as real OS processes on loopback.

One coordinator process and N participant processes (``python -m spherecal.daemon
coordinator|participant``) talk real gRPC over 127.0.0.1 — with mutual TLS and a
throwaway CA under ``--tls``, otherwise plaintext, which both sides allow only on
loopback. Each participant takes its slice of the dataset exactly as the reference
runner partitions it (``spherecal.participant.data``), so with the same settings and seed the
federation reproduces ``spherecal reference``.

``--drop SPEC`` kills participants with SIGKILL at a named point (grammar in
:mod:`spherecal.simulate.drops`, e.g. ``p3:share``, ``p5:train@r2``).

The package, one idea per module:

- :mod:`.drops` — the ``--drop`` grammar;
- :mod:`.settings` — :class:`SimulationSettings` and its validation;
- :mod:`.configs` — the coordinator and participant TOML documents;
- :mod:`.processes` — :class:`Simulation`: spawning, watching and killing processes;
- :mod:`.results` — the ``results.json`` document;
- :mod:`.run` — :func:`run_simulation`, start to finish;
- :mod:`.oracle` — :func:`clear_statistics`, the plaintext truth tests compare with;
- :mod:`.launch` — starting the processes: a preloaded fork server, or fresh interpreters.

"In-process" simulation (every party a Python object in one process) is a different
thing: see :mod:`spherecal.inprocess_transport`.

Layout of ``--out DIR``::

    results.json               the result (schema in docs/deployment.md)
    coordinator.toml           the generated configs (rerunnable by hand)
    participants/pK.toml
    coordinator/state/state.db SQLite: rounds, jobs, audit log, events
    coordinator/out/           summary.json, model_{none,ffc,ccvr}.pt, model_spec.json
    out/pK/                    participant pK's copy of the final models (models.json)
    logs/                      one log per process
    certs/                     (with --tls) CA, server and client certificates
"""

from __future__ import annotations

from spherecal.simulate.drops import Drop, parse_drops
from spherecal.simulate.oracle import clear_statistics
from spherecal.simulate.processes import Simulation
from spherecal.simulate.run import run_simulation
from spherecal.simulate.settings import Progress, SimulationError, SimulationSettings

__all__ = [
    "Drop",
    "Progress",
    "Simulation",
    "SimulationError",
    "SimulationSettings",
    "clear_statistics",
    "parse_drops",
    "run_simulation",
]
