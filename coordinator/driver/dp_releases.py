"""The coordinator's side of noisy (differentially private) calibration releases.

Per statistics job it plans the release from public inputs only
(:func:`spherecal.spherefed.privacy.plan.plan_calibration_release`: kind, l, C, the job's ``n``
and guaranteed contributor count ``t``, the configured ε, δ, mechanism, quantisation,
colluders and the public bound ``max_examples``), hands the participants the same
inputs (:class:`spherecal.proto.spherecal_pb2.DPRelease`) so each can re-plan and verify, and
fixes the job spec's scale, bound and noise bound from the plan.

It also records distributed DP-SGD steps (:meth:`CoordinatorPrivacy.record_dpsgd_step`, issue #25):
the object exists whenever ``[privacy] enabled`` or ``updates = "distributed"``.

Recording is idempotent per job, because a restarted coordinator replays a round
whose sum was journaled but not yet checkpointed (``coordinator.state.job_journal``):
a (subject, release) already in the ledger is not charged again, and each DP-SGD
step's summary is written to a ``dpsgd_steps`` table of the same database after its
ledger rows, so a replay of a recorded step returns the stored summary and a replay
of a half-recorded one completes it — each step charged exactly once, and
``dpsgd_steps`` in the results whole across restarts.

After the job it records what the release *actually* cost — from the aggregate's
real contributor count — in the coordinator's ledger (a ``privacy_ledger`` table in
its own SQLite database): once against ``"federation"`` and, mirroring what each
contributor charged locally (the planned worst case of ``t`` contributors), once per
contributor. The FFC solve gets a ridge ``≈ 2√l·σ`` so the noise cannot make the
regularised Gram matrix indefinite.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from pathlib import Path
from typing import Any

from spherecal.coordinator.summary_schema import PrivacySummary
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.privacy.charge import PrivacyCharge
from spherecal.spherefed.privacy.distributed_dpsgd import DistributedDpsgdPlan
from spherecal.spherefed.privacy.ledger import (
    DuplicateRelease,
    LedgerEntry,
    PrivacyLedger,
    SqliteLedgerStore,
)
from spherecal.spherefed.privacy.plan import CalibrationPlan, plan_calibration_release
from spherecal.spherefed.privacy.settings import PrivacySettings

__all__ = ["FEDERATION", "PRIVACY_REFUSALS", "CoordinatorPrivacy"]

FEDERATION = "federation"
PRIVACY_REFUSALS: frozenset[pb.FailureKind] = frozenset({pb.POLICY_REFUSAL, pb.BUDGET_EXCEEDED})
"""The ``FailureReport`` kinds that are a participant refusing a DP release (its
own policy or its budget) rather than an ordinary dropout."""


class CoordinatorPrivacy:
    """Plans, ledger and summary of a federation's DP releases."""

    def __init__(self, settings: PrivacySettings, db_path: Path) -> None:
        self.settings = settings
        self._conn = sqlite3.connect(db_path, check_same_thread=False, timeout=60.0)
        self._lock = threading.Lock()
        self.ledger = PrivacyLedger(SqliteLedgerStore(self._conn), settings.budget())
        self.releases: list[dict[str, Any]] = []
        self.refusals: list[dict[str, Any]] = []
        with self._conn:
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS dpsgd_steps ("
                " job_id TEXT PRIMARY KEY, round INTEGER NOT NULL, summary_json TEXT NOT NULL)"
            )
        #: distributed DP-SGD steps (:meth:`CoordinatorPrivacy.record_dpsgd_step`),
        #: those recorded before a restart included
        self.dpsgd_steps: list[dict[str, Any]] = [
            json.loads(row[0])
            for row in self._conn.execute(
                "SELECT summary_json FROM dpsgd_steps ORDER BY round, rowid"
            ).fetchall()
        ]
        self._refused: dict[tuple[str, str], pb.FailureKind] = {}

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def plan(self, kind: str, *, dim: int, num_classes: int, n: int, t: int) -> CalibrationPlan:
        """Plan one release (raises ``ValueError``/``crypto.SecAggError`` subclasses
        such as ``RingOverflowRisk`` when it cannot be done safely)."""
        s = self.settings
        return plan_calibration_release(
            kind,
            dim=dim,
            num_classes=num_classes,
            participants=n,
            min_contributors=t,
            epsilon_target=s.release_epsilon,
            delta=s.delta,
            max_examples=s.max_examples,
            mechanism=s.mechanism,
            quant_bits=s.quant_bits,
            colluders=s.colluders,
        )

    def release_message(self, plan: CalibrationPlan) -> pb.DPRelease:
        s = self.settings
        return pb.DPRelease(
            kind=plan.kind,
            dim=plan.dim,
            num_classes=plan.num_classes,
            participants=plan.noise.participants,
            min_contributors=plan.noise.min_contributors,
            max_examples=s.max_examples,
            epsilon=plan.target_epsilon,
            delta=plan.delta,
            mechanism=plan.mechanism,
            quant_bits=plan.quant_bits,
            colluders=plan.noise.colluders,
        )

    def _record_once(self, subject: str, charge: PrivacyCharge, release_id: str) -> LedgerEntry:
        """Record ``charge`` unless this (subject, release) is already in the ledger
        (a replay after a restart); the ledger's entry either way. Call with the lock."""
        try:
            return self.ledger.record(subject, charge, release_id=release_id)
        except DuplicateRelease:
            return next(
                e for e in self.ledger.store.entries(subject) if e.release_id == release_id
            )

    def record(
        self, job_hex: str, plan: CalibrationPlan, contributors: list[str]
    ) -> dict[str, Any]:
        """Charge a finished release; return its summary (also kept for the results)."""
        charge = plan.charge(len(contributors))
        with self._lock:
            entry = self._record_once(FEDERATION, charge, job_hex)
            mirrored = plan.charge(plan.noise.min_contributors)
            for pid in contributors:
                self._record_once(pid, mirrored, job_hex)
        sigma = float(charge.noise["stddev_real_units"])
        summary = {
            "job_id": job_hex,
            "kind": plan.kind,
            "mechanism": plan.mechanism,
            "target_epsilon": plan.target_epsilon,
            "planned_epsilon": plan.planned_epsilon,
            "epsilon": charge.epsilon,
            "delta": plan.delta,
            "contributors": len(contributors),
            "min_contributors": plan.noise.min_contributors,
            "noise": charge.noise,
            "stddev_real_units": sigma,
            "federation_epsilon_total": entry.epsilon_total,
        }
        self.releases.append(summary)
        return summary

    @staticmethod
    def ridge(plan: CalibrationPlan, sigma: float, *, summed_blocks: int = 1) -> float:
        """``2√l·σ_V``: the spectral norm of an ``l×l`` symmetric noise matrix with
        entry deviation ``σ_V`` is about ``2√l·σ_V``; a ridge that large keeps
        ``V + λI`` positive definite. ``summed_blocks`` noisy blocks added together
        (FFC derived from CCVR sums ``C`` class blocks) multiply ``σ_V`` by their root."""
        return 2.0 * math.sqrt(plan.dim) * sigma * math.sqrt(summed_blocks)

    def record_refusal(self, job_hex: str, participant: str, failure: pb.FailureKind) -> None:
        """A participant's typed ``FailureReport`` said it refused this job's release."""
        with self._lock:
            self._refused[(job_hex, participant)] = failure

    def note_refusals(self, job_hex: str, kind: str, dropped: dict[str, str]) -> list[str]:
        """Keep the privacy refusals among a job's dropouts (those whose report was
        typed a refusal — never guessed from the text); return them as log lines."""
        lines = []
        for pid, reason in sorted(dropped.items()):
            with self._lock:
                failure = self._refused.pop((job_hex, pid), None)
            if failure is not None:
                self.refusals.append(
                    {
                        "participant": pid,
                        "job_id": job_hex,
                        "kind": kind,
                        "refusal": pb.FailureKind.Name(failure),
                        "reason": reason,
                    }
                )
                lines.append(f"{kind}: {pid} refused the DP release: {reason}")
        return lines

    def record_dpsgd_step(
        self,
        *,
        job_hex: str,
        round_index: int,
        plan: DistributedDpsgdPlan,
        length: int,
        contributors: list[str],
    ) -> dict[str, Any]:
        """Charge one distributed DP-SGD step (issue #25): against ``"federation"`` at
        the real contributor count (more contributors, more noise) and, mirroring what
        each site charged before the step, at the planned worst case of ``t`` against
        every contributor. Returns the step's summary (kept for the results).

        Idempotent (module docstring): a step already recorded — the same job replayed
        after a restart — returns its stored summary and charges nothing."""
        with self._lock:
            row = self._conn.execute(
                "SELECT summary_json FROM dpsgd_steps WHERE job_id = ?", (job_hex,)
            ).fetchone()
        if row is not None:
            return {**json.loads(row[0]), "replayed": True}
        delta = self.settings.delta
        charge = plan.charge(1, delta, contributors=len(contributors))
        release = f"dpsgd-{job_hex}"
        with self._lock:
            entry = self._record_once(FEDERATION, charge, release)
            mirrored = plan.charge(1, delta)
            for pid in contributors:
                self._record_once(pid, mirrored, release)
        noise = plan.ring_noise(length, max(len(contributors), plan.min_contributors))
        summary = {
            "job_id": job_hex,
            "round": round_index + 1,
            "noise_multiplier": plan.noise_multiplier,
            "realised_noise_multiplier": plan.realised_multiplier(len(contributors)),
            "sample_rate": plan.sample_rate,
            "max_grad_norm": plan.max_grad_norm,
            "sensitivity": plan.sensitivity(length),
            "mechanism": plan.mechanism,
            "contributors": len(contributors),
            "min_contributors": plan.min_contributors,
            "participant_variance_ring": noise.participant_variance,
            "planned_epsilon": mirrored.epsilon,
            "epsilon": charge.epsilon,
            "delta": delta,
            "federation_epsilon_total": entry.epsilon_total,
        }
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT INTO dpsgd_steps (job_id, round, summary_json) VALUES (?, ?, ?)",
                (job_hex, round_index, json.dumps(summary, sort_keys=True)),
            )
            self.dpsgd_steps.append(summary)
        return summary

    def summary(self) -> PrivacySummary:
        s = self.settings
        with self._lock:
            report = self.ledger.report()
        subjects = report["subjects"]
        return {
            # DP calibration releases; ``updates`` says whether training was DP-SGD
            "enabled": s.enabled,
            "updates": s.updates,
            "mechanism": s.mechanism,
            "epsilon_per_release": s.epsilon,
            "total_epsilon": s.total_epsilon,
            "delta": s.delta,
            "max_examples": s.max_examples,
            "quant_bits": s.quant_bits,
            "colluders": s.colluders,
            "releases": list(self.releases),
            "refusals": list(self.refusals),
            "dpsgd_steps": list(self.dpsgd_steps),
            "totals": {
                "federation": subjects.get(FEDERATION, {}).get("epsilon", 0.0),
                "participants": {
                    k: v["epsilon"] for k, v in sorted(subjects.items()) if k != FEDERATION
                },
            },
            "ledger": report,
        }
