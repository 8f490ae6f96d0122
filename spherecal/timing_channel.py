"""When each participant sent each secure-aggregation message, from the coordinator's
audit table: the measurement behind issue #9's timing channel (``docs/threat_model.md``,
"Timing"). Used by ``bench/timing_channel.py`` and the malicious-participant
integration test, so both read the audit table the same way.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["MESSAGES", "message_offsets"]

MESSAGES = {  # audit (stage, kind) of each message whose timing is measured
    "advertise": ("advertise", "SecAggSubmission"),
    "share": ("share", "SecAggSubmission"),
    "masked": ("masked", "MaskedChunk[0]"),
}


def message_offsets(
    db: Path, stage: str, kind: str, *, purpose: str = "update"
) -> dict[str, list[float]]:
    """Per job of ``purpose``: seconds from the job's first accepted ``stage`` message
    to each sender's, by sender (the coordinator's clock, ``state.db``'s audit table)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT a.job, a.sender, a.ts FROM audit a JOIN jobs j ON a.job = j.job_id "
            "WHERE a.stage = ? AND a.kind = ? AND a.status = 'accepted' "
            "AND j.purpose = ? ORDER BY a.ts",
            (stage, kind, purpose),
        ).fetchall()
    finally:
        conn.close()
    jobs: dict[str, dict[str, float]] = {}
    for job, sender, ts in rows:
        jobs.setdefault(job, {}).setdefault(sender, ts)
    out: dict[str, list[float]] = {}
    for senders in jobs.values():
        start = min(senders.values())
        for sender, ts in senders.items():
            out.setdefault(sender, []).append(ts - start)
    return out
