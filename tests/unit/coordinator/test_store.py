"""SQLite store: one writer thread, durable calls, audit rows without payloads."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from spherecal.coordinator.state.store import Store


def test_meta_rounds_and_jobs_survive_reopening(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    store = Store(db)
    store.set_meta("fingerprint", "abc")
    store.round_started(0, 1)
    store.round_finished(0, "completed", {"round": 1, "train_loss": 0.5}, ("ck.pt", "ff"))
    store.round_started(1, 1)  # running when the coordinator dies
    store.job_created("00ff", "ffc", None, ["p0", "p1"], 2, 10, "sha")
    store.job_finished("00ff", "failed", error="TooFewSurvivors: ...")
    store.close()
    again = Store(db)
    assert again.get_meta("fingerprint") == "abc"
    records = again.completed_rounds()
    assert [(r.round, r.checkpoint_path, r.metrics["train_loss"]) for r in records] == [
        (0, str(tmp_path / "ck.pt"), 0.5)
    ]
    assert again.query("SELECT status, error FROM jobs") == [("failed", "TooFewSurvivors: ...")]
    again.close()


def test_audit_from_many_threads_records_hashes_not_payloads(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")

    def worker(k: int) -> None:
        for i in range(50):
            store.audit(
                sender=f"p{k}",
                job="j",
                stage="masked",
                kind=f"MaskedChunk[{i}]",
                nbytes=2048,
                sha256="0" * 64,
            )

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.event("info", "barrier")  # queued after every audit row
    assert store.query("SELECT count(*) FROM events") == [(1,)]
    assert store.query("SELECT count(*), sum(bytes) FROM audit") == [(400, 400 * 2048)]
    columns = [row[1] for row in store.query("PRAGMA table_info(audit)")]
    assert "payload" not in columns and "sha256" in columns
    store.close()
    # WAL mode: an operator can read while the coordinator writes.
    mode = sqlite3.connect(tmp_path / "state.db").execute("PRAGMA journal_mode").fetchone()
    assert mode[0].lower() == "wal"


def test_failing_call_reports_its_error_and_keeps_the_writer_alive(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    try:
        store.call(lambda c: c.execute("SELECT * FROM no_such_table"))
    except sqlite3.OperationalError:
        pass
    else:  # pragma: no cover
        raise AssertionError("expected an error")
    store.set_meta("k", "v")
    assert store.get_meta("k") == "v"
    store.close()
