"""Virtual sites under mutual TLS pin their peers as a process site does.

The thread and Ray engines' sites once loaded ``[tls] peer_keys`` through their own
copy of the code, without the check that the file pins the site itself, and the Ray
engine did not ship the file to its hosts (its sites ran unpinned, saying nothing).
Both now go through :func:`spherecal.participant.trust.site_directory_trust`: a
threads federation over real TLS sockets completes with every site pinned, each
naming the list's fingerprint in its log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spherecal.engines.threads import run_threads_simulation
from spherecal.participant.trust import load_peer_keys, pins_fingerprint
from spherecal.simulate import SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_threads_sites_pin_their_peers_under_tls(tmp_path: Path) -> None:
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=1),
        out=tmp_path,
        calibration=("ffc",),
        tls=True,
        timeout_s=240,
    )
    summary = run_threads_simulation(settings)
    assert summary["status"] == "completed", summary.get("errors")
    code = pins_fingerprint(load_peer_keys(tmp_path / "certs" / "peers.txt"))
    log = (tmp_path / "logs" / "participants.log").read_text()
    for pid in ("p0", "p1", "p2"):
        pinned = [s for s in log.splitlines() if s.startswith(f"[{pid} ") and "peers pinned" in s]
        assert len(pinned) == 1 and "3 members" in pinned[0] and code in pinned[0], pinned
