"""``[tls] peer_keys`` in a real federation over mutual TLS (a coordinator process and
four participant processes on real sockets, ``spherecal simulate --tls``, which pins
its roster at every site).

One site's file pins another key for ``p1`` than the one ``p1``'s CA-issued
certificate binds — what that site would see if the CA's holder had re-issued
``p1`` under a key of its own. That site takes part in no secure job (its release
ledger holds no release; its log names the mismatch), every job's coverage in the
summary names its withdrawal and why, and the other three complete the federation
without it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from spherecal.crypto import generate_identity, identity_public_bytes
from spherecal.participant.trust import pin_line
from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]


class OnePinDiffers(Simulation):
    """``p0`` reads ``certs/peers-p0.txt``; everyone else the roster's own pins."""

    def participant_config(self, k: int, port: int) -> Path:
        path = super().participant_config(k, port)
        if self.settings.participant_ids[k] == "p0":
            shared = str(self.out / "certs" / "peers.txt")
            text = path.read_text()
            assert shared in text  # simulate --tls pins the roster at every site
            path.write_text(text.replace(shared, str(self.out / "certs" / "peers-p0.txt")))
        return path


def test_a_site_whose_pin_for_a_peer_differs_takes_part_in_no_job(tmp_path: Path) -> None:
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=4, model="mlp", rounds=1),
        out=tmp_path / "run",
        calibration=("ffc",),
        tls=True,
        timeout_s=240,
    )
    sim = OnePinDiffers(settings)
    try:
        certs = sim.out / "certs"
        other = pin_line("p1", identity_public_bytes(generate_identity()))
        lines = [
            other if line.startswith("p1 ") else line
            for line in (certs / "peers.txt").read_text().splitlines()
        ]
        (certs / "peers-p0.txt").write_text("\n".join(lines) + "\n")
        sim.start_coordinator()
        sim.start_participants()
        assert sim.wait_coordinator(240) == 0
        sim.wait_participants(60)
    finally:
        sim.close()
    log = (sim.out / "logs" / "p0.log").read_text()
    assert "the identity key of 'p1' is not the one pinned for it" in log, log[-2000:]
    ledger = sim.out / "state" / "p0" / "privacy.db"
    if ledger.exists():
        with sqlite3.connect(ledger) as conn:
            released = conn.execute(
                "SELECT COUNT(*) FROM site_releases WHERE state = 'released'"
            ).fetchone()[0]
        assert released == 0
    summary = sim.summary()
    assert summary["status"] in ("completed", "degraded"), summary
    assert "coverage" in summary  # a federation that reached its end
    jobs = summary["coverage"]["jobs"]
    assert jobs and all("UNTRUSTED_DIRECTORY" in job["missing"]["p0"] for job in jobs), jobs
    for peer in ("p1", "p2", "p3"):  # the sites pinned alike took part
        with sqlite3.connect(sim.out / "state" / peer / "privacy.db") as conn:
            assert (
                conn.execute(
                    "SELECT COUNT(*) FROM site_releases WHERE state = 'released'"
                ).fetchone()[0]
                > 0
            )
