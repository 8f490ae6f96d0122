"""A site's first day, as docs/deployment.md tells it (issue #23): the built wheel in a
throwaway venv, a CA from ``spherecal certs``, each site's keys made by the site and
certified from its request (``certs request``, ``certs issue --csr``), one coordinator
and three sites over mutual TLS, pinning each other's identity keys (``spherecal certs
pin``), from configs written as the page shows, in a directory
that is not the repository — and then the coordinator restarted on the finished
state: the summary, the database, the checkpoints and every site's models are
byte-for-byte what they were, and the restart says the federation already ended.

The venv reaches the heavy dependencies of the interpreter running the test through
one ``.pth`` line (as ``test_wheel_install`` does), so ``spherecal`` itself comes from
the wheel; no network is needed.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_wheel_install import (  # the wheel, built once per module
    _clean_env,
    _install_wheel,
    _run,
    _venv,
    wheel,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.long]

SITES = ("hospital-a", "hospital-b", "hospital-c")
__all__ = ["wheel"]  # the imported fixture, used by name below


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _configs(site: Path, port: int) -> None:
    """coordinator.toml and one participant TOML per site, shaped as deployment.md's."""
    roster = ", ".join(f'"{s}"' for s in SITES)
    (site / "coordinator.toml").write_text(
        f"""[federation]
name = "hospitals"
participants = [{roster}]
seed = 0
state_dir = "state"
out_dir = "out"

[model]
dataset = "digits"
extractor = "mlp"
head = "sphere"

[training]
rounds = 2

[calibration]
methods = ["ffc"]

[secure_aggregation]
updates = true
statistics = true

[server]
listen = "127.0.0.1:{port}"

[tls]
cert = "certs/server.pem"
key = "certs/server.key"
client_ca = "certs/ca.pem"

[timeouts]
join_s = 240
"""
    )
    for k, pid in enumerate(SITES):
        (site / f"{pid}.toml").write_text(
            f"""[participant]
id = "{pid}"
coordinator = "127.0.0.1:{port}"
state_dir = "state-{pid}"
identity_key = "keys-{pid}/{pid}.identity.key"

[tls]
ca = "certs/ca.pem"
cert = "certs/{pid}.pem"
key = "keys-{pid}/{pid}.key"
peer_keys = "certs/peers.txt"

[data]
dataset = "digits"
slice_index = {k}
slice_of = {len(SITES)}
"""
        )


def _snapshot(site: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    folders = ["state", "out", *(f"participant-{pid}-out" for pid in SITES)]
    for folder in folders:
        for path in sorted((site / folder).rglob("*")):
            if path.is_file():
                files[str(path.relative_to(site))] = path.read_bytes()
    return files


def test_wheel_deployment_then_restart_on_the_finished_state(
    wheel: Path,  # the fixture imported above
    tmp_path: Path,
) -> None:
    venv = _venv(tmp_path / "venv")
    _install_wheel(venv, wheel)
    spherecal = str(venv / "bin" / "spherecal")
    site = tmp_path / "site"
    site.mkdir()
    env = _clean_env()
    _run([spherecal, "certs", "init", "certs"], cwd=site, env=env)
    lines = []
    for pid in SITES:  # each site makes its keys; only its request goes to the CA
        _run([spherecal, "certs", "request", pid, "--dir", f"keys-{pid}"], cwd=site, env=env)
        csr = f"keys-{pid}/{pid}.csr"
        _run([spherecal, "certs", "issue", pid, "--dir", "certs", "--csr", csr], cwd=site, env=env)
        key = f"keys-{pid}/{pid}.identity.key"  # each site prints its line; they exchange them
        pin = [spherecal, "certs", "pin", pid, "--identity-key", key]
        lines.append(_run(pin, cwd=site, env=env))
    assert not list((site / "certs").glob("hospital-*.key"))  # the CA holds no site's key
    (site / "certs" / "peers.txt").write_text("".join(lines))
    listed = _run([spherecal, "certs", "pins", "certs/peers.txt"], cwd=site, env=env)
    fingerprint = listed.splitlines()[-1].rsplit(" ", 1)[-1]  # what the sites read aloud
    _configs(site, _free_port())

    def start(*args: str, log: str) -> subprocess.Popen[bytes]:
        out = (site / log).open("wb")
        return subprocess.Popen([spherecal, *args], cwd=site, env=env, stdout=out, stderr=out)

    coordinator = start("coordinator", "--config", "coordinator.toml", log="coordinator.log")
    sites = [start("participant", "--config", f"{p}.toml", log=f"{p}.log") for p in SITES]
    try:
        assert coordinator.wait(timeout=420) == 0, (site / "coordinator.log").read_text()[-3000:]
        codes = {p: proc.wait(timeout=120) for p, proc in zip(SITES, sites, strict=True)}
    finally:
        for proc in (coordinator, *sites):
            if proc.poll() is None:
                proc.kill()
    assert set(codes.values()) == {0}, codes
    for pid in SITES:  # each site says at start which list it pinned
        assert (
            f"peers pinned: 3 members from certs/peers.txt (fingerprint {fingerprint}"
            in (site / f"{pid}.log").read_text()
        )
    summary = json.loads((site / "out" / "summary.json").read_text())
    assert summary["status"] == "completed", summary["status_reasons"]
    # each site weighted its updates by its count drawn once, with noise (sd 4): both
    # rounds over the same sites carry the same weight sum
    for pid in SITES:
        assert (
            "training weight: this site's example count with noise of sd 4"
            in (site / f"{pid}.log").read_text()
        )
    first, second = summary["per_round"]
    assert first["contributors"] == second["contributors"] and first["weight"] == second["weight"]
    for pid in SITES:
        saved = json.loads((site / f"participant-{pid}-out" / "models.json").read_text())
        assert saved["federation_id"] == summary["federation_id"]

    before = _snapshot(site)
    restarted = subprocess.run(
        [spherecal, "coordinator", "--config", "coordinator.toml"],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "already ended completed" in restarted.stderr
    assert json.loads(restarted.stdout)["accuracy"] == summary["accuracy"]
    after = _snapshot(site)
    assert after.keys() == before.keys()
    assert [name for name in before if before[name] != after[name]] == []
