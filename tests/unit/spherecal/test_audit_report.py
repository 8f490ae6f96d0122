"""The audit for a non-specialist: the plain-language verdict and protection summary,
the HTML page (self-contained, charts drawn to scale), and ``--empirical`` on a run
without DP. The database is a real coordinator ``Store`` with rows as the service
writes them; the browser rendering is tested in tests/integration/test_privacy_service.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spherecal.audit import run_audit
from spherecal.audit_html import epsilon_chart, payload_chart, render_html, site_colours
from spherecal.audit_report import format_report, human_bytes
from spherecal.cli.app import main as cli_main
from spherecal.coordinator.state.store import Store
from tests.store_writer import start_writer


def make_db(tmp_path: Path, *, privacy: dict[str, Any], plaintext_statistics: bool = False) -> Path:
    """A coordinator database of a small run: 2 sites, one secure update job, one FFC
    job, payload rows per stage (sizes as given)."""
    path = tmp_path / "state" / "state.db"
    path.parent.mkdir(parents=True)
    store = Store(path)
    store.set_meta("federation_id", "fed-test")
    store.set_meta("privacy", json.dumps(privacy))
    sizes = {"join": 150, "advertise": 200, "masked": 40_000, "unmask": 170}
    for sender in ("p0", "p1"):
        for stage, nbytes in sizes.items():
            store.audit(
                sender=sender, job="j1", stage=stage, kind="x", nbytes=nbytes, sha256="0" * 64
            )
        if plaintext_statistics:
            store.audit(
                sender=sender,
                job="j2",
                stage="statistics",
                kind="TensorUpload",
                nbytes=8000,
                sha256="1" * 64,
            )
    store.close()
    conn = sqlite3.connect(path)
    with conn:
        for job, purpose in (("j1", "update"), ("j2", "ffc")):
            conn.execute(
                "INSERT INTO jobs (job_id, purpose, round, status, created, participants, "
                "threshold, vector_length, spec_sha256, contributors) "
                "VALUES (?, ?, 1, 'done', 0, ?, 2, 1000, '', ?)",
                (job, purpose, '["p0", "p1"]', '["p0", "p1"]'),
            )
    conn.close()
    return path


NO_DP = {"enabled": False, "delta": 1e-5, "mechanism": "skellam", "epsilon": None}


def test_text_report_says_model_updates_carry_no_dp(tmp_path: Path) -> None:
    report = run_audit(make_db(tmp_path, privacy=NO_DP), out=tmp_path / "audit.json")
    assert report["ok"]
    protection = report["protection"]
    assert protection["updates_without_dp"]
    assert protection["model_updates"]["dp"] == "no DP"
    assert protection["model_updates"]["transport"].startswith("secure aggregation")
    assert protection["calibration_statistics"]["dp"] == "no DP"
    text = format_report(report)
    assert "model updates carry NO differential privacy" in text
    # issue #23: no bare PASS beside "no DP"; checks with nothing to check are N/A
    assert text.splitlines()[1].startswith(
        "PASS as configured: All 5 applicable checks passed (4 did not apply)"
    )
    assert "  NOT PROTECTED: Model updates carry no differential privacy" in text
    assert "  [N/A ] dp_releases: differential privacy was not switched on" in text
    assert "verdict: PASS as configured" in text


def test_a_plaintext_statistics_upload_fails_and_is_named_in_plain_words(tmp_path: Path) -> None:
    db = make_db(tmp_path, privacy=NO_DP, plaintext_statistics=True)
    report = run_audit(db, out=tmp_path / "audit.json")
    assert not report["ok"]
    assert report["protection"]["calibration_statistics"]["transport"].startswith(
        "sent in the clear"
    )
    page = render_html(report)
    verdict = re.search(r'<section class="verdict fail" id="verdict">(.*?)</section>', page)
    assert verdict is not None
    assert "FAIL" in verdict.group(1) and "Statistics never sent in the clear" in verdict.group(1)


def test_empirical_without_dp_has_nothing_to_audit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_db(tmp_path, privacy=NO_DP)
    code = cli_main(["audit", str(db), "--empirical", "--out", str(tmp_path / "a.json")])
    out = capsys.readouterr().out
    assert code == 0
    assert "nothing to audit" in out and "claimed" not in out
    saved = json.loads((tmp_path / "a.json").read_text())
    assert saved["empirical"]["skipped"] is True
    assert "epsilon_claimed" not in saved


def test_html_is_self_contained_and_says_what_was_not_protected(tmp_path: Path) -> None:
    target = tmp_path / "report" / "audit.html"
    report = run_audit(make_db(tmp_path, privacy=NO_DP), out=tmp_path / "a.json", html=target)
    page = target.read_text(encoding="utf-8")
    assert report["html"] == str(target)
    for forbidden in ("<script", "http:", "https:", "@import", "url(", "<link", "<img"):
        assert forbidden not in page.lower()
    assert 'id="updates-no-dp"' in page
    assert "neither are the calibration statistics" in page  # DP off altogether
    assert "Did not apply: no privacy budget was set and no ε was spent." in page
    assert "Differential privacy was <strong>not enabled</strong>" in page
    assert 'id="epsilon-chart-empty"' in page  # no ε spent: no chart to invent
    assert page.count('class="bar"') == 8  # 2 sites × 4 stages


def test_unwritable_html_path_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_db(tmp_path, privacy=NO_DP)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = cli_main(
        ["audit", str(db), "--out", str(tmp_path / "a.json"), "--html", str(blocker / "r.html")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("spherecal audit: error:") and err.count("\n") == 1


def _bars(svg: str) -> dict[str, float]:
    out = {}
    for m in re.finditer(
        r'<rect class="bar"[^>]*height="([\d.]+)"[^>]*><title>([^<]*)</title>', svg
    ):
        out[m.group(2).split(":")[0]] = float(m.group(1))
    return out


def test_payload_bars_are_drawn_to_a_log_scale() -> None:
    rows = [
        {"sender": "p0", "stage": "join", "bytes": 100, "status": "accepted"},
        {"sender": "p1", "stage": "join", "bytes": 1000, "status": "accepted"},
        {"sender": "p0", "stage": "masked", "bytes": 60_000, "status": "accepted"},
        {"sender": "p0", "stage": "masked", "bytes": 40_000, "status": "accepted"},  # summed
        {"sender": "p1", "stage": "masked", "bytes": 99, "status": "refused"},  # not drawn
    ]
    height, top, bottom = 300, 10, 58
    plot_h = height - top - bottom
    bars = _bars(payload_chart(rows, height=height))
    assert set(bars) == {"p0, join", "p1, join", "p0, masked"}
    # axis from 100 B (10^2) to 100 KB (10^5): three decades
    for key, value in (("p1, join", 1000), ("p0, masked", 100_000)):
        expected = (math.log10(value) - 2) / 3 * plot_h
        assert bars[key] == pytest.approx(expected, abs=0.11)
    assert bars["p0, join"] == pytest.approx(2.0, abs=0.11)  # the minimum still shows


def test_epsilon_chart_steps_to_each_total_and_marks_budgets() -> None:
    timelines = {
        "federation": [{"ts": 100.0, "epsilon_total": 1.5, "kind": "ffc"}],
        "p0": [
            {"ts": 90.0, "epsilon_total": 2.0, "kind": "ffc"},
            {"ts": 130.0, "epsilon_total": 4.0, "kind": "ccvr"},
        ],
    }
    svg = epsilon_chart(timelines, {"federation": None, "p0": 6.0})
    assert svg.count('class="series"') == 2
    assert svg.count('class="budget"') == 1 and "budget 6 (p0)" in svg
    # the y axis ends at a round number above the budget; the last point of p0 sits at 4
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([\d.]+)</text>', svg)]
    assert ticks[0] == 0 and ticks[-1] >= 6.0
    circles = re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', svg)
    top, plot_h = 10, 300 - 10 - 58
    cy = [float(c) for c in circles]
    expected = [top + plot_h - e / ticks[-1] * plot_h for e in (1.5, 2.0, 4.0)]
    assert cy == pytest.approx(expected, abs=0.11)


def test_colours_agree_between_the_charts() -> None:
    colours = site_colours(["p1", "p0", "federation", "p0"])
    assert colours["p0"] != colours["p1"] and colours["federation"] not in (
        colours["p0"],
        colours["p1"],
    )
    assert human_bytes(1536) == "1.5 KB" and human_bytes(12) == "12 B"


def test_html_renders_a_dp_report_with_one_epsilon_per_subject(tmp_path: Path) -> None:
    privacy = {"enabled": True, "delta": 1e-5, "mechanism": "skellam", "epsilon": 2.0}
    report = run_audit(make_db(tmp_path, privacy=privacy), out=tmp_path / "a.json")
    report["checks"]["budgets"]["subjects"] = {
        "federation": {
            "epsilon": 1.6,
            "budget_epsilon": None,
            "within_budget": True,
            "timeline": [{"ts": 5.0, "epsilon_total": 1.6, "kind": "ffc"}],
        },
        "p0": {
            "epsilon": 2.0,
            "budget_epsilon": 6.0,
            "within_budget": True,
            "timeline": [{"ts": 4.0, "epsilon_total": 2.0, "kind": "ffc"}],
        },
    }
    page = render_html(report)
    rows = re.findall(r"<tr><th>(federation|p0)</th><td><strong>([\d.]+)</strong>", page)
    assert rows == [("federation", "1.6"), ("p0", "2")]
    assert "e^ε ≈ 4.95" in page  # exp(1.6)
    assert 'id="epsilon-chart"' in page


def test_auditing_a_deployments_database_writes_nothing_into_its_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``spherecal audit STATE_DB`` wrote ``state/audit.json`` into the directory a
    coordinator resumes from. It now writes ``./audit.json``; run from the state
    directory it refuses (one line, before any work); ``--out`` still goes anywhere."""
    db = make_db(tmp_path, privacy=NO_DP)
    state = db.parent

    def files() -> dict[str, str]:  # SQLite's -wal/-shm included: the audit makes none
        return _listing(state)

    before = files()
    elsewhere = tmp_path / "officer"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for target in (db, state):  # the database, or the directory that holds it
        assert cli_main(["audit", str(target)]) == 0
        out = capsys.readouterr().out
        assert "(written audit.json)" in out, out
        assert json.loads((elsewhere / "audit.json").read_text())["database"] == str(db)
        (elsewhere / "audit.json").unlink()
        assert files() == before
    monkeypatch.chdir(state)
    assert cli_main(["audit", "state.db"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--out FILE" in err and "state directory" in err, err
    assert files() == before
    assert cli_main(["audit", "state.db", "--out", str(tmp_path / "chosen.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["federation_id"] == "fed-test"
    assert (tmp_path / "chosen.json").is_file()
    assert files() == before


# ------------------------------------------- an audit creates nothing beside the database
def _listing(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by relative name, with its content's SHA-256."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def _audit(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``spherecal audit DB --out FILE``, the command a privacy officer runs."""
    out = tmp_path / "officer" / "audit.json"
    assert cli_main(["audit", str(db), "--out", str(out)]) in (0, 1)
    capsys.readouterr()
    return dict[str, Any](json.loads(out.read_text()))


#: Run in a child process on a coordinator database: the real ``Store`` (as the
#: coordinator opens it) records one more federation id and a plaintext statistics
#: upload, committed, then the process dies (``kill``) or waits, alive and holding the
#: state directory's lock (``live``), until its standard input closes.
WRITER = r"""
import os, sys
from pathlib import Path
from spherecal.coordinator.state.store import Store
from spherecal.spherefed.state_lock import StateDirLock
db, how = Path(sys.argv[1]), sys.argv[2]
lock = StateDirLock(db.parent, role="coordinator").acquire()
store = Store(db)
store.set_meta("federation_id", "fed-" + how)
store.audit(sender="p0", job="j2", stage="statistics", kind="TensorUpload", nbytes=8000,
            sha256="1" * 64)
assert store.get_meta("federation_id") == "fed-" + how  # after the audit row: committed
if how == "kill":
    os._exit(0)  # no close, no checkpoint: those rows are in state.db-wal alone
print("ready", flush=True)
sys.stdin.read()
store.close()
"""


def _writer(db: Path, how: str) -> subprocess.Popen[str]:
    return start_writer(WRITER, str(db), how)


def test_an_audit_of_a_checkpointed_database_creates_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A coordinator stopped cleanly leaves ``state.db`` alone (its WAL checkpointed
    and removed). SQLite opening it ``mode=ro`` created ``state.db-wal`` and
    ``state.db-shm`` beside it and left them there."""
    db = make_db(tmp_path, privacy=NO_DP)
    before = _listing(db.parent)
    assert "state.db-wal" not in before  # checkpointed, as a clean stop leaves it
    report = _audit(db, tmp_path, capsys)
    assert _listing(db.parent) == before
    assert report["federation_id"] == "fed-test" and report["payloads"]["count"] == 8


def test_an_audit_reads_the_wal_a_killed_coordinator_left_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A coordinator that died left committed rows in ``state.db-wal`` alone: the audit
    must read them (``immutable=1`` would not), without SQLite's recovery rewriting
    ``state.db-shm`` beside them."""
    db = make_db(tmp_path, privacy=NO_DP)
    assert _writer(db, "kill").wait(timeout=120) == 0
    before = _listing(db.parent)
    assert {"state.db-wal", "state.db-shm"} <= set(before), before
    alone = sqlite3.connect(f"{db.as_uri()}?mode=ro&immutable=1", uri=True)
    assert alone.execute("SELECT value FROM meta WHERE key='federation_id'").fetchone() == (
        "fed-test",
    )  # the database file alone does not hold the rows
    alone.close()
    assert _listing(db.parent) == before
    report = _audit(db, tmp_path, capsys)
    assert _listing(db.parent) == before
    assert report["federation_id"] == "fed-kill" and report["payloads"]["count"] == 9
    assert not report["checks"]["no_plaintext_statistics"]["ok"]  # the WAL's upload


def test_an_audit_beside_a_live_coordinator_creates_nothing_and_reads_its_wal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a coordinator running (it holds the state directory's lock), the audit
    reads through SQLite's locks and the coordinator's own ``-shm`` index — the one
    file both sides' locks change — and creates nothing; the database and its WAL are
    only read, and the rows committed to the WAL are in the report."""
    db = make_db(tmp_path, privacy=NO_DP)
    writer = _writer(db, "live")
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        before = _listing(db.parent)
        report = _audit(db, tmp_path, capsys)
        after = _listing(db.parent)
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        assert writer.wait(timeout=120) == 0
    assert set(after) == set(before)
    assert {k: v for k, v in after.items() if k != "state.db-shm"} == {
        k: v for k, v in before.items() if k != "state.db-shm"
    }
    assert report["federation_id"] == "fed-live" and report["payloads"]["count"] == 9
