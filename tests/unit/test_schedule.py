"""The test queue order (``tests/schedule.py``) and the timeline summary
(``bench/ci_timeline.py``): files longest first, each file's tests together and in
their own order, unknown files mid-queue; a timeline's makespan, busy time and tail
computed from its spans by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.ci_timeline import Span, read_spans, summarise, write_table
from tests.schedule import TABLE, UNKNOWN_SECONDS, file_of, load_table, longest_first

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Item:
    nodeid: str


def _ids(items: list[Item]) -> list[str]:
    return [i.nodeid for i in items]


def test_files_longest_first_tests_kept_together_in_their_order() -> None:
    items = [
        Item("a.py::t1"),
        Item("b.py::t1"),
        Item("a.py::t2[x]"),
        Item("c.py::t1"),
        Item("b.py::t2"),
        Item("a.py::t2[y]"),
    ]
    ordered = longest_first(items, {"a.py": 1.0, "b.py": 30.0, "c.py": 12.0})
    assert _ids(ordered) == [
        "b.py::t1",
        "b.py::t2",
        "c.py::t1",
        "a.py::t1",
        "a.py::t2[x]",
        "a.py::t2[y]",
    ]


def test_unknown_files_count_as_the_default_and_ties_keep_collection_order() -> None:
    items = [Item("new1.py::t"), Item("short.py::t"), Item("new2.py::t"), Item("long.py::t")]
    seconds = {"short.py": UNKNOWN_SECONDS / 2, "long.py": UNKNOWN_SECONDS * 2}
    assert _ids(longest_first(items, seconds)) == [
        "long.py::t",
        "new1.py::t",
        "new2.py::t",
        "short.py::t",
    ]
    # an empty table: the collection order, files regrouped only
    assert _ids(longest_first(items, {})) == _ids(items)


def test_the_table_loads_and_a_missing_or_broken_one_is_empty(tmp_path: Path) -> None:
    good = tmp_path / "d.json"
    good.write_text(json.dumps({"files": {"x.py": 3, "y.py": 1.5, "bad.py": "slow"}}))
    assert load_table(good) == {"x.py": 3.0, "y.py": 1.5}
    assert load_table(tmp_path / "absent.json") == {}
    (tmp_path / "broken.json").write_text("{not json")
    assert load_table(tmp_path / "broken.json") == {}


def test_the_checked_in_table_names_only_files_that_exist() -> None:
    """A renamed or deleted file left in the table would only be dead weight, but a
    table naming no real file orders nothing: keep it in step with the tests."""
    table = load_table(TABLE)
    assert len(table) >= 50
    missing = [name for name in table if not (REPO / name).is_file()]
    assert missing == []
    assert all(seconds >= 0 for seconds in table.values())


def test_file_of_is_the_loadfile_unit() -> None:
    assert file_of("tests/unit/x.py::T::test[a::b]") == "tests/unit/x.py"
    assert file_of("tests/unit/x.py") == "tests/unit/x.py"


def _write_timeline(folder: Path, spans: list[Span]) -> None:
    folder.mkdir()
    for s in spans:
        with open(folder / f"{s.worker}.jsonl", "a") as out:
            out.write(json.dumps(s.__dict__) + "\n")


SPANS = [
    Span("long.py::a", "gw0", 100.0, 160.0),
    Span("long.py::b", "gw0", 160.0, 170.0),
    Span("mid.py::a", "gw1", 100.5, 130.5),
    Span("short.py::a", "gw1", 131.0, 141.0),
    Span("tiny.py::a", "gw0", 170.0, 171.0),
]


def test_the_summary_is_the_hand_computed_one(tmp_path: Path) -> None:
    _write_timeline(tmp_path / "tl", SPANS)
    doc = summarise(read_spans(tmp_path / "tl"))
    assert doc["tests"] == 5
    assert doc["makespan_s"] == 71.0  # 100.0 to 171.0
    assert doc["work_s"] == 60 + 10 + 30 + 10 + 1
    assert doc["tail_s"] == 30.0  # gw1 done at 41.0, gw0 at 71.0
    assert doc["files"] == {"long.py": 70.0, "mid.py": 30.0, "short.py": 10.0, "tiny.py": 1.0}
    workers = doc["workers"]
    assert isinstance(workers, dict)
    assert workers["gw0"]["busy_s"] == 71.0 and workers["gw1"]["busy_s"] == 40.0
    assert [o["file"] for o in workers["gw0"]["order"]] == ["long.py", "tiny.py"]
    assert [o["start_s"] for o in workers["gw1"]["order"]] == [0.5, 31.0]


def test_write_table_merges_and_sorts(tmp_path: Path) -> None:
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"note": "kept", "files": {"old.py": 9.0, "mid.py": 1.0}}))
    write_table({"mid.py": 30.0, "new.py": 2.0}, table)
    written = json.loads(table.read_text())
    assert written["note"] == "kept"
    assert list(written["files"].items()) == [("mid.py", 30.0), ("old.py", 9.0), ("new.py", 2.0)]


def test_an_empty_timeline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no timeline"):
        read_spans(tmp_path)


def test_pytest_records_a_timeline_when_asked(tmp_path: Path) -> None:
    """The conftest hook writes one line per test, setup through teardown, to the
    folder the environment names; without the variable it writes nothing."""
    folder = tmp_path / "tl"
    env = {**os.environ, "SPHERECAL_TEST_TIMELINE": str(folder), "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    target = "tests/unit/test_schedule.py::test_file_of_is_the_loadfile_unit"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", target],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    spans = read_spans(folder)
    assert [(s.nodeid, s.worker) for s in spans] == [(target, "main")]
    assert spans[0].end >= spans[0].start
