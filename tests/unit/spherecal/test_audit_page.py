"""The audit page cannot be read as "private" when nothing was (issue #23): the verdict
says "as configured" and what was not protected; checks that had nothing to check are
N/A; the page names its run; the protocol's stages are explained, in protocol order;
an empty ε panel has no caption. The database is a real coordinator ``Store``."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from spherecal.audit import run_audit
from spherecal.audit_html import payload_chart, render_html
from spherecal.audit_report import (
    STAGE_ORDER,
    format_report,
    not_applicable,
    unprotected,
    verdict_label,
)
from tests.unit.spherecal.test_audit_report import NO_DP, make_db


def _named_db(tmp_path: Path) -> Path:
    """``make_db``'s run with what a coordinator now records about itself."""
    db = make_db(tmp_path, privacy=NO_DP)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('listen', 'coord.example.org:50051')")
        conn.execute("INSERT INTO meta (key, value) VALUES ('name', 'hospitals')")
        conn.execute("INSERT INTO meta (key, value) VALUES ('status', 'completed')")
        for k, pid in enumerate(("p0", "p1", "p2")):
            conn.execute(
                "INSERT INTO participants (participant_id, roster_index, first_joined, joins) "
                "VALUES (?, ?, ?, ?)",
                (pid, k, None if pid == "p2" else 1_795_600_000.0, 0 if pid == "p2" else 1),
            )
        conn.execute(
            "INSERT INTO events (ts, level, message) VALUES (1795600000.0, 'info', 'start')"
        )
    conn.close()
    return db


def _verdict(page: str) -> tuple[str, str]:
    found = re.search(r'<section class="verdict (\w+)" id="verdict">(.*?)</section>', page)
    assert found is not None
    return found.group(1), found.group(2)


def test_no_dp_is_never_a_bare_pass(tmp_path: Path) -> None:
    report = run_audit(_named_db(tmp_path), out=tmp_path / "audit.json")
    assert report["ok"]
    assert verdict_label(report) == "PASS as configured"
    kind, verdict = _verdict(render_html(report))
    assert kind == "partial"  # amber, not the green of a run that left nothing open
    assert verdict.startswith("<strong>PASS as configured</strong>")
    not_protected = re.findall(r"<li>(.*?)</li>", verdict)
    assert len(not_protected) == 2
    assert not_protected[0].startswith("Model updates carry no differential privacy")
    assert not_protected[1].startswith("Calibration statistics carry no differential privacy")


def test_a_run_that_left_nothing_open_is_a_plain_pass(tmp_path: Path) -> None:
    report = run_audit(_named_db(tmp_path), out=tmp_path / "audit.json")
    report["protection"]["updates_without_dp"] = False  # DP-SGD at every site
    report["protection"]["calibration_statistics"]["dp_releases"] = 2
    assert unprotected(report) == []
    assert verdict_label(report) == "PASS"
    assert _verdict(render_html(report))[0] == "pass"
    report["ok"] = False
    assert verdict_label(report) == "FAIL"


def test_checks_with_nothing_to_check_are_na_not_pass(tmp_path: Path) -> None:
    report = run_audit(_named_db(tmp_path), out=tmp_path / "audit.json")
    skipped = not_applicable(report)
    assert set(skipped) == {"masked_uniformity", "mask_reuse", "dp_releases", "budgets"}
    page = render_html(report)
    rows = dict(re.findall(r'<tr class="check" data-check="(\w+)"[^>]*><td>(.*?)</td>', page))
    for name in skipped:
        assert "N/A" in rows[name] and "PASS" not in rows[name], name
    for name in ("no_plaintext_statistics", "aggregate_inputs", "share_reveals", "integrity"):
        assert "PASS" in rows[name], name
    assert _verdict(page)[1].count("4 did not apply") == 1


def test_a_failed_check_is_never_na(tmp_path: Path) -> None:
    db = make_db(tmp_path, privacy=NO_DP, plaintext_statistics=True)
    report = run_audit(db, out=tmp_path / "audit.json")
    assert not report["checks"]["no_plaintext_statistics"]["ok"]
    assert "no_plaintext_statistics" not in not_applicable(report)
    assert verdict_label(report) == "FAIL"


def test_page_names_its_run(tmp_path: Path) -> None:
    report = run_audit(_named_db(tmp_path), out=tmp_path / "audit.json")
    run = report["run"]
    assert run["federation_id"] == "fed-test" and run["name"] == "hospitals"
    assert run["sites"] == ["p0", "p1", "p2"] and run["joined"] == ["p0", "p1"]
    assert run["coordinator"] == "coord.example.org:50051"
    assert run["started"] == "2026-11-25 09:46 UTC"
    page = render_html(report)
    section = page[page.index('<section id="run">') : page.index('<section id="protection">')]
    for text in (
        "fed-test",
        "hospitals",
        "2026-11-25 09:46 UTC",
        "p0, p1, p2 (2 of 3 joined)",
        "coord.example.org:50051",
        "completed",
    ):
        assert text in section, text
    assert page.index('id="verdict"') < page.index('id="run"') < page.index('id="protection"')
    lines = format_report(report).splitlines()
    assert lines[1].startswith("PASS as configured: ")  # the verdict stays the second line
    assert any(
        line.startswith("federation fed-test (hospitals), 2026-11-25 09:46 UTC") for line in lines
    )


def test_stages_are_explained_in_protocol_order(tmp_path: Path) -> None:
    report = run_audit(_named_db(tmp_path), out=tmp_path / "audit.json")
    page = render_html(report)
    shown = re.findall(r'<tr class="stage" data-stage="(\w+)"><th>\w+</th><td>([^<]+)</td>', page)
    assert [s for s, _ in shown] == ["join", "advertise", "masked", "unmask"]
    assert all(len(text) > 20 for _, text in shown)  # each explained in words
    # the chart groups follow the protocol too: consistency before unmask
    rows = [
        {"sender": "p0", "stage": stage, "bytes": 100, "status": "accepted"}
        for stage in ("unmask", "consistency", "masked", "join", "share", "advertise")
    ]
    labels = re.findall(r'text-anchor="middle">(\w+)</text>', payload_chart(rows))
    assert labels == [s for s in STAGE_ORDER if s in {r["stage"] for r in rows}]
    assert labels.index("consistency") < labels.index("unmask")


def test_an_empty_epsilon_panel_has_no_caption(tmp_path: Path) -> None:
    page = render_html(run_audit(_named_db(tmp_path), out=tmp_path / "audit.json"))
    assert 'id="epsilon-chart-empty"' in page
    assert "Privacy loss ε spent over time" not in page
