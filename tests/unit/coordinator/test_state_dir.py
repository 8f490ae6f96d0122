"""State that cannot be silently lost (issue #10 item 3), on real SQLite files.

WAL checkpoints at every completed round, ``quick_check`` at start-up, one-line
refusals for damaged / truncated / non-SQLite databases, the federation marker that
catches a database restored without its WAL, relative checkpoint paths (a copied
state directory reads its own files), and ``spherecal coordinator --check-state`` —
which creates and changes no file in the directory it checks.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from spherecal.cli.app import main
from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.driver.model import Checkpoints, GlobalModel
from spherecal.coordinator.settings import ModelSettings, TrainingSettings
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.state_dir import (
    MARKER_NAME,
    StateConflict,
    StateDamaged,
    format_report,
    guard_federation_start,
    inspect_state,
    read_marker,
    write_marker,
)
from spherecal.coordinator.state.store import Store
from tests.store_writer import start_writer

from .helpers import plaintext_federation

MODEL = ModelSettings(extractor="mlp")
TRAINING = TrainingSettings(rounds=3, min_participants=2)


def _federation(state_root: Path) -> tuple[Federation, Store]:
    cs, _ = plaintext_federation(state_root, MODEL, TRAINING)
    store = Store(cs.state_dir / "state.db")
    registry = Registry(
        cs.participants,
        store,
        require_certificates=False,
        heartbeat_timeout_s=10,
        clock_skew_s=60,
    )
    model = GlobalModel(cs.model.spec(cs.seed))
    return Federation(cs, store, registry, say=lambda m: None, model=model), store


def _two_rounds(root: Path, *, close: bool = False) -> tuple[Path, list[np.ndarray]]:
    """A state directory as a federation leaves it after two completed rounds, written
    through the same Store / Checkpoints calls the driver makes (the store stays
    open — as when the coordinator is killed — unless ``close``: as a clean stop)."""
    federation, store = _federation(root)
    federation.prepare()
    write_marker(federation.settings.state_dir, federation.federation_id)
    rng = np.random.default_rng(0)
    vectors = []
    for r in range(2):
        vector = rng.standard_normal(federation.model.length)
        store.round_started(r, 1)
        path = federation.checkpoints.save(r, vector)
        store.round_finished(r, "completed", {"round": r + 1, "train_loss": 1.0 / (r + 1)}, path)
        vectors.append(vector)
    if close:
        store.close()
    return federation.settings.state_dir, vectors


def _copy_without_wal(src: Path, dst: Path) -> None:
    shutil.copytree(
        src, dst, ignore=shutil.ignore_patterns("state.db-wal", "state.db-shm", "*.tmp")
    )


# ---------------------------------------------------------------------- WAL
def test_completed_round_is_in_the_main_file_and_a_wal_less_copy_resumes(
    tmp_path: Path,
) -> None:
    state, vectors = _two_rounds(tmp_path / "a")
    copy_root = tmp_path / "b"
    _copy_without_wal(state, copy_root / "state")  # while the original is still open
    federation, store = _federation(copy_root)
    try:
        federation.prepare()
        assert federation.completed_rounds == 2
        np.testing.assert_array_equal(federation.global_vector, vectors[1])
    finally:
        store.close()


def test_store_close_truncates_the_wal(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.set_meta("k", "v")
    store.audit(sender="p0", job=None, stage="join", kind="x", nbytes=1, sha256="00")
    store.close()
    wal = tmp_path / "state.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    conn = sqlite3.connect(tmp_path / "state.db")
    assert conn.execute("SELECT value FROM meta WHERE key='k'").fetchone() == ("v",)
    assert conn.execute("SELECT COUNT(*) FROM audit").fetchone() == (1,)
    conn.close()


def test_checkpoint_wal_reports_pages_copied(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    try:
        store.set_meta("k", "v" * 10_000)
        busy, log_pages, copied = store.checkpoint_wal()
        assert busy == 0 and log_pages == copied
        assert (tmp_path / "state.db-wal").stat().st_size == 0
    finally:
        store.close()


# ---------------------------------------------------------------------- relative paths
def test_copied_state_dir_reads_its_own_checkpoints(tmp_path: Path) -> None:
    state, vectors = _two_rounds(tmp_path / "a")
    conn = sqlite3.connect(state / "state.db")
    stored = [p for (p,) in conn.execute("SELECT checkpoint_path FROM rounds ORDER BY round")]
    conn.close()
    assert stored == ["checkpoints/round-00001.pt", "checkpoints/round-00002.pt"]
    shutil.copytree(state, tmp_path / "b" / "state")
    shutil.rmtree(state)  # the original is gone: the copy can only read its own files
    federation, store = _federation(tmp_path / "b")
    try:
        federation.prepare()
        np.testing.assert_array_equal(federation.global_vector, vectors[1])
    finally:
        store.close()


def test_absolute_checkpoint_paths_of_older_versions_are_migrated(tmp_path: Path) -> None:
    state, vectors = _two_rounds(tmp_path / "a")
    conn = sqlite3.connect(state / "state.db")
    conn.execute(
        "UPDATE rounds SET checkpoint_path = '/elsewhere/old-host/state/checkpoints/' || "
        "substr(checkpoint_path, 13)"
    )
    conn.commit()
    conn.close()
    federation, store = _federation(tmp_path / "a")
    try:
        federation.prepare()
        np.testing.assert_array_equal(federation.global_vector, vectors[1])
        rows = store.query("SELECT checkpoint_path FROM rounds ORDER BY round")
        assert rows == [("checkpoints/round-00001.pt",), ("checkpoints/round-00002.pt",)]
    finally:
        store.close()


def test_a_checkpoint_that_is_not_the_recorded_one_refuses_to_resume(tmp_path: Path) -> None:
    state, _ = _two_rounds(tmp_path / "a")
    Checkpoints(state / "checkpoints").save(1, np.zeros(3))  # overwrite round 2's file
    federation, store = _federation(tmp_path / "a")
    try:
        with pytest.raises(Exception, match="SHA-256|has \\(3,\\)"):
            federation.prepare()
    finally:
        store.close()


# ---------------------------------------------------------------------- damaged files
def test_garbage_file_is_refused_with_one_line(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"this is not a database, just text\n" * 200)
    with pytest.raises(StateDamaged, match="not a usable SQLite database"):
        Store(db)
    assert db.read_bytes().startswith(b"this is not")  # nothing was overwritten


def test_truncated_database_is_refused(tmp_path: Path) -> None:
    state, _ = _two_rounds(tmp_path / "a")
    db = state / "state.db"
    data = db.read_bytes()
    truncated = tmp_path / "t" / "state.db"
    truncated.parent.mkdir()
    truncated.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(StateDamaged):
        Store(truncated)


def test_corrupted_pages_are_detected_at_start_up(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    store = Store(db)
    for k in range(300):
        store.audit(sender=f"p{k}", job="j", stage="s", kind="k", nbytes=k, sha256="ab" * 32)
    store.close()
    page = sqlite3.connect(db).execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(db.read_bytes())
    assert len(data) >= 6 * page
    rng = np.random.default_rng(1)
    for p in (3, 4, 5):  # scribble over three b-tree pages, as a bad disk would
        data[p * page + 0 : p * page + page] = rng.integers(0, 256, page, dtype=np.uint8).tobytes()
    db.write_bytes(bytes(data))
    with pytest.raises(StateDamaged, match="damaged|not a usable"):
        Store(db)
    with pytest.raises(StateDamaged):
        inspect_state(tmp_path)


# ---------------------------------------------------------------------- marker / guard
def test_database_restored_without_its_contents_refuses_a_new_federation(
    tmp_path: Path,
) -> None:
    state, _ = _two_rounds(tmp_path / "a")
    (state / "state.db").unlink()  # e.g. a state.db restored from before the first round
    store = Store(state / "state.db")
    try:
        with pytest.raises(StateConflict, match="2 round checkpoint.*--new-federation"):
            guard_federation_start(
                state, store.get_meta("federation_id"), new_federation=False, say=print
            )
    finally:
        store.close()


def test_new_federation_sets_old_files_aside(tmp_path: Path) -> None:
    state, _ = _two_rounds(tmp_path / "a")
    old = read_marker(state)
    (state / "state.db").unlink()
    said: list[str] = []
    guard_federation_start(state, None, new_federation=True, say=said.append)
    assert not (state / "checkpoints").exists() and not (state / MARKER_NAME).exists()
    (aside,) = state.glob("set-aside-*")
    assert len(list((aside / "checkpoints").glob("round-*.pt"))) == 2
    assert read_marker(aside) == old
    assert "set aside" in said[0]


def test_known_federation_resumes_and_new_federation_flag_is_refused(tmp_path: Path) -> None:
    state, _ = _two_rounds(tmp_path / "a")
    fid = read_marker(state)
    guard_federation_start(state, fid, new_federation=False, say=print)  # resume: fine
    with pytest.raises(StateConflict, match="never discards"):
        guard_federation_start(state, fid, new_federation=True, say=print)
    with pytest.raises(StateConflict, match="different federations"):
        guard_federation_start(state, "0123456789abcdef", new_federation=False, say=print)


def test_empty_state_dir_starts(tmp_path: Path) -> None:
    guard_federation_start(tmp_path, None, new_federation=False, say=print)


# ---------------------------------------------------------------------- --check-state
def _config(tmp: Path, state: Path) -> Path:
    config = tmp / "coordinator.toml"
    config.write_text(
        "[federation]\n"
        'participants = ["p0", "p1", "p2"]\n'
        f'state_dir = "{state}"\n'
        f'out_dir = "{tmp / "out"}"\n'
        "[model]\n"
        'dataset = "digits"\n'
        'extractor = "mlp"\n'
        "[training]\n"
        "rounds = 3\n"
        "[calibration]\n"
        'methods = ["ffc"]\n'
        "[secure_aggregation]\n"
        "updates = false\n"
        "statistics = false\n"
        "[server]\n"
        'listen = "127.0.0.1:0"\n'
        "insecure = true\n"
    )
    return config


def test_check_state_prints_what_the_directory_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, _ = _two_rounds(tmp_path / "a")
    Store(state / "state.db").close()
    report = inspect_state(state)
    assert report.rounds_completed == 2 and report.federation_id == read_marker(state)
    assert [r["checkpoint_state"] for r in report.rounds] == ["ok", "ok"]
    assert main(["coordinator", "--config", str(_config(tmp_path, state)), "--check-state"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == format_report(report)
    assert "rounds completed 2" in out and str(report.federation_id) in out


def test_cli_refuses_damaged_or_orphaned_state_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, _ = _two_rounds(tmp_path / "a")
    (state / "state.db").write_bytes(b"\x00garbage" * 1000)
    for name in ("state.db-wal", "state.db-shm"):
        (state / name).unlink(missing_ok=True)
    config = _config(tmp_path, state)
    for extra in ([], ["--check-state"]):
        assert main(["coordinator", "--config", str(config), *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "not a usable SQLite database" in lines[0], lines
    (state / "state.db").unlink()  # now: checkpoints + marker, no database at all
    assert main(["coordinator", "--config", str(config)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--new-federation" in lines[0], lines


def test_check_state_without_a_database_says_what_that_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory no federation has run in (or a config naming the wrong one) is exit
    2 with one line saying so — as docs/deployment.md says — and nothing is created."""
    state = tmp_path / "state"
    config = _config(tmp_path, state)
    assert main(["coordinator", "--config", str(config), "--check-state"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"no coordinator state at {state / 'state.db'}: no federation has run" in lines[0]
    assert "[federation] state_dir names another directory" in lines[0]
    assert not state.exists()
    doc = (Path(__file__).resolve().parents[3] / "docs" / "deployment.md").read_text()
    assert "2 when the database is\ndamaged, or when there is none" in doc


# ------------------------------------- --check-state creates nothing beside the database
def _listing(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by relative name, with its content's SHA-256
    (SQLite's ``-wal``/``-shm`` included)."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def _check_state(tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``spherecal coordinator --config FILE --check-state``, as an operator runs it."""
    config = _config(tmp_path, state)
    assert main(["coordinator", "--config", str(config), "--check-state"]) == 0
    return capsys.readouterr().out


#: Run in a child process on a coordinator's state directory: the real ``Store`` (as
#: the coordinator opens it, holding the directory's lock) starts round 3 and records
#: an audit row, committed, then the process dies (``kill``: no close, no checkpoint —
#: those rows are in state.db-wal alone) or waits, alive, until its standard input
#: closes (``live``).
WRITER = r"""
import os, sys
from pathlib import Path
from spherecal.coordinator.state.store import Store
from spherecal.spherefed.state_lock import StateDirLock
state, how = Path(sys.argv[1]), sys.argv[2]
lock = StateDirLock(state, role="coordinator").acquire()
store = Store(state / "state.db")
store.round_started(2, 1)
store.audit(sender="p0", job=None, stage="join", kind="JoinRequest", nbytes=1, sha256="00")
assert store.query("SELECT status FROM rounds WHERE round=2") == [("running",)]  # committed
if how == "kill":
    os._exit(0)
print("ready", flush=True)
sys.stdin.read()
store.close()
"""


def _writer(state: Path, how: str) -> subprocess.Popen[str]:
    return start_writer(WRITER, str(state), how)


def _stopped_cleanly(root: Path) -> Path:
    """Two completed rounds, the store closed: as a coordinator that stopped leaves
    its directory (the WAL checkpointed into state.db and removed)."""
    state, _ = _two_rounds(root, close=True)
    return state


def test_check_state_of_a_checkpointed_database_creates_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cleanly stopped coordinator leaves ``state.db`` alone. ``--check-state``
    opened it ``mode=ro``, which created ``state.db-wal`` and ``state.db-shm`` beside
    it and left them: the directory an operator checks before a backup or a copy was
    not the one checked."""
    state = _stopped_cleanly(tmp_path / "a")
    before = _listing(state)
    assert "state.db-wal" not in before and "state.db-shm" not in before, before
    out = _check_state(tmp_path, state, capsys)
    assert _listing(state) == before
    assert "rounds completed 2" in out and "quick_check ok" in out
    assert f"federation       {read_marker(state)}" in out


def test_check_state_reads_a_killed_coordinators_wal_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A coordinator that died left committed rows in ``state.db-wal`` alone: the
    check must report them (``immutable=1`` would not), without SQLite's recovery
    rewriting ``state.db-shm`` beside them — a restart recovers from those files."""
    state = _stopped_cleanly(tmp_path / "a")
    assert _writer(state, "kill").wait(timeout=120) == 0
    before = _listing(state)
    assert {"state.db-wal", "state.db-shm"} <= set(before), before
    db = state / "state.db"
    alone = sqlite3.connect(f"{db.as_uri()}?mode=ro&immutable=1", uri=True)
    assert alone.execute("SELECT COUNT(*) FROM rounds").fetchone() == (2,)  # file alone
    alone.close()
    assert _listing(state) == before
    report = inspect_state(state)
    assert _listing(state) == before
    assert [r["status"] for r in report.rounds] == ["completed", "completed", "running"]
    assert report.rounds_completed == 2 and report.wal_bytes > 0
    out = _check_state(tmp_path, state, capsys)
    assert _listing(state) == before
    assert "round    3  running" in out and "rounds completed 2" in out


def test_check_state_beside_a_live_coordinator_creates_nothing_and_reads_its_wal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a coordinator running (it holds the state directory's lock), the check
    reads through SQLite's locks and the coordinator's own ``-shm`` — the one file
    both sides' locks change — and creates nothing; the rows the coordinator committed
    to its WAL are reported."""
    state = _stopped_cleanly(tmp_path / "a")
    writer = _writer(state, "live")
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        before = _listing(state)
        out = _check_state(tmp_path, state, capsys)
        after = _listing(state)
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        assert writer.wait(timeout=120) == 0
    assert set(after) == set(before)
    assert {k: v for k, v in after.items() if k != "state.db-shm"} == {
        k: v for k, v in before.items() if k != "state.db-shm"
    }
    assert "round    3  running" in out
