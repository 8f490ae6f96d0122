"""The timing-channel analysis (``spherecal.timing_channel``) on synthetic audit rows
with a known answer: a planted dependence of offsets on example counts is found, none
is reported where none is planted, the permutation p-value matches an exact
enumeration, and differences *between* jobs (the machine's load) are not mistaken
for a dependence within them. No simulation here (``bench/timing_channel.py`` runs
those)."""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from spherecal.coordinator.state.schema import SCHEMA
from spherecal.timing_channel import (
    JOB_MESSAGES,
    MESSAGES,
    Job,
    associate,
    bootstrap_interval,
    job_offsets,
    job_purposes,
    jobs_of,
    message_offsets,
    permutation_p_value,
    within_job_correlation,
    within_job_slope,
)


def _jobs(
    rng: np.random.Generator, *, n_jobs: int, sites: int, slope: float, noise: float = 0.05
) -> list[Job]:
    """Jobs whose offsets are ``slope`` s per example plus uniform jitter, each job's
    counts drawn anew and each job shifted by a random load offset."""
    jobs = []
    for _ in range(n_jobs):
        counts = rng.integers(100, 400, size=sites).astype(float)
        offsets = rng.uniform(0, 1) + slope * counts + rng.uniform(0, noise, size=sites)
        jobs.append((counts, offsets))
    return jobs


def test_the_within_job_correlation_is_the_pearson_correlation_of_centred_points() -> None:
    rng = np.random.default_rng(1)
    jobs = _jobs(rng, n_jobs=4, sites=6, slope=1e-4)
    x = np.concatenate([c - c.mean() for c, _ in jobs])
    y = np.concatenate([o - o.mean() for _, o in jobs])
    # centred data: Pearson through the origin equals np.corrcoef's (which re-centres
    # the already zero-mean concatenation)
    assert within_job_correlation(jobs) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    assert within_job_slope(jobs) == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-9)


def test_a_planted_dependence_is_found() -> None:
    rng = np.random.default_rng(2)
    # 1 ms per 10 examples: a 300-example spread moves a site by 30 ms, in 20 ms jitter
    found = associate(_jobs(rng, n_jobs=8, sites=6, slope=1e-4, noise=0.02), permutations=2000)
    assert found.correlation > 0.5 and found.rank_correlation > 0.5
    assert found.p_value < 0.01 and found.rank_p_value < 0.01
    assert found.interval_95 is not None and found.interval_95[0] > 0
    assert found.ms_per_100_examples == pytest.approx(10.0, rel=0.35)
    assert (found.jobs, found.points) == (8, 48)
    assert "rise" in found.note


def test_a_negative_dependence_is_found_too() -> None:
    found = associate(_jobs(np.random.default_rng(3), n_jobs=8, sites=6, slope=-1e-4, noise=0.02))
    assert found.correlation < -0.5 and found.p_value < 0.01 and "fall" in found.note


def test_none_is_reported_where_none_is_planted() -> None:
    rng = np.random.default_rng(4)
    found = associate(_jobs(rng, n_jobs=8, sites=6, slope=0.0), permutations=2000)
    assert found.p_value > 0.05
    assert "no evidence" in found.note
    assert found.interval_95 is not None and found.interval_95[0] < 0 < found.interval_95[1]


def test_the_permutation_test_is_calibrated_under_the_null() -> None:
    """Over many datasets without a dependence, p < 0.05 about 5 % of the time (a
    test that rejected too often would report leaks that are not there)."""
    rng = np.random.default_rng(5)
    p = [
        permutation_p_value(_jobs(rng, n_jobs=3, sites=5, slope=0.0), permutations=400, seed=k)
        for k in range(300)
    ]
    rejected = float(np.mean(np.array(p) < 0.05))
    assert 0.01 <= rejected <= 0.10, rejected


def test_the_p_value_matches_an_exact_enumeration() -> None:
    counts = np.array([120.0, 150, 210, 260, 300, 390])
    offsets = np.array([0.02, 0.00, 0.05, 0.03, 0.09, 0.07])
    observed = abs(within_job_correlation([(counts, offsets)]))
    hits = sum(
        abs(within_job_correlation([(np.array(p), offsets)])) >= observed - 1e-12
        for p in itertools.permutations(counts)
    )
    exact = hits / 720
    estimated = permutation_p_value([(counts, offsets)], permutations=40_000)
    assert estimated == pytest.approx(exact, abs=0.01)
    assert 0.01 < exact < 0.5  # a case that is neither trivial nor certain


def test_differences_between_jobs_are_not_a_dependence_within_them() -> None:
    """Runs under more load have later offsets *and*, by chance, larger sites: the
    raw pooled correlation is high, the within-job one is not."""
    rng = np.random.default_rng(6)
    jobs = []
    for k in range(6):
        counts = 100.0 * (k + 1) + rng.permutation(np.arange(5.0))
        offsets = 0.5 * k + rng.uniform(0, 0.05, size=5)  # the job's load, not its sites
        jobs.append((counts, offsets))
    raw = np.corrcoef(np.concatenate([c for c, _ in jobs]), np.concatenate([o for _, o in jobs]))
    assert raw[0, 1] > 0.9
    assert permutation_p_value(jobs, permutations=2000) > 0.05


def test_the_rank_form_is_spearmans_within_a_job() -> None:
    rng = np.random.default_rng(8)
    counts, offsets = rng.integers(10, 400, size=9).astype(float), rng.uniform(0, 1, size=9)
    expected = stats.spearmanr(counts, offsets).statistic
    assert within_job_correlation([(counts, offsets)], ranks=True) == pytest.approx(expected)


def test_one_loaded_job_alone_is_not_called_a_trend() -> None:
    """Eleven jobs without a dependence and one whose offsets spread a hundredfold
    wider in step with its counts (a burst of load that happened to follow them): the
    values' p-value is small, the ranks' is not, and the note says so."""
    rng = np.random.default_rng(9)
    jobs = _jobs(rng, n_jobs=11, sites=6, slope=0.0, noise=0.02)
    counts = np.array([50.0, 100, 150, 200, 250, 300])
    jobs.append((counts, counts * 1e-2))
    found = associate(jobs, permutations=2000)
    assert found.p_value < 0.01
    assert found.rank_p_value > 0.05
    assert "on the values only" in found.note


def test_few_points_are_flagged_whatever_the_p_value() -> None:
    counts = np.array([100.0, 200, 300, 400, 500])
    found = associate([(counts, counts * 1e-3)])
    assert found.correlation == pytest.approx(1.0)
    assert found.points == 5 and "too few" in found.note
    assert found.interval_95 is None  # one job: no spread to resample
    assert found.to_json()["interval_95"] is None


def test_degenerate_jobs() -> None:
    flat = (np.array([100.0, 200, 300]), np.zeros(3))
    assert within_job_correlation([flat]) == 0.0
    assert permutation_p_value([flat]) == 1.0
    alone = (np.array([100.0]), np.array([0.3]))  # a job with one site says nothing
    assert associate([alone]).points == 0
    assert bootstrap_interval([flat, flat]) is None
    with pytest.raises(ValueError, match="one count per offset"):
        within_job_correlation([(np.array([1.0, 2.0]), np.array([0.1, 0.2, 0.3]))])


# ---------------------------------------------------------------- the audit table


def _audit_db(path: Path, rows: list[tuple[float, str, str, str, str, str]]) -> Path:
    """A coordinator database (the real schema) with jobs and audit rows
    (ts, sender, job, stage, kind, status); a job's purpose is its id's prefix."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    for job in sorted({r[2] for r in rows}):
        conn.execute(
            "INSERT INTO jobs (job_id, purpose, status, created, participants, threshold, "
            "vector_length, spec_sha256) VALUES (?, ?, 'done', 0, '[]', 2, 1, '')",
            (job, job.split("-")[0]),
        )
    conn.executemany(
        "INSERT INTO audit (ts, sender, job, stage, kind, bytes, sha256, status) "
        "VALUES (?, ?, ?, ?, ?, 0, '', ?)",
        rows,
    )
    conn.commit()
    conn.close()
    return path


def test_offsets_come_from_each_senders_first_accepted_message(tmp_path: Path) -> None:
    adv = "SecAggSubmission"
    db = _audit_db(
        tmp_path / "state.db",
        [
            (100.0, "p0", "ffc-1", "advertise", adv, "accepted"),
            (100.5, "p1", "ffc-1", "advertise", adv, "accepted"),
            (100.7, "p1", "ffc-1", "advertise", adv, "accepted"),  # a repeat: not its first
            (99.0, "p2", "ffc-1", "advertise", adv, "rejected"),  # never counted
            (101.0, "p2", "ffc-1", "advertise", adv, "accepted"),
            (50.0, "p0", "update-1", "advertise", adv, "accepted"),
            (50.2, "p1", "update-1", "advertise", adv, "accepted"),
            (102.0, "p0", "ffc-1", "masked", "MaskedChunk[0]", "accepted"),
        ],
    )
    assert job_offsets(db, "advertise", adv, purpose="ffc") == {
        "ffc-1": {"p0": 0.0, "p1": 0.5, "p2": 1.0}
    }
    assert message_offsets(db, "advertise", adv) == {"p0": [0.0], "p1": [pytest.approx(0.2)]}
    assert job_purposes(db) == ["ffc", "update"]
    assert set(MESSAGES) < set(JOB_MESSAGES)


#: Run in a child process: the database in WAL mode (as the coordinator keeps it), one
#: more accepted message committed, then the process dies without closing — its row
#: is in state.db-wal alone, as a killed coordinator leaves a run's directory.
KILLED = r"""
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode=WAL")
conn.execute(
    "INSERT INTO audit (ts, sender, job, stage, kind, bytes, sha256, status) "
    "VALUES (100.9, 'p3', 'ffc-1', 'advertise', 'SecAggSubmission', 0, '', 'accepted')"
)
os._exit(0)
"""


def _listing(directory: Path) -> dict[str, str]:
    """Every file in ``directory`` by name, with its content's SHA-256."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_reading_a_killed_coordinators_wal_changes_no_file(tmp_path: Path) -> None:
    """``bench/timing_channel.py --measure KEPT`` re-reads a kept run's database. A
    plain connection recovered a killed coordinator's WAL and, closing, checkpointed it
    into ``state.db`` and deleted ``state.db-wal``/``-shm``: the run kept for a
    second look was changed by the first. Its rows are read; no file changes."""
    adv = "SecAggSubmission"
    db = _audit_db(
        tmp_path / "state.db",
        [
            (100.0, "p0", "ffc-1", "advertise", adv, "accepted"),
            (100.5, "p1", "ffc-1", "advertise", adv, "accepted"),
        ],
    )
    done = subprocess.run([sys.executable, "-c", KILLED, str(db)], timeout=120, check=False)
    assert done.returncode == 0
    before = _listing(tmp_path)
    assert {"state.db-wal", "state.db-shm"} <= set(before), before
    assert job_offsets(db, "advertise", adv, purpose="ffc") == {
        "ffc-1": {"p0": 0.0, "p1": 0.5, "p3": pytest.approx(0.9)}  # p3: the WAL's row
    }
    assert job_purposes(db) == ["ffc"]
    assert _listing(tmp_path) == before


def test_a_planted_dependence_in_audit_rows_is_found_end_to_end(tmp_path: Path) -> None:
    """Share answers planted 1 ms per 10 examples late in CCVR jobs, none in FFC jobs:
    the analysis finds the first and not the second."""
    rng = np.random.default_rng(7)
    counts = {f"p{k}": 100 + 60 * k for k in range(6)}
    rows = []
    for j in range(8):
        for purpose, slope in (("ccvr", 1e-4), ("ffc", 0.0)):
            start = 1000.0 * j
            for pid, count in counts.items():
                ts = start + slope * count + float(rng.uniform(0, 0.05))
                rows.append((ts, pid, f"{purpose}-{j}", "share", "SecAggSubmission", "accepted"))
    db = _audit_db(tmp_path / "state.db", rows)
    for purpose, planted in (("ccvr", True), ("ffc", False)):
        jobs = jobs_of(job_offsets(db, "share", "SecAggSubmission", purpose=purpose), counts)
        found = associate(jobs, permutations=2000)
        assert (found.jobs, found.points) == (8, 48)
        assert (found.p_value < 0.01) is planted, (purpose, found)
        assert (found.p_value > 0.05) is not planted, (purpose, found)


def test_senders_without_a_known_count_are_left_out() -> None:
    jobs = jobs_of({"j": {"p0": 0.0, "p1": 0.2, "px": 0.4}}, {"p0": 100, "p1": 300})
    assert len(jobs) == 1
    np.testing.assert_array_equal(jobs[0][0], [100.0, 300.0])
    np.testing.assert_array_equal(jobs[0][1], [0.0, 0.2])
