"""Where a pytest-xdist run's time went: per file, per worker, and the idle tail.

Reads the timeline a run leaves with ``SPHERECAL_TEST_TIMELINE=<dir>`` (one JSON line
per test: node id, worker, start, end; ``tests/schedule.py``) and prints JSON:

- ``makespan_s``: first start to last end, the wall time of the tests;
- per worker: busy seconds, its first start and last end (relative to the run's first
  start), and the files it ran in order, with when each started;
- ``tail_s``: how long the first worker to finish sat idle while the other ran on,
  the time a better queue order could give back;
- ``files``: seconds per file (setup, calls, teardown), longest first.

``--write-table`` merges the per-file seconds into ``tests/durations.json`` (the queue
order of ``tests/conftest.py``), keeping files this run did not include::

    SPHERECAL_TEST_TIMELINE=/tmp/tl python -m pytest -n 2 --dist loadfile -m long
    python bench/ci_timeline.py /tmp/tl --write-table
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as ``python bench/ci_timeline.py``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import emit_json

TABLE = Path(__file__).resolve().parents[1] / "tests" / "durations.json"


@dataclass(frozen=True)
class Span:
    """One test, setup through teardown, on one worker (epoch seconds)."""

    nodeid: str
    worker: str
    start: float
    end: float

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]


def read_spans(folder: Path) -> list[Span]:
    """Every span in ``folder/*.jsonl``, ordered by start."""
    spans: list[Span] = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                raw = json.loads(line)
                spans.append(
                    Span(
                        str(raw["nodeid"]),
                        str(raw["worker"]),
                        float(raw["start"]),
                        float(raw["end"]),
                    )
                )
    if not spans:
        raise SystemExit(f"no timeline in {folder} (run pytest with SPHERECAL_TEST_TIMELINE)")
    return sorted(spans, key=lambda s: s.start)


def summarise(spans: list[Span], *, orders: bool = True) -> dict[str, object]:
    """The JSON document described in the module docstring."""
    t0 = min(s.start for s in spans)
    t1 = max(s.end for s in spans)
    files: dict[str, float] = {}
    busy: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    order: dict[str, list[dict[str, object]]] = {}
    for s in spans:
        files[s.file] = files.get(s.file, 0.0) + (s.end - s.start)
        busy[s.worker] = busy.get(s.worker, 0.0) + (s.end - s.start)
        first.setdefault(s.worker, s.start - t0)
        last[s.worker] = max(last.get(s.worker, 0.0), s.end - t0)
        runs = order.setdefault(s.worker, [])
        if not runs or runs[-1]["file"] != s.file:
            runs.append({"file": s.file, "start_s": round(s.start - t0, 1)})
    workers: dict[str, dict[str, object]] = {}
    for w in sorted(busy):
        workers[w] = {
            "busy_s": round(busy[w], 1),
            "first_start_s": round(first[w], 1),
            "last_end_s": round(last[w], 1),
        }
        if orders:
            workers[w]["order"] = order[w]
    return {
        "tests": len(spans),
        "makespan_s": round(t1 - t0, 1),
        "work_s": round(sum(files.values()), 1),
        "tail_s": round(max(last.values()) - min(last.values()), 1),
        "workers": workers,
        "files": {k: round(v, 1) for k, v in sorted(files.items(), key=lambda kv: -kv[1])},
    }


def write_table(files: dict[str, float], path: Path = TABLE) -> None:
    """Merge measured per-file seconds into the queue-order table."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        table = {}
    merged = dict(table.get("files", {}))
    merged.update(files)
    table["files"] = {k: merged[k] for k in sorted(merged, key=lambda k: (-merged[k], k))}
    path.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("folder", type=Path, help="the SPHERECAL_TEST_TIMELINE folder")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--write-table", action="store_true", help=f"merge per-file seconds into {TABLE.name}"
    )
    parser.add_argument("--brief", action="store_true", help="leave out each worker's file order")
    args = parser.parse_args(argv)
    spans = read_spans(args.folder)
    emit_json(summarise(spans, orders=not args.brief), args.json)
    if args.write_table:
        files: dict[str, float] = {}
        for s in spans:
            files[s.file] = round(files.get(s.file, 0.0) + (s.end - s.start), 1)
        write_table(files)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
