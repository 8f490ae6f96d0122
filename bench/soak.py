"""Soak: federations back to back under random faults, for a bounded time.

Each federation is a real ``spherecal simulate`` setup (one coordinator process, N
participant processes, gRPC on loopback, secure aggregation on by default). While it
runs, the soak injects faults drawn from a seeded RNG, each triggered by one of the
coordinator's progress lines (so it lands in a real stage: a round's training, right
after a round's checkpoint, a statistics job) plus a random delay:

``participant``   SIGKILL one participant, restart it 0.1–2 s later;
``three``         SIGKILL all but one participant, restart them within a second;
``coordinator``   SIGKILL the coordinator, restart it on the same port;
``halt``          (two federations in three) stop the coordinator dead *at* a point of
                  a secure job — one of ``coordinator.driver.halts.HALT_POINTS`` in
                  turn, in each job kind (round 1's update, the CCVR statistics, the
                  first evaluation), so ten such federations cover every (point, kind)
                  pair — SIGKILL it and restart it: the job must be continued, not
                  asked again.
``site halt``     (in the same federations, in other jobs) stop a *participant* dead at
                  a point of its secure job — one of :data:`SITE_POINTS` in turn
                  (before its upload: ``advertise``, ``share``; in its upload's crash
                  window: ``stored``, ``charged``; during it: ``masked``; after it:
                  ``consistency``, ``unmask``), one site in round 2's update and
                  another in the CCVR job (where the coordinator halts too: a crash of
                  both) — SIGKILL it and restart it: it must take the job up again
                  from its held-jobs folder (issue #20), so seven such federations
                  cover every (point, kind) pair.

What it reports (JSON on stdout, or ``--json FILE``):

* ``faults_injected`` by kind, ``federations`` by final status;
* ``rounds_lost``: rounds that were completed (checkpointed in the coordinator's
  database) when the coordinator was killed but were *not* resumed after — must be 0;
  a federation that ends ``failed`` loses all its completed rounds and counts them;
* ``releases_lost``: site refusals of a release already made (a coordinator that
  asked again instead of continuing its job) — must be 0; ``second_releases``:
  anything a site's ledger shows released twice (two updates of one round, two sets
  of moments in one federation) — must be 0; ``attempts_refused``: site refusals of
  a job beyond its ``[policy] max_unreleased_attempts`` (the retries outran what a
  site admits) — must be 0; ``most_unreleased_attempts``: the most started jobs one
  purpose of one site held that never released (the limit is 3, 12 for the
  evaluations together); ``halts`` and
  ``site_halts`` by ``point@kind``;
* ``coordinator_rss_mb``: the coordinator's resident memory sampled every
  ``--rss-every`` seconds (``[seconds since the soak started, MiB]``), its peak, and
  each federation's peak as the coordinator reported it.

No federation is started after ``--minutes`` have passed; the one running then is
finished (bounded by ``--federation-timeout``). Usage::

    nice -n 5 python bench/soak.py --minutes 30 --json out/soak.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/soak.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._rundir import RunDirectory, add_run_directory_option
from spherecal.coordinator.driver.halts import HALT_MARKER, HALT_POINTS
from spherecal.participant.faults import HaltPoint
from spherecal.simulate import Drop, Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig

FAULT_KINDS = ("participant", "three", "coordinator")
HALT_KINDS = ("update", "ccvr", "evaluate")
HALT_PAIRS = len(HALT_KINDS) * len(HALT_POINTS)
SITE_POINTS = ("advertise", "share", "stored", "charged", "masked", "consistency", "unmask")
SITE_JOBS = ("r2", "ccvr")  # round 2: no coordinator halt; CCVR: one, at another point
SITE_PAIRS = len(SITE_POINTS) * len(SITE_JOBS)
KILLED = "[simulate] killed p"


@dataclass(frozen=True)
class Fault:
    kind: str
    trigger: str  # substrings (separated by "*") of a coordinator progress line
    delay_s: float  # after the trigger


class Lines:
    """The current coordinator's progress lines; wait for one containing a needle."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.mark = 0

    def __call__(self, line: str) -> None:
        with self.cond:
            self.lines.append(line)
            self.cond.notify_all()

    def wait_for(self, trigger: str, until: float, alive: Any) -> bool:
        needles = trigger.split("*")
        with self.cond:
            while True:
                for k in range(self.mark, len(self.lines)):
                    if all(n in self.lines[k] for n in needles):
                        self.mark = k + 1
                        return True
                if time.monotonic() >= until or not alive():
                    return False
                self.cond.wait(0.5)


def completed_rounds(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2) as conn:
            row = conn.execute(
                "SELECT count(DISTINCT round) FROM rounds WHERE status='completed'"
            ).fetchone()
        return int(row[0])
    except sqlite3.Error:
        return 0


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def plan_faults(rng: random.Random, rounds: int) -> list[Fault]:
    triggers = [f"round {r}/{rounds}: training on" for r in range(1, rounds + 1)]
    triggers += [f"round {r}/{rounds}: *updates, loss" for r in range(1, rounds)]  # its end
    triggers += ["statistics ccvr:"]
    count = rng.choice((1, 1, 2))
    chosen = sorted(rng.sample(range(len(triggers)), count), key=lambda i: _order(triggers[i]))
    return [
        Fault(rng.choice(FAULT_KINDS), triggers[i], round(rng.uniform(0.0, 1.5), 2)) for i in chosen
    ]


def _order(trigger: str) -> tuple[int, int]:
    if trigger.startswith("statistics"):
        return (10**6, 0)
    r = int(trigger.split()[1].split("/")[0])
    return (r, 0 if "training" in trigger else 1)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.rss: list[list[float]] = []
        self.faults = dict.fromkeys(FAULT_KINDS, 0)
        self.statuses: dict[str, int] = {}
        self.rounds_lost = 0
        self.releases_lost = 0
        self.second_releases = 0
        self.attempts_refused = 0
        self.most_unreleased = 0
        self.halts: dict[str, int] = {}
        self._next_halt = args.first_halt
        self.site_halts: dict[str, int] = {}
        self._next_site = args.first_halt
        self.federations: list[dict[str, Any]] = []
        self._sim: Simulation | None = None
        self._stop = threading.Event()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def sample_rss(self) -> None:
        while not self._stop.wait(self.args.rss_every):
            sim = self._sim
            proc = sim.coordinator if sim is not None else None
            if proc is not None and proc.popen.poll() is None:
                mb = rss_mb(proc.popen.pid)
                if mb is not None:
                    self.rss.append([round(self.elapsed(), 1), round(mb, 1)])

    def run(self) -> dict[str, Any]:
        sampler = threading.Thread(target=self.sample_rss, daemon=True)
        sampler.start()
        run_dir = RunDirectory(self.args.out, prefix="spherecal-soak-")
        with run_dir as base:
            n = 0
            while self.elapsed() < self.args.minutes * 60:
                n += 1
                self.federations.append(self.federation(base / f"fed{n:03d}", n))
            self._stop.set()
            sampler.join(timeout=5)
            lost = {
                "rounds lost": self.rounds_lost,
                "releases lost": self.releases_lost,
                "second releases": self.second_releases,
                "attempts refused": self.attempts_refused,
                "failed federations": self.statuses.get("failed", 0),
            }
            for what, count in lost.items():
                if count:
                    run_dir.keep(f"{count} {what}")
        return self.report(run_dir.kept_path())

    def federation(self, out: Path, n: int) -> dict[str, Any]:
        a = self.args
        settings = SimulationSettings(
            reference=ReferenceConfig(
                participants=a.participants, model="mlp", rounds=a.rounds, alpha=0.5, seed=n
            ),
            out=out,
            # a fresh interpreter per process: its CPU and memory are measured from here
            # (getrusage of our children, /proc/<pid>), which needs it to be our child
            launcher="exec",
            calibration=("ffc", "ccvr"),
            secure_updates=not a.no_secure,
            secure_statistics=not a.no_secure,
            timeout_s=a.federation_timeout,
            # faults fire on a round's start, a DEBUG line (progress_log)
            extra_coordinator={"server": {"log_level": "debug"}},
        )
        halts: list[str] = []
        if n % 3 != 0:  # two federations in three: the coordinator halts at one point
            # of each job kind in turn (round 1's update, CCVR, the first evaluation);
            # ten such federations cover every (point, kind) pair
            point = HALT_POINTS[self._next_halt % len(HALT_POINTS)]
            self._next_halt += 1
            halts = [f"{point}@r1", f"{point}@ccvr", f"{point}@evaluate"]
        drops: tuple[Drop, ...] = ()
        if halts and a.rounds >= 2:  # and a site halts at one point of two other jobs
            site_point = SITE_POINTS[self._next_site % len(SITE_POINTS)]
            self._next_site += 1
            victims = self.rng.sample(list(settings.participant_ids), len(SITE_JOBS))
            drops = tuple(
                Drop(pid, HaltPoint(site_point, when))
                for pid, when in zip(victims, SITE_JOBS, strict=True)
            )
            settings = dataclasses.replace(settings, drops=drops)
        plan = [] if halts else plan_faults(self.rng, a.rounds)
        lines = Lines()
        injected: list[dict[str, Any]] = []
        lost = 0
        t0 = time.monotonic()
        until = t0 + a.federation_timeout
        pids = list(settings.participant_ids)
        record: dict[str, Any] = {
            "federation": n,
            "planned": [f.__dict__ for f in plan],
            "halts": halts,
            "site_halts": [str(d) for d in drops],
        }
        with Simulation(settings, lines) as sim:
            self._sim = sim
            port = sim.start_coordinator(halt=halts[0] if halts else None)
            sim.start_participants()
            db = out / "coordinator" / "state" / "state.db"
            restarter = SiteRestarter(sim, lines, len(drops))
            restarter.start()

            def alive() -> bool:
                return sim.coordinator is not None and sim.coordinator.popen.poll() is None

            for k, point in enumerate(halts):
                stage = point.split("@")[0]
                if not lines.wait_for(f"{HALT_MARKER} {stage} ", until, alive):
                    injected.append({"kind": "halt", "point": point, "skipped": "never reached"})
                    break
                at = round(time.monotonic() - t0, 2)
                before = completed_rounds(db)
                sim.kill_coordinator()
                lines.mark = len(lines.lines)
                following = halts[k + 1] if k + 1 < len(halts) else None
                sim.start_coordinator(listen=f"127.0.0.1:{port}", halt=following)
                resumed = self._resumed_after(lines, until)
                lost += max(0, before - resumed)
                injected.append(
                    {"kind": "halt", "point": point, "at_s": at, "completed_rounds": before}
                )
                self.halts[point] = self.halts.get(point, 0) + 1

            for fault in plan:
                if not lines.wait_for(fault.trigger, until, alive):
                    injected.append({"kind": fault.kind, "skipped": "trigger never seen"})
                    continue
                time.sleep(fault.delay_s)
                if not alive():
                    break
                at = round(time.monotonic() - t0, 2)
                if fault.kind == "coordinator":
                    before = completed_rounds(db)
                    sim.kill_coordinator()
                    lines.mark = len(lines.lines)
                    sim.start_coordinator(listen=f"127.0.0.1:{port}")
                    resumed = self._resumed_after(lines, until)
                    lost += max(0, before - resumed)
                    injected.append(
                        {
                            "kind": "coordinator",
                            "at_s": at,
                            "completed_rounds": before,
                            "resumed_after": resumed,
                        }
                    )
                else:
                    victims = (
                        [self.rng.choice(pids)]
                        if fault.kind == "participant"
                        else self.rng.sample(pids, len(pids) - 1)
                    )
                    for pid in victims:
                        sim.kill_participant(pid, f"SIGKILL by bench/soak.py ({fault.kind})")
                    pause = self.rng.uniform(0.1, 2.0 if fault.kind == "participant" else 1.0)
                    time.sleep(pause)
                    sim.start_participants(only=victims)
                    injected.append(
                        {
                            "kind": fault.kind,
                            "at_s": at,
                            "victims": victims,
                            "restart_after_s": round(pause, 2),
                        }
                    )
                self.faults[fault.kind] += 1
            try:
                sim.wait_coordinator(max(1.0, until - time.monotonic()))
                restarter.stop()
                results: dict[str, Any] = dict[str, Any](
                    sim.results(sim.wait_participants(timeout=60), time.monotonic() - t0)
                )
                status = str(results["status"])
            except Exception as exc:  # a soak records every way a run ends
                results = {}
                status = f"harness-error: {exc}"[:200]
            restarter.stop()
            self._sim = None
        for site in restarter.killed:
            injected.append({"kind": "site halt", **site})
        fired = {(d["participant"], d["stage"]) for d in restarter.killed}
        for drop in drops:
            key = f"{drop.point.stage}@{drop.point.when}"
            if (drop.participant, drop.point.stage) in fired:
                self.site_halts[key] = self.site_halts.get(key, 0) + 1
            else:
                injected.append({"kind": "site halt", "point": key, "skipped": "never reached"})
        if status == "failed" or status.startswith("harness-error"):
            lost += completed_rounds(db)
        self.rounds_lost += lost
        ledgers = _ledgers(out, list(settings.participant_ids))
        refused, twice = ledgers.refused, ledgers.twice
        self.releases_lost += refused
        self.second_releases += twice
        self.attempts_refused += ledgers.attempts_refused
        self.most_unreleased = max(self.most_unreleased, ledgers.most_unreleased)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        record.update(
            releases_lost=refused,
            second_releases=twice,
            attempts_refused=ledgers.attempts_refused,
            most_unreleased=ledgers.most_unreleased,
            status=status,
            status_reasons=results.get("status_reasons", []),
            faults=injected,
            rounds_lost=lost,
            retries=(results.get("retries") or {}).get("count"),
            accuracy=results.get("accuracy"),
            wall_s=round(time.monotonic() - t0, 1),
            coordinator_peak_rss_mb=_peak_rss(out),
        )
        print(f"[soak] {json.dumps(record)}", file=sys.stderr, flush=True)
        return record

    @staticmethod
    def _resumed_after(lines: Lines, until: float) -> int:
        """The round the restarted coordinator resumes after (0 if it starts afresh)."""
        deadline = min(until, time.monotonic() + 300)
        with lines.cond:
            while time.monotonic() < deadline:
                for line in lines.lines[lines.mark :]:
                    if "resuming federation" in line and "after round " in line:
                        return int(line.split("after round ")[1].split()[0])
                    if "listening on" in line:
                        return 0
                lines.cond.wait(0.5)
        return 0

    def report(self, kept: str | None) -> dict[str, Any]:
        peaks = [f["coordinator_peak_rss_mb"] for f in self.federations]
        return {
            "bench": "soak",
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "load_avg_at_end": list(os.getloadavg()),
            },
            "settings": {
                "minutes": self.args.minutes,
                "participants": self.args.participants,
                "rounds": self.args.rounds,
                "secure": not self.args.no_secure,
                "seed": self.args.seed,
                "first_halt": self.args.first_halt,
            },
            "ran_s": round(self.elapsed(), 1),
            "federations": {"run": len(self.federations), **self.statuses},
            "federations_completed": self.statuses.get("completed", 0),
            "faults_injected": {**self.faults, "total": sum(self.faults.values())},
            "rounds_lost": self.rounds_lost,
            "releases_lost": self.releases_lost,
            "second_releases": self.second_releases,
            "attempts_refused": self.attempts_refused,
            "most_unreleased_attempts": self.most_unreleased,
            "halts": {"by_point": dict(sorted(self.halts.items())), "pairs": HALT_PAIRS},
            "site_halts": {
                "by_point": dict(sorted(self.site_halts.items())),
                "pairs": SITE_PAIRS,
            },
            "coordinator_rss_mb": {
                "samples": self.rss,
                "peak": max((s[1] for s in self.rss), default=None),
                "per_federation_peak": peaks,
            },
            "per_federation": self.federations,
            "out": kept,
        }


class SiteRestarter(threading.Thread):
    """Restarts each participant the harness killed at its halt point (the
    ``[simulate] killed pX`` line), on the same state directory, as an operator's
    supervisor would; records what it killed."""

    def __init__(self, sim: Simulation, lines: Lines, expected: int) -> None:
        super().__init__(daemon=True)
        self.sim, self.lines, self.expected = sim, lines, expected
        self.killed: list[dict[str, Any]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        seen = 0
        while len(self.killed) < self.expected and not self._stop_event.is_set():
            with self.lines.cond:
                found = None
                for k in range(seen, len(self.lines.lines)):
                    if KILLED in self.lines.lines[k]:
                        found = k
                        break
                if found is None:
                    seen = len(self.lines.lines)
                    self.lines.cond.wait(0.5)
                    continue
                line = self.lines.lines[found]
                seen = found + 1
            pid = line.split("killed ", 1)[1].split()[0]
            stage = line.split(" at stage ", 1)[1].split()[0] if " at stage " in line else "?"
            old = self.sim.participants.get(pid)
            if old is not None:
                old.popen.wait(timeout=30)
                old.close()
            self.sim.start_participants(only=[pid])
            self.killed.append({"participant": pid, "stage": stage})

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=60)


@dataclasses.dataclass
class LedgerCounts:
    """What every site's ledger (``state/<pid>/privacy.db``) of one federation shows."""

    refused: int = 0
    """Refusals of a repeated release (``RULE_RELEASE_REPEATED``)."""
    twice: int = 0
    """Releases made twice (two updates of one round, two sets of moments)."""
    attempts_refused: int = 0
    """Refusals of a job beyond the site's ``[policy] max_unreleased_attempts``
    (``RULE_ATTEMPTS_EXHAUSTED``): the coordinator's retries outran what the site
    admits — must be 0 with the defaults."""
    most_unreleased: int = 0
    """The most started jobs one purpose of one site held whose input never left (a
    training round, the moments; the evaluations together): how close the faults
    brought an honest run to that limit."""


def _ledgers(out: Path, pids: list[str]) -> LedgerCounts:
    """What every site's ledger shows (:class:`LedgerCounts`)."""
    counts = LedgerCounts()
    for pid in pids:
        db = out / "state" / pid / "privacy.db"
        if not db.exists():
            continue
        with sqlite3.connect(db) as conn:
            counts.refused += conn.execute(
                "SELECT COUNT(*) FROM site_refusals WHERE rule = 'RULE_RELEASE_REPEATED'"
            ).fetchone()[0]
            counts.attempts_refused += conn.execute(
                "SELECT COUNT(*) FROM site_refusals WHERE rule = 'RULE_ATTEMPTS_EXHAUSTED'"
            ).fetchone()[0]
            counts.twice += conn.execute(
                "SELECT COALESCE(SUM(c - 1), 0) FROM (SELECT COUNT(*) AS c FROM site_releases "
                "WHERE state = 'released' AND family != 'evaluation' "
                "GROUP BY family, federation, COALESCE(round, -1))"
            ).fetchone()[0]
            counts.most_unreleased = max(
                counts.most_unreleased,
                conn.execute(
                    "SELECT COALESCE(MAX(c), 0) FROM (SELECT COUNT(*) AS c FROM site_releases "
                    "WHERE state = 'reserved' GROUP BY family, federation, "
                    "CASE WHEN family = 'training' THEN COALESCE(round, -1) ELSE -1 END)"
                ).fetchone()[0],
            )
    return counts


def _peak_rss(out: Path) -> float | None:
    path = out / "coordinator" / "out" / "summary.json"
    try:
        data = json.loads(path.read_text())
        return float(data["resources"]["peak_rss_mb"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Federations back to back under random participant and coordinator "
        "kills, for a bounded time; prints JSON (faults injected, federations by status, "
        "rounds lost, coordinator RSS over time)."
    )
    p.add_argument("--minutes", type=float, default=30.0, help="start no federation after this")
    p.add_argument("--participants", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="seeds the fault plan")
    p.add_argument("--no-secure", action="store_true", help="plaintext aggregation")
    p.add_argument(
        "--first-halt",
        type=int,
        default=0,
        help="start the coordinator halt points (and the site halt points) at this index "
        "of their rotation: a shorter run covers the points an earlier one did not reach",
    )
    p.add_argument("--federation-timeout", type=float, default=900.0)
    p.add_argument("--rss-every", type=float, default=5.0, help="RSS sampling period (s)")
    add_run_directory_option(
        p, "--out", kept_when="a round or release was lost or a federation failed"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.participants < 4:
        p.error("--participants must be >= 4 (secure jobs need 3 survivors of a kill)")
    report = Soak(args).run()
    text = json.dumps(report, indent=2)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    return 0 if report["rounds_lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
