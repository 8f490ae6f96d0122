"""A site that refuses the federation's plan says so, exits 2, and tells the coordinator.

Before, such a site closed with ``exiting: refused by the coordinator (exit status 2)``
— it was the site that refused — and told the coordinator nothing: ``spherecal
status`` showed it ``connected … joins 1`` for the heartbeat timeout, and nothing
recorded why it left. Here, real processes on loopback: a coordinator for the digits
MLP (10 classes) whose plan allows example-count noise of sd 2, and three sites —
``site-a`` whose labels reach class 11, ``site-b`` at the default noise sd 4, and
``mallory``, who is not on the roster. Checked: each site's exit status and closing
line (the site's refusals against the coordinator's), what the coordinator's status
view shows while it still waits for the rest of its roster (``spherecal status``,
text and JSON), and, once it stopped, its log and database (``events``,
``policy_events``) — where the label refusal is the plan's class count only, never
the site's labels — and each site's own release ledger (the whole reason).

Until 2026-11-27 the join window went on waiting for a site that refused, the full
``join_s``: with only one site of three left to come, a federation that needs two
failed after 600 s, as if nobody had said anything. Now the coordinator fails it as
soon as the second refusal arrives, naming both sites and why
(:func:`test_the_coordinator_fails_at_once_when_the_rest_cannot_make_the_minimum`).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LABELS = (
    "this site's labels do not fit the plan's model of 10 classes (which labels it holds "
    "stays in the site's own log)"
)


def _spherecal(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "spherecal.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _images(path: Path, classes: int) -> None:
    """60 digits-shaped images (1×8×8) whose labels run over ``classes`` classes."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 1, 8, 8)).astype(np.float32)
    np.savez(path, x=x, y=np.arange(60) % classes)


def _site(directory: Path, pid: str, port: int, classes: int) -> Path:
    _images(directory / f"{pid}.npz", classes)
    config = directory / f"{pid}.toml"
    config.write_text(
        f'[participant]\nid = "{pid}"\ncoordinator = "127.0.0.1:{port}"\ninsecure = true\n'
        f'state_dir = "state-{pid}"\nreconnect_max_s = 0.5\ngive_up_s = 60\n'
        f'[data]\ndataset = "npz"\nroot = "{pid}.npz"\n'
    )
    return config


def _port(path: Path, coordinator: subprocess.Popen[str]) -> int:
    while not path.exists() or not path.read_text().strip():
        assert coordinator.poll() is None, coordinator.communicate()[1][-3000:]
        time.sleep(0.1)
    return int(path.read_text())


def _coordinator(directory: Path, roster: list[str]) -> subprocess.Popen[str]:
    """A coordinator whose join window (600 s) is far longer than any test waits."""
    (directory / "coordinator.toml").write_text(
        f"[federation]\nparticipants = {json.dumps(roster)}\n"
        'state_dir = "state"\nout_dir = "out"\nexample_count_noise_sd = 2\n'
        '[model]\nextractor = "mlp"\n[training]\nrounds = 1\n'
        '[server]\nlisten = "127.0.0.1:0"\ninsecure = true\nport_file = "port"\n'
        "[timeouts]\njoin_s = 600\nheartbeat_timeout_s = 600\nlinger_s = 0\n"
    )
    return _spherecal("coordinator", "--config", "coordinator.toml", cwd=directory)


def test_a_site_that_refuses_the_plan_says_so_and_the_coordinator_records_why(
    tmp_path: Path,
) -> None:
    # two sites of the four may still come: the join window keeps waiting for them
    coordinator = _coordinator(tmp_path, ["site-a", "site-b", "site-c", "site-d"])
    sites: dict[str, subprocess.Popen[str]] = {}
    try:
        port = _port(tmp_path / "port", coordinator)
        for pid, classes in (("site-a", 12), ("site-b", 10), ("mallory", 10)):
            config = _site(tmp_path, pid, port, classes)
            sites[pid] = _spherecal("participant", "--config", config.name, cwd=tmp_path)
        ended = {pid: proc.communicate(timeout=300) for pid, proc in sites.items()}
        codes = {pid: proc.returncode for pid, proc in sites.items()}
        status = subprocess.run(
            [sys.executable, "-m", "spherecal.cli", "status", "--config", "coordinator.toml"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        raw = subprocess.run(
            [sys.executable, "-m", "spherecal.cli", "status", "--config", "coordinator.toml"]
            + ["--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        coordinator.send_signal(signal.SIGTERM)
        _, coordinator_log = coordinator.communicate(timeout=300)
    finally:
        for proc in (coordinator, *sites.values()):
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # -- the sites: status 2 each, and a closing line that says who refused
    assert codes == {"site-a": 2, "site-b": 2, "mallory": 2}, ended
    a_log, b_log, mallory_log = (ended[p][1].strip().splitlines() for p in sites)
    assert a_log[-1].endswith(
        "ERROR site-a: exiting: this site refused the federation's plan: local labels reach "
        "class 11 ([data] num_classes or the highest label), the federation's model has 10 "
        "classes (exit status 2)"
    ), a_log[-3:]
    assert a_log[-2].endswith(
        f"INFO site-a: told the coordinator this site refused its plan (BAD_INPUT): {LABELS}"
    ), a_log[-3:]
    assert "refused by the coordinator" not in "\n".join(a_log)
    assert (
        b_log[-1].endswith("(exit status 2)")
        and (
            "exiting: this site refused the federation's plan: this site weights its updates by "
            "its example count with noise of sd 4 ([policy] example_count_noise_sd), but the "
            "plan's integrity checks allow sd 2"
        )
        in b_log[-1]
    )
    assert (
        "told the coordinator this site refused its plan (POLICY_REFUSAL/RULE_EXAMPLE"
        in (b_log[-2])
    )
    # a site the coordinator turns away still says that the coordinator refused it
    assert mallory_log[-1].endswith(
        "ERROR mallory: exiting: refused by the coordinator (exit status 2)"
    ), mallory_log[-3:]

    # -- the status view while the coordinator still waits: neither site is connected
    assert status.returncode == 0 and raw.returncode == 0, status.stderr + raw.stderr
    roster = {r["participant_id"]: r for r in json.loads(raw.stdout)["roster"]}
    for pid in ("site-a", "site-b"):
        assert roster[pid]["connected"] is False and roster[pid]["joined"] is False
        assert roster[pid]["joins"] == 1
    assert roster["site-a"]["left"] == f"refused the federation's plan: BAD_INPUT: {LABELS}"
    assert roster["site-b"]["left"].startswith(
        "refused the federation's plan: POLICY_REFUSAL/RULE_EXAMPLE_COUNT_NOISE: this site "
        "weights its updates by its example count with noise of sd 4"
    )
    assert roster["site-c"]["left"] == "" and roster["site-c"]["joins"] == 0
    assert json.loads(raw.stdout)["phase"] == "waiting for participants"
    lines = {line.split()[0]: line for line in status.stdout.splitlines() if "joins" in line}
    assert "participants: 0/4 connected" in status.stdout
    assert lines["site-a"].split()[1] == "left"
    assert lines["site-a"].endswith(f"joins 1 · refused the federation's plan: BAD_INPUT: {LABELS}")
    assert lines["site-b"].split()[1] == "left"
    assert f"WARNING: site-a refused the federation's plan and left: BAD_INPUT: {LABELS}" in (
        status.stdout
    )

    # -- the coordinator's log and database: the refusal and its reason, no label of the site
    assert f"site-a refused the federation's plan and left: BAD_INPUT: {LABELS}" in (
        coordinator_log
    )
    with closing(sqlite3.connect(tmp_path / "state" / "state.db")) as db:
        events = [m for (m,) in db.execute("SELECT message FROM events ORDER BY id")]
        refusals = db.execute(
            "SELECT participant, job, purpose, kind, rule FROM policy_events WHERE type = ?",
            ("refusal",),
        ).fetchall()
    assert f"site-a refused the federation's plan and left: BAD_INPUT: {LABELS}" in events
    assert any(
        m.startswith("site-b refused the federation's plan and left: POLICY_REFUSAL/")
        for m in events
    )
    assert refusals == [("site-b", "", "plan", "POLICY_REFUSAL", "RULE_EXAMPLE_COUNT_NOISE")]
    for text in (coordinator_log, *events):
        assert "class 11" not in text and "reach class" not in text

    # -- the site's own ledger keeps the whole reason (its own audit lists it)
    with closing(sqlite3.connect(tmp_path / "state-site-a" / "privacy.db")) as ledger:
        (row,) = ledger.execute("SELECT task, kind, reason, federation FROM site_refusals")
    assert row[:2] == ("plan", "BAD_INPUT") and "local labels reach class 11" in row[2]
    assert row[3] and row[3] in coordinator_log  # the federation whose plan it refused


def test_the_coordinator_fails_at_once_when_the_rest_cannot_make_the_minimum(
    tmp_path: Path,
) -> None:
    """Three sites, two needed (secure aggregation's floor and ``min_participants``):
    once ``site-a`` and ``site-b`` refused, only ``site-c`` can still come, so no wait
    can start the federation. The coordinator ends it at once — not after its 600 s
    join window — and its failure names both sites and why."""
    coordinator = _coordinator(tmp_path, ["site-a", "site-b", "site-c"])
    sites: dict[str, subprocess.Popen[str]] = {}
    try:
        port = _port(tmp_path / "port", coordinator)
        for pid, classes in (("site-a", 12), ("site-b", 10)):
            config = _site(tmp_path, pid, port, classes)
            sites[pid] = _spherecal("participant", "--config", config.name, cwd=tmp_path)
        for proc in sites.values():
            proc.communicate(timeout=300)
        # no SIGTERM: the coordinator ends by itself, well inside its join window
        _, coordinator_log = coordinator.communicate(timeout=300)
    finally:
        for proc in (coordinator, *sites.values()):
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert {pid: proc.returncode for pid, proc in sites.items()} == {"site-a": 2, "site-b": 2}
    assert coordinator.returncode == 1, coordinator_log[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed"
    (reason,) = summary["status_reasons"]
    a = f"site-a refused the federation's plan: BAD_INPUT: {LABELS}"
    b = (
        "site-b refused the federation's plan: POLICY_REFUSAL/RULE_EXAMPLE_COUNT_NOISE: this "
        "site weights its updates by its example count with noise of sd 4"
    )
    assert reason.startswith(f"at most 1 of 3 participants can join (need 2): {a}; {b}"), reason
    assert f"FAILED: {reason}" in coordinator_log
    assert "join window" not in coordinator_log and "joined within" not in reason
    with closing(sqlite3.connect(tmp_path / "state" / "state.db")) as db:
        events = [m for (m,) in db.execute("SELECT message FROM events ORDER BY id")]
    assert f"federation failed: {reason}" in events
