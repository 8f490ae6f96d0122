"""The operator's view of a running federation over real gRPC with mutual TLS:
``GetFederationStatus`` for the certificate on ``[admin] allow`` only, ``spherecal
status`` against the running coordinator, the Prometheus endpoint scraped and parsed
with ``prometheus_client.parser``, and refused joins in the coordinator's log."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from spherecal.certs import issue_participant
from spherecal.proto import spherecal_pb2 as pb
from spherecal.proto.services import grpc_services
from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig
from spherecal.status import fetch_status, render_status

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
ROSTER = ("p0", "p1", "p2")
# Enough rounds that the federation is still running (and its metrics endpoint up)
# when the second scrape is taken, after round 2.
ROUNDS = 5


def _free_port() -> int:
    """A free port BELOW the kernel's ephemeral range: the coordinator's gRPC port is
    picked by binding port 0, which could otherwise be handed this very port once we
    release it (then the scrape reaches the gRPC server and is reset)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class Run:
    def __init__(self, sim: Simulation, port: int, metrics_port: int) -> None:
        self.sim, self.port, self.metrics_port = sim, port, metrics_port
        self.certs = sim.out / "certs"
        self.during: list[Any] = []
        self.scrapes: list[dict[str, dict[tuple[tuple[str, str], ...], float]]] = []

    def status(self, name: str = "operator") -> Any:
        return fetch_status(
            f"127.0.0.1:{self.port}",
            insecure=False,
            ca=self.certs / "ca.pem",
            cert=self.certs / f"{name}.pem",
            key=self.certs / f"{name}.key",
        )

    def scrape(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        parsed: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = tuple(sorted(sample.labels.items()))
                parsed.setdefault(sample.name, {})[key] = float(sample.value)
        return parsed


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("operator")
    metrics_port = _free_port()
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=3, model="mlp", rounds=ROUNDS),
        out=out,
        calibration=("ffc",),
        tls=True,
        timeout_s=240,
        extra_coordinator={
            "admin": {"allow": ["operator"]},
            "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        },
    )
    sim = Simulation(settings)
    try:
        port = sim.start_coordinator()
        issue_participant(out / "certs", "operator")
        issue_participant(out / "certs", "mallory")  # valid CA, neither admin nor roster
        r = Run(sim, port, metrics_port)
        r.before = r.status()  # type: ignore[attr-defined]
        r.scrapes.append(r.scrape())
        _refused_join(r)
        try:
            r.status("mallory")
        except ValueError as exc:
            r.mallory = str(exc)  # type: ignore[attr-defined]
        # the real command, while the coordinator waits for its participants
        r.cli = subprocess.run(  # type: ignore[attr-defined]
            [
                sys.executable,
                "-m",
                "spherecal.cli",
                "status",
                "--config",
                str(out / "coordinator.toml"),
                "--cert",
                str(r.certs / "operator.pem"),
                "--key",
                str(r.certs / "operator.key"),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        sim.start_participants()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            st = r.status()
            r.during.append(st)
            if st.completed_rounds >= 2 or st.status != "running":
                break
            time.sleep(0.3)
        # The coordinator exits when the federation ends, and its metrics endpoint with
        # it: scraping after the end was the "connection reset" of the 2026-11-23 clean
        # clone run (a loaded box polled past round 2 straight into the end).
        assert r.during[-1].status == "running", "the federation ended before the scrape"
        r.scrapes.append(r.scrape())
        sim.wait_coordinator(240)
        yield r
    finally:
        sim.close()


def _refused_join(r: Run) -> None:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(r.certs / "ca.pem").read_bytes(),
        private_key=(r.certs / "mallory.key").read_bytes(),
        certificate_chain=(r.certs / "mallory.pem").read_bytes(),
    )
    with grpc.secure_channel(f"127.0.0.1:{r.port}", creds) as channel:
        stub = grpc_services().CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            shape = pb.DataShape(num_classes=10, in_channels=1, image_height=8, image_width=8)
            stub.Join(pb.JoinRequest(participant_id="mallory", data=shape), timeout=10)
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_status_before_anyone_joined(run: Run) -> None:
    st = run.before  # type: ignore[attr-defined]
    assert st.status == "running" and st.phase == "waiting for participants"
    assert [r.participant_id for r in st.roster] == list(ROSTER)
    assert not any(r.joined or r.connected for r in st.roster)
    assert all(r.seconds_since_seen == -1 for r in st.roster)
    assert st.rounds == ROUNDS and st.completed_rounds == 0 and st.current_round == 0


def test_status_while_running_shows_rounds_stages_and_liveness(run: Run) -> None:
    assert any(all(r.connected for r in st.roster) for st in run.during)
    assert any(st.current_round >= 1 for st in run.during)
    # the current job's stage when a poll caught one running, and every job's stage in
    # the jobs list (a round's stages can all pass between two polls 0.3 s apart: on
    # the AVX-512 development machine of 2026-11-26 a secure round took about that)
    current = {st.stage for st in run.during if st.stage}
    listed = {(j.round, j.stage) for st in run.during for j in st.jobs}
    stages = current | {stage for _, stage in listed}
    assert stages, "never saw a secure-aggregation stage"
    assert stages <= {"advertise", "share", "masked", "consistency", "unmask", "done", "aborted"}
    assert {1, 2} <= {r for r, stage in listed if stage == "done"}  # the completed rounds' jobs
    last = run.during[-1]
    assert last.completed_rounds >= 2 or last.status != "running"
    assert [c.round for c in last.completed][:2] == [1, 2]
    assert all(c.contributors == 3 and c.train_loss > 0 for c in last.completed)
    assert any(j.purpose == "update" for j in last.jobs)
    assert not last.privacy_enabled and len(last.epsilon) == 0
    text = render_status(last)
    assert "participants:" in text and "p0" in text and "completed rounds:" in text


def test_status_is_only_for_the_admin_certificate(run: Run) -> None:
    message = run.mallory  # type: ignore[attr-defined]
    assert "PERMISSION_DENIED" in message and "[admin] allow" in message
    # the refused join and the refused status call, both counted
    assert run.scrapes[-1]["spherecal_refusals_total"][(("code", "PERMISSION_DENIED"),)] >= 2


def test_status_refuses_a_participant_certificate(tmp_path: Path) -> None:
    """Checked with the in-process authorization: a roster member is not an admin."""
    from spherecal.coordinator.errors import ServiceError
    from spherecal.coordinator.server.status import authorize_admin
    from spherecal.coordinator.settings import AdminSettings, CoordinatorSettings, ServerSettings
    from spherecal.coordinator.state.registry import Peer

    settings = CoordinatorSettings(participants=ROSTER, admin=AdminSettings(allow=("operator",)))
    assert authorize_admin(settings, Peer(identity="operator")) == "operator"
    for peer in (Peer(identity="p0"), Peer(identity=None, address="ipv4:127.0.0.1:5")):
        with pytest.raises(ServiceError) as info:
            authorize_admin(settings, peer)
        assert info.value.code is grpc.StatusCode.PERMISSION_DENIED
    loopback = CoordinatorSettings(participants=ROSTER, server=ServerSettings(insecure=True))
    assert authorize_admin(loopback, Peer(address="ipv4:127.0.0.1:5")) == "loopback"
    with pytest.raises(ServiceError):
        authorize_admin(loopback, Peer(address="ipv4:10.0.0.7:5"))


def test_spherecal_status_command_prints_the_view(run: Run) -> None:
    proc = run.cli  # type: ignore[attr-defined]
    assert proc.returncode == 0, proc.stderr
    assert "federation " in proc.stdout and "participants: " in proc.stdout
    for pid in ROSTER:
        assert pid in proc.stdout


def test_metrics_endpoint_serves_prometheus_text(run: Run) -> None:
    before, after = run.scrapes
    assert before["spherecal_participants"][(("state", "roster"),)] == 3
    assert before["spherecal_participants"][(("state", "connected"),)] == 0
    assert after["spherecal_participants"][(("state", "joined"),)] == 3
    assert after["spherecal_rounds_configured"][()] == ROUNDS
    assert after["spherecal_rounds_completed"][()] >= 2
    payload = after["spherecal_payload_bytes_total"]
    sent = sum(v for k, v in payload.items() if ("direction", "sent") in k)
    received = sum(v for k, v in payload.items() if ("direction", "received") in k)
    assert sent > 0 and received > 0
    assert after["spherecal_job_duration_seconds_count"][(("purpose", "update"),)] >= 2
    assert after["spherecal_round_duration_seconds_count"][()] >= 2


def test_refused_join_is_logged_with_its_reason(run: Run) -> None:
    log = (run.sim.out / "logs" / "coordinator.log").read_text()
    assert "refused join from 'mallory'" in log
    line = next(line for line in log.splitlines() if "refused join from 'mallory'" in line)
    assert "PERMISSION_DENIED" in line and "not on this federation's roster" in line
