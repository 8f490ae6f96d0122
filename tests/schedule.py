"""Which test file starts first on the xdist workers, and a record of when each ran.

CI runs the suite with ``--dist loadfile``: a file is one unit of work, handed to the
next idle worker in the order the units are queued. A file whose module fixture runs
whole federations for two minutes, queued last, runs alone while the other worker
idles: the run lasts as long as the busiest worker, not half the work. Queued longest
first (the classic LPT rule), the short files fill the gaps at the end instead.

The order comes from ``tests/durations.json``: seconds per file (setup, calls and
teardown of all its tests, the tiers together) measured by a timeline run (below) on
the 2-core CI box. A file missing from the table (new, or renamed) counts as
``UNKNOWN_SECONDS``; a stale figure only moves a file in the queue, never changes
which tests run or what they assert. xdist's own reordering (by the number of tests
in a file, not by time) is switched off with ``--no-loadscope-reorder`` (Makefile), so
the queue is the collection order this module sets.

The timeline: with ``SPHERECAL_TEST_TIMELINE=<dir>`` each process (each xdist worker,
or the one process without xdist) appends one JSON line per test to
``<dir>/<worker>.jsonl``: node id, worker, start and end (epoch seconds, setup through
teardown). ``python bench/ci_timeline.py <dir>`` reads them: per-file seconds, each
worker's busy time and makespan, and ``--write-table`` renews ``tests/durations.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

__all__ = [
    "TABLE",
    "TIMELINE_ENV",
    "UNKNOWN_SECONDS",
    "file_of",
    "load_table",
    "longest_first",
    "now",
    "record",
]

TABLE = Path(__file__).resolve().parent / "durations.json"
TIMELINE_ENV = "SPHERECAL_TEST_TIMELINE"
# A file not in the table yet: about a typical everyday file (most files take well
# under this), so a new long file is queued mid-way rather than last.
UNKNOWN_SECONDS = 5.0


class _Item(Protocol):
    @property
    def nodeid(self) -> str: ...


_T = TypeVar("_T", bound=_Item)


def file_of(nodeid: str) -> str:
    """The file part of a node id, the unit ``--dist loadfile`` schedules."""
    return nodeid.split("::", 1)[0]


def load_table(path: Path = TABLE) -> dict[str, float]:
    """``{file: seconds}`` from the checked-in table; a missing or unreadable table is
    an empty one (the suite then runs in collection order, as before)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = raw.get("files", {}) if isinstance(raw, dict) else {}
    return {str(k): float(v) for k, v in files.items() if isinstance(v, (int, float))}


def longest_first(items: Sequence[_T], seconds: Mapping[str, float]) -> list[_T]:
    """``items`` regrouped by file, the files longest first by ``seconds`` (ties and
    unknown files keep their collection order), the tests inside a file in their own
    order: a module fixture still sets up once, parametrised cases stay together."""
    by_file: dict[str, list[_T]] = {}
    for item in items:
        by_file.setdefault(file_of(item.nodeid), []).append(item)
    order = sorted(
        enumerate(by_file),
        key=lambda pair: (-seconds.get(pair[1], UNKNOWN_SECONDS), pair[0]),
    )
    return [item for _, name in order for item in by_file[name]]


def record(nodeid: str, start: float, end: float) -> None:
    """Append one test's span to this process's timeline file, when one is asked for."""
    folder = os.environ.get(TIMELINE_ENV)
    if not folder:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = json.dumps({"nodeid": nodeid, "worker": worker, "start": start, "end": end})
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"{worker}.jsonl", "a", encoding="utf-8") as out:
        out.write(line + "\n")


def now() -> float:
    """Wall-clock epoch seconds: spans from two worker processes share one axis."""
    return time.time()
