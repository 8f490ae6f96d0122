"""A federation that ended is read-only to a restart (issue #23, item 1): detected from
a real coordinator database without writing a byte, reported from its stored result,
set aside whole (never deleted) only for ``--new-federation``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spherecal.coordinator.main import run_coordinator
from spherecal.coordinator.settings import CoordinatorSettings, ServerSettings, Timeouts
from spherecal.coordinator.state.lifecycle import (
    Finished,
    finished_federation,
    set_aside_finished,
    stored_result,
)
from spherecal.coordinator.state.store import Store
from tests.store_writer import start_writer


def _state(tmp_path: Path, status: str | None) -> Path:
    """A state directory as a coordinator leaves it: database, checkpoint, marker."""
    state = tmp_path / "state"
    state.mkdir()
    store = Store(state / "state.db")
    store.set_meta("federation_id", "f00dfeed")
    if status is not None:
        store.set_meta("status", status)
    store.event("info", f"federation {status}")
    store.close()
    (state / "checkpoints").mkdir()
    (state / "checkpoints" / "round-00001.pt").write_bytes(b"checkpoint")
    (state / "federation.json").write_text('{"federation_id": "f00dfeed"}\n')
    return state


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("status", ["completed", "degraded", "failed"])
def test_an_ended_federation_is_found_without_writing(tmp_path: Path, status: str) -> None:
    state = _state(tmp_path, status)
    before = _files(state)
    found = finished_federation(state)
    assert found == Finished("f00dfeed", status, state / "state.db")
    assert _files(state) == before  # no -wal / -shm appeared beside the database


@pytest.mark.parametrize("status", [None, "running", "stopped"])
def test_a_federation_to_resume_is_not_finished(tmp_path: Path, status: str | None) -> None:
    assert finished_federation(_state(tmp_path, status)) is None


#: A coordinator that records its end and dies before closing its store: the status
#: is in ``state.db-wal`` alone (no checkpoint), beside the ``-shm`` index it left.
KILLED_AFTER_THE_END = r"""
import os, sys
from pathlib import Path
from spherecal.coordinator.state.store import Store
store = Store(Path(sys.argv[1]) / "state.db")
store.set_meta("status", "completed")
os._exit(0)
"""


def test_an_ended_federation_in_a_killed_coordinators_wal_is_found_without_writing(
    tmp_path: Path,
) -> None:
    """The start of a restarted coordinator reads whether the federation ended before
    anything else; with a ``-wal`` and no live process, a bare ``mode=ro`` rebuilt
    ``state.db-shm`` beside it — in a directory that, the federation having ended, was
    to be reported and left as it is."""
    state = _state(tmp_path, "running")
    assert start_writer(KILLED_AFTER_THE_END, str(state)).wait(timeout=120) == 0
    before = _files(state)
    assert {"state.db-wal", "state.db-shm"} <= set(before), sorted(before)
    assert finished_federation(state) == Finished("f00dfeed", "completed", state / "state.db")
    assert _files(state) == before


def test_no_database_or_a_damaged_one_is_left_to_the_store(tmp_path: Path) -> None:
    assert finished_federation(tmp_path) is None
    (tmp_path / "state.db").write_bytes(b"not sqlite at all" * 100)
    assert finished_federation(tmp_path) is None


def test_stored_result_is_this_federations_summary_else_the_database(tmp_path: Path) -> None:
    finished = Finished("f00dfeed", "completed", tmp_path / "state.db")
    out = tmp_path / "out"
    fallback = stored_result(finished, out)
    assert fallback["status"] == "completed" and fallback["federation_id"] == "f00dfeed"
    assert "missing or belongs to another federation" in fallback["status_reasons"][0]
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"federation_id": "other", "status": "x"}))
    assert stored_result(finished, out)["status"] == "completed"
    summary = {"federation_id": "f00dfeed", "status": "completed", "accuracy": {"ffc": 0.9}}
    (out / "summary.json").write_text(json.dumps(summary))
    assert stored_result(finished, out) == summary


def test_set_aside_moves_everything_and_deletes_nothing(tmp_path: Path) -> None:
    state = _state(tmp_path, "completed")
    out = tmp_path / "out"
    out.mkdir()
    results = ["summary.json", "model_none.pt", "model_ffc.pt", "head_lda.pt"]
    # the saved statistics ([calibration] save_statistics) and the `spherecal report` page
    # describe the old federation too: left in out_dir they passed for the new one's
    results += ["statistics_ccvr.npz", "statistics_ffc.npz", "report.html"]
    for name in (*results, "notes.txt"):
        (out / name).write_bytes(name.encode())
    state_before, out_before = _files(state), _files(out)
    said: list[str] = []
    finished = finished_federation(state)
    assert finished is not None
    folder = set_aside_finished(finished, state, out, said.append)
    assert folder.parent == state and folder.name.startswith("set-aside-")
    assert _files(folder) == state_before  # all of it, byte for byte
    assert not (state / "state.db").exists() and not (state / "checkpoints").exists()
    (out_folder,) = out.glob("set-aside-*")
    assert _files(out_folder) == {k: v for k, v in out_before.items() if k != "notes.txt"}
    assert (out / "notes.txt").read_bytes() == b"notes.txt"  # not a result: stays
    assert len(said) == 1 and said[0].startswith("WARNING: --new-federation: federation f00dfeed")
    assert finished_federation(state) is None  # a new federation may start here


def test_run_coordinator_reports_an_ended_federation_and_writes_nothing(tmp_path: Path) -> None:
    state = _state(tmp_path, "completed")
    out = tmp_path / "out"
    out.mkdir()
    summary = {"federation_id": "f00dfeed", "status": "completed", "accuracy": {"ffc": 0.9}}
    (out / "summary.json").write_text(json.dumps(summary))
    settings = CoordinatorSettings(
        participants=("p0", "p1", "p2"),
        server=ServerSettings(insecure=True, listen="127.0.0.1:0"),
        # were it to start, it would give up on its participants at once (and write)
        timeouts=Timeouts(join_s=0.5, linger_s=0.5),
        state_dir=state,
        out_dir=out,
    )
    before = _files(tmp_path)
    said: list[str] = []
    assert run_coordinator(settings, say=said.append) == summary
    assert _files(tmp_path) == before
    assert any("already ended completed" in line for line in said), said


def test_a_new_federation_that_trains_as_the_one_set_aside_is_warned(tmp_path: Path) -> None:
    """Its first round would ask every site for the update it already released (the
    same participants, seed, model and training), which the sites refuse in any
    federation: the start says so and names the way out; another seed, or a finished
    federation that left no fingerprint, says nothing."""
    from dataclasses import replace

    from spherecal.coordinator.main import same_training_warning

    settings = CoordinatorSettings(participants=("a", "b", "c"))
    folder = tmp_path / "set-aside"
    folder.mkdir()
    assert same_training_warning(settings, folder) is None  # no database there
    store = Store(folder / "state.db")
    store.set_meta("fingerprint", settings.fingerprint())
    store.close()
    line = same_training_warning(settings, folder)
    assert line is not None and "RULE_RELEASE_REPEATED" in line
    assert "set another [federation] seed" in line
    assert same_training_warning(replace(settings, seed=1), folder) is None
    # what the fingerprint leaves out (calibration, evaluation) does not change training
    assert same_training_warning(replace(settings, name="renamed"), folder) is not None
