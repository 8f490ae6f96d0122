"""The coordinator SIGKILLed between rounds and restarted resumes from its last
checkpoint — and, with plaintext aggregation, still reproduces the reference runner
to the last bit (the resumed rounds use the same seeds, selection and sum order).

The federation runs FedYogi: its server optimiser carries moments ``m``, ``v`` from
round to round, so the bit-exact match after the restart also proves that they were
checkpointed and restored with the model (FedAvg would not notice their loss)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from spherecal.simulate import Simulation, SimulationSettings
from spherecal.spherefed.reference import ReferenceConfig, run_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REFERENCE = ReferenceConfig(
    participants=3, model="mlp", rounds=3, algorithm="fedyogi", fedopt_lr=0.02
)


def _completed_rounds(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            row = conn.execute("SELECT count(*) FROM rounds WHERE status='completed'").fetchone()
        return int(row[0])
    except sqlite3.Error:
        return 0


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("restart")
    settings = SimulationSettings(
        reference=REFERENCE,
        out=out,
        calibration=("ffc", "ccvr"),
        secure_updates=False,
        secure_statistics=False,
        timeout_s=240,
        example_count_noise_sd=0,  # the reference weights by the exact counts
    )
    t0 = time.monotonic()
    with Simulation(settings) as sim:
        port = sim.start_coordinator()
        sim.start_participants()
        db = out / "coordinator" / "state" / "state.db"
        deadline = time.monotonic() + 180
        while _completed_rounds(db) < 1:
            assert time.monotonic() < deadline, "round 1 never completed"
            time.sleep(0.05)
        sim.kill_coordinator()  # SIGKILL: no summary, no goodbye
        killed_after = _completed_rounds(db)
        sim.start_coordinator(listen=f"127.0.0.1:{port}")
        sim.wait_coordinator(settings.timeout_s)
        results = dict[str, Any](sim.results(sim.wait_participants(), time.monotonic() - t0))
    results["killed_after"] = killed_after
    return results


def test_restarted_coordinator_resumes_from_the_last_completed_round(
    restarted: dict[str, Any],
) -> None:
    assert restarted["status"] == "completed", restarted["errors"]
    assert restarted["coordinator_starts"] == 2
    assert restarted["resumed_after_round"] == restarted["killed_after"] >= 1
    assert [r["round"] for r in restarted["per_round"]] == [1, 2, 3]
    # Participants rode through the outage: they reconnected and rejoined.
    failed = {p: c for p, c in restarted["exit_codes"].items() if c != 0}
    assert not failed, _log_tails(Path(restarted["logs"]), failed)


def _log_tails(logs: Path, failed: dict[str, int | None]) -> str:
    """The end of each failed participant's log (faulthandler writes tracebacks
    there when a process dies on a signal), so a CI failure says why."""
    parts = [f"participants exited non-zero: {failed}"]
    for pid in failed:
        log = logs / f"{pid}.log"
        text = log.read_text(errors="replace") if log.exists() else "(no log)"
        parts.append(f"--- {pid}.log (tail) ---\n{text[-4000:]}")
    return "\n".join(parts)


def test_resumed_plaintext_run_equals_the_reference_exactly(restarted: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    reference = run_reference(REFERENCE)
    for name in ("none", "ffc", "ccvr"):
        assert restarted["accuracy"][name] == reference["accuracy"][name]
    for ours, theirs in zip(restarted["per_round"], reference["per_round"], strict=True):
        assert ours["train_loss"] == theirs["train_loss"]
        assert ours["test_accuracy"] == theirs["test_accuracy"]
