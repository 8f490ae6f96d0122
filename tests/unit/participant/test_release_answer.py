"""What left in a release's place (``site_releases.answer``): the input, or a refusal
that depends on the data and counted as the release (``SecureSteps.withhold``). The
site's audit keeps a refusal out of its differencing pairs — nothing of the input
left — and reads a ledger written before the column existed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from spherecal.participant.release_ledger import INPUT, REFUSAL, Release, ReleaseLedger
from spherecal.site_audit import format_site_audit, read_site_audit

MOMENTS = Release(kind="ffc", federation="fed", model=b"m" * 32, data=b"d" * 32)


def _ledger(tmp_path: Path) -> ReleaseLedger:
    return ReleaseLedger(tmp_path / "privacy.db", participant="p0")


def _answers(tmp_path: Path) -> dict[str, str | None]:
    conn = sqlite3.connect(tmp_path / "privacy.db")
    try:
        return dict(conn.execute("SELECT job, answer FROM site_releases").fetchall())
    finally:
        conn.close()


def test_a_refusal_is_recorded_as_what_left(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.reserve(MOMENTS, job="j1")
    ledger.consume("j1", answer=REFUSAL)
    ledger.consume("j1", answer=REFUSAL)  # idempotent
    assert _answers(tmp_path) == {"j1": REFUSAL}
    # charged after the refusal, the input left after all (a restart, new data)
    ledger.consume("j1")
    assert _answers(tmp_path) == {"j1": INPUT}
    ledger.consume("j1", answer=REFUSAL)  # never back: the input did leave
    assert _answers(tmp_path) == {"j1": INPUT}
    ledger.close()


def test_a_released_rows_epsilon_is_never_rewritten(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.reserve(MOMENTS, job="j1")
    ledger.annotate("j1", epsilon=1.5, delta=1e-6, noise={"plan": "first"})
    ledger.annotate("j1", epsilon=2.0, delta=1e-6, noise={"plan": "second"})  # re-planned
    ledger.consume("j1")
    ledger.annotate("j1", epsilon=0.1, delta=1e-9, noise={"plan": "late"})  # after it left
    conn = sqlite3.connect(tmp_path / "privacy.db")
    try:
        row = conn.execute("SELECT epsilon, delta, noise FROM site_releases").fetchone()
    finally:
        conn.close()
    assert row == (2.0, 1e-6, '{"plan": "second"}')
    ledger.close()


def test_an_unknown_answer_is_refused(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.reserve(MOMENTS, job="j1")
    with pytest.raises(ValueError, match="answer"):
        ledger.consume("j1", answer="bits")
    ledger.close()


def test_the_audit_keeps_a_refusal_out_of_the_differencing_pairs(tmp_path: Path) -> None:
    """Two releases of the same computation (one per model rule relaxed) are a
    differencing pair — unless one of them was a refusal."""
    ledger = ReleaseLedger(tmp_path / "privacy.db", participant="p0", enforce=False)
    ledger.reserve(MOMENTS, job="j1")
    ledger.consume("j1", answer=REFUSAL)
    ledger.reserve(MOMENTS, job="j2")
    ledger.consume("j2")
    ledger.close()
    audit = read_site_audit(tmp_path)
    assert [r.answer for r in audit.releases] == [REFUSAL, INPUT]
    assert audit.pairs == [] and audit.ok
    assert "a refusal in its place" in format_site_audit(audit)
    # mutation: the same two as inputs make the exact pair the audit exists for
    conn = sqlite3.connect(tmp_path / "privacy.db")
    conn.execute("UPDATE site_releases SET answer = 'input'")
    conn.commit()
    conn.close()
    again = read_site_audit(tmp_path)
    assert len(again.pairs) == 1 and again.pairs[0].exact and not again.ok


def test_a_ledger_from_before_the_column_is_read_and_extended(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.reserve(MOMENTS, job="old")
    ledger.consume("old")
    ledger.close()
    conn = sqlite3.connect(tmp_path / "privacy.db")  # as an earlier version wrote it
    conn.execute("ALTER TABLE site_releases DROP COLUMN answer")
    conn.commit()
    conn.close()
    (release,) = read_site_audit(tmp_path).releases  # the audit reads it read-only
    assert release.answer == INPUT
    ledger = _ledger(tmp_path)  # the site opens it: the column is added
    ledger.reserve(
        Release(kind="update", federation="fed", model=b"u" * 32, round=0), job="new"
    )
    ledger.consume("new", answer=REFUSAL)
    ledger.close()
    assert _answers(tmp_path) == {"old": None, "new": REFUSAL}
