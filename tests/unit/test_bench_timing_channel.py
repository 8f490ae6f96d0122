"""``bench/timing_channel.py --measure`` on a synthetic simulation output (participant
logs, configs and a coordinator database with the real schema): the example counts
are read from the logs the participants write, each job kind is measured against the
right split, the settings are grouped by the ``min_local_work_s`` the participants
ran with, and a planted dependence shows where it was planted. The simulations
themselves are the bench's to run, not the everyday tests'."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from bench.timing_channel import main
from spherecal.coordinator.state.schema import SCHEMA

TRAIN = {"p0": 134, "p1": 222, "p2": 302, "p3": 180, "p4": 332, "p5": 250}
TEST = {"p0": 51, "p1": 50, "p2": 143, "p3": 61, "p4": 144, "p5": 90}


def _run(out: Path, *, held: float, share_slope: float, seed: int) -> Path:
    """One fake finished run: share answers of CCVR jobs ``share_slope`` s per
    training example late, evaluation maskeds 1 ms per test example late, the rest
    jitter only."""
    rng = np.random.default_rng(seed)
    (out / "logs").mkdir(parents=True)
    (out / "participants").mkdir()
    (out / "coordinator" / "state").mkdir(parents=True)
    (out / "results.json").write_text("{}")
    for pid in TRAIN:
        (out / "logs" / f"{pid}.log").write_text(
            f"2026-11-26T05:53:55.059Z INFO {pid}: joined federation 58434cffb6decd3f as #0 "
            f"(digits slice 0/6: {TRAIN[pid]} train / {TEST[pid]} test)\n"
            f"2026-11-26T05:54:06.438Z INFO {pid}: round 1: trained 14 steps on "
            f"{TRAIN[pid]} samples in 10.7s\n"
        )
        (out / "participants" / f"{pid}.toml").write_text(
            f'[participant]\nparticipant_id = "{pid}"\n\n[policy]\nmin_local_work_s = {held}\n'
        )
    conn = sqlite3.connect(out / "coordinator" / "state" / "state.db")
    conn.executescript(SCHEMA)
    rows = []
    for job, purpose in (("u1", "update"), ("c1", "ccvr"), ("e1", "evaluate"), ("e2", "evaluate")):
        conn.execute(
            "INSERT INTO jobs (job_id, purpose, status, created, participants, threshold, "
            "vector_length, spec_sha256) VALUES (?, ?, 'done', 0, '[]', 4, 1, '')",
            (job, purpose),
        )
        for stage, kind in (("share", "SecAggSubmission"), ("masked", "MaskedChunk[0]")):
            for pid in TRAIN:
                late = 0.0
                if purpose == "ccvr" and stage == "share":
                    late = share_slope * TRAIN[pid]
                if purpose == "evaluate" and stage == "masked":
                    late = 1e-3 * TEST[pid]
                ts = 100.0 + late + float(rng.uniform(0, 0.01))
                rows.append((ts, pid, job, stage, kind, "accepted"))
    conn.executemany(
        "INSERT INTO audit (ts, sender, job, stage, kind, bytes, sha256, status) "
        "VALUES (?, ?, ?, ?, ?, 0, '', ?)",
        rows,
    )
    conn.commit()
    conn.close()
    return out


def test_measure_reports_each_kind_and_setting(tmp_path: Path) -> None:
    outs = [_run(tmp_path / f"a{k}", held=0.0, share_slope=1e-4, seed=k) for k in range(4)]
    outs += [_run(tmp_path / f"b{k}", held=5.0, share_slope=0.0, seed=9 + k) for k in range(4)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--measure", *map(str, outs), "--permutations", "2000"]) == 0
    report = json.loads(printed.getvalue())
    assert [r["samples"] for r in report["runs"]] == [TRAIN] * 8
    assert [r["test_samples"] for r in report["runs"]] == [TEST] * 8
    assert {r["min_local_work_s"] for r in report["runs"]} == {0.0, 5.0}
    settings = {s["min_local_work_s"]: s for s in report["by_setting"]}
    assert set(settings) == {0.0, 5.0}
    overlapped, held = settings[0.0]["by_job_kind"], settings[5.0]["by_job_kind"]
    assert set(overlapped) == {"ccvr", "evaluate", "update"}
    share = overlapped["ccvr"]["share"]
    assert (share["jobs"], share["points"]) == (4, 24)
    assert share["p_value"] < 0.01 and share["correlation"] > 0.5
    assert held["ccvr"]["share"]["p_value"] > 0.05
    for by_kind in (overlapped, held):  # against the test split, two jobs a run
        masked = by_kind["evaluate"]["masked"]
        assert (masked["jobs"], masked["points"]) == (8, 48)
        assert masked["p_value"] < 0.01
        assert masked["ms_per_100_examples"] > 50  # 100 ms planted per 100 test examples
    assert held["update"]["masked"]["p_value"] > 0.05
    assert set(report["pooled"]["correlation_with_example_count"]) == {
        "advertise",
        "share",
        "masked",
    }  # the update-job keys docs/threat_model.md cites


@pytest.mark.long
def test_the_bench_runs_a_federation_under_the_setting_it_names(tmp_path: Path) -> None:
    """One small federation (3 sites, 1 round, FFC only) with ``--min-local-work-s``:
    the setting reaches the participant processes (each logs its FFC job's keys as
    shared *before* the local work, the strict order, not the overlap) and every job
    kind is measured."""
    printed = io.StringIO()
    argv = ["--participants", "3", "--rounds", "1", "--calibration", "ffc"]
    argv += ["--min-local-work-s", "0.5", "--keep", str(tmp_path), "--permutations", "200"]
    with contextlib.redirect_stdout(printed):
        code = main(argv)
    report = json.loads(printed.getvalue())
    assert code == 0, report["runs"]
    (run,) = report["runs"]
    assert run["min_local_work_s"] == 0.5 and run["status"] in ("completed", "degraded")
    assert set(run["by_job_kind"]) >= {"update", "ffc", "evaluate"}
    assert report["by_setting"][0]["by_job_kind"]["ffc"]["share"]["points"] == 3
    logs = [p.read_text() for p in (Path(run["out"]) / "logs").glob("p*.log")]
    assert len(logs) == 3
    for log in logs:
        assert "ffc statistics" in log and "shared keys before the local work" in log
        assert "shared keys while the local work runs" not in log
