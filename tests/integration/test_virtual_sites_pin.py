"""Virtual sites under mutual TLS pin their peers as a process site does.

The thread and Ray engines' sites once loaded ``[tls] peer_keys`` through their own
copy of the code, without the check that the file pins the site itself, and the Ray
engine did not ship the file to its hosts (its sites ran unpinned, saying nothing).
The Ray engine did not even write the pin file its sites' configs named. Both now go
through :func:`spherecal.participant.trust.site_directory_trust` and the simulation's
one certificate step (each site's keys made as a site makes them, certified from its
request, the roster pinned): a threads and a Ray federation over real TLS sockets
complete with every site pinned, each naming the list's fingerprint in its log.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from spherecal.engines.threads import run_threads_simulation
from spherecal.participant.trust import load_peer_keys, pins_fingerprint
from spherecal.simulate import SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig
from tests.fresh_process import in_fresh_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _settings(out: Path) -> SimulationSettings:
    return SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=1),
        out=out,
        calibration=("ffc",),
        tls=True,
        timeout_s=240,
    )


def _every_site_pinned(out: Path, summary: Mapping[str, Any], logs: str) -> None:
    assert summary["status"] == "completed", summary.get("errors")
    assert (out / "certs" / "p0.csr").is_file()  # keys made as a site makes them
    code = pins_fingerprint(load_peer_keys(out / "certs" / "peers.txt"))
    log = "\n".join(path.read_text() for path in sorted((out / "logs").glob(logs)))
    for pid in ("p0", "p1", "p2"):
        pinned = [s for s in log.splitlines() if s.startswith(f"[{pid} ") and "peers pinned" in s]
        assert len(pinned) == 1 and "3 members" in pinned[0] and code in pinned[0], pinned


def test_threads_sites_pin_their_peers_under_tls(tmp_path: Path) -> None:
    summary = run_threads_simulation(_settings(tmp_path))
    _every_site_pinned(tmp_path, summary, "participants.log")


def test_ray_sites_pin_their_peers_under_tls(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from spherecal.engines.ray import RayEngineSettings, run_ray_simulation

    # in a process of its own, not this worker: Ray's process starts (tests/fresh_process.py)
    summary = in_fresh_process(
        run_ray_simulation, _settings(tmp_path), RayEngineSettings(workers=1, worker_cpus=1)
    )
    _every_site_pinned(tmp_path, summary, "worker-*.log")
