"""The participant's privacy gate for noisy calibration releases.

A participant does not take the coordinator's word for the noise: from the job's
public inputs (:class:`spherecal.proto.spherecal_pb2.DPRelease` — kind, l, C, n, t, the bound on
examples, ε, δ, mechanism, quantisation, colluders) it plans the release itself
(:func:`spherecal.spherefed.privacy.plan.plan_calibration_release`), checks that the job spec
the coordinator signed carries that plan (length, scale, bound, noise bound, enough
guaranteed contributors — :func:`spherecal.crypto.dp.verify_plan`), and charges the release
to its **own** ledger in its state directory *before* computing anything. A release
that would exceed its budget is refused with the numbers (:class:`BudgetExceeded`),
and the coordinator is told why.

The charge uses the planned worst case (exactly ``t`` contributors), so the local
ledger never under-counts whatever the dropouts turn out to be.

The gate never looks at how many examples the site holds. A site above the job's
public bound ``max_examples`` releases statistics of a uniformly random
``max_examples`` of them (:func:`spherecal.participant.trainer.random_subset`), so the
plan's bounds hold for what it sends; refusing instead would answer, un-noised and
free of any charge, "more than this bound", and a coordinator may ask again with
another bound — a binary search for the count.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from spherecal.crypto import JobSpec, SecAggError
from spherecal.crypto.dp import NoisePlan, guaranteed_contributors, verify_plan
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.privacy.charge import PrivacyCharge
from spherecal.spherefed.privacy.ledger import (
    BudgetExceeded,
    LedgerEntry,
    PrivacyBudget,
    PrivacyLedger,
    SqliteLedgerStore,
)
from spherecal.spherefed.privacy.plan import CalibrationPlan, plan_calibration_release
from spherecal.spherefed.privacy.settings import PrivacySettings

__all__ = [
    "BudgetExceeded",
    "NoiseRequired",
    "ParticipantPrivacy",
    "PlaintextRefused",
    "PrivacyRefused",
]


class PrivacyRefused(Exception):
    """A task this participant's privacy policy does not allow (here: a DP plan it
    does not accept; subclasses name the other rules)."""


class NoiseRequired(PrivacyRefused):
    """Calibration statistics without DP noise, or not securely aggregated, while this
    participant's ``[privacy] enabled`` demands it."""


class PlaintextRefused(PrivacyRefused, PermissionError):
    """A plaintext upload or report while ``allow_plaintext`` is false."""


_ADMISSIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS site_dp_statistics (
    participant TEXT NOT NULL,
    federation  TEXT NOT NULL,
    scope       TEXT NOT NULL,
    kind        TEXT NOT NULL,
    epsilon     REAL NOT NULL,
    admitted    INTEGER NOT NULL,
    at          REAL NOT NULL,
    PRIMARY KEY (participant, federation, scope)
)"""
"""Each federation's one comparison of a DP statistics release with the site's budget
(:meth:`ParticipantPrivacy._admit_once`)."""


_STEP_TERMS_SCHEMA = """
CREATE TABLE IF NOT EXISTS site_dpsgd_terms (
    participant TEXT NOT NULL,
    federation  TEXT NOT NULL,
    terms       BLOB NOT NULL,
    admitted    INTEGER,
    at          REAL NOT NULL,
    PRIMARY KEY (participant, federation)
)"""
"""Each federation's distributed DP-SGD step terms and its one budget answer
(:meth:`ParticipantPrivacy.charge_plan_step`)."""


class ParticipantPrivacy:
    """Policy + local ledger (``state_dir/privacy.db``) of one participant."""

    def __init__(self, settings: PrivacySettings, participant_id: str, state_dir: Path) -> None:
        self.settings = settings
        self.pid = participant_id
        self.path = state_dir / "privacy.db"
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ ledger
    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, check_same_thread=False)
        return self._conn

    def ledger(self, delta: float) -> PrivacyLedger:
        """The local ledger under this participant's budget (or, with privacy not
        enabled locally and no distributed DP-SGD demanded, an unlimited one at the
        job's δ — still recorded)."""
        s = self.settings
        budget = s.budget() if s.enabled or s.distributed_updates else PrivacyBudget(delta=delta)
        return PrivacyLedger(SqliteLedgerStore(self._connection()), budget)

    def charge(self, charge: PrivacyCharge, *, delta: float, release_id: str) -> dict[str, Any]:
        """Charge one release to this site's ledger (raises :class:`BudgetExceeded`);
        a release already charged (a held job taken up after this site's restart,
        issue #20) is returned as it was, never charged twice."""
        with self._lock:
            ledger = self.ledger(delta)
            return _charge_once(ledger, self.pid, charge, release_id).to_json()

    def charge_plan_step(
        self,
        federation: str,
        terms: bytes,
        *,
        each: PrivacyCharge,
        whole: PrivacyCharge,
        delta: float,
        release_id: str,
        own_prefix: str,
    ) -> dict[str, Any]:
        """Admit one step of a federation's plan of steps all or none, then charge it
        once (``spherecal.participant.distributed_dpsgd.admit_step`` says why): the
        federation's steps keep the terms of its first (another is refused without
        comparing), ``whole`` beside what was spent outside ``own_prefix`` must fit
        the budget, and a refusal is kept for the rest of the federation."""
        with self._lock:
            conn = self._connection()
            conn.execute(_STEP_TERMS_SCHEMA)
            row = conn.execute(
                "SELECT terms, admitted FROM site_dpsgd_terms WHERE participant = ? AND "
                "federation = ?",
                (self.pid, federation),
            ).fetchone()
            if row is not None and bytes(row[0]) != terms:
                raise PrivacyRefused(
                    "this federation's distributed DP-SGD steps were put to this site's "
                    "budget with other parameters (σ, q, C, colluders, δ, max_examples); "
                    "a step of other parameters is not compared with it in this federation"
                )
            if row is not None and row[1] is not None and not row[1]:
                raise PrivacyRefused(
                    "this federation's distributed DP-SGD steps were refused: the plan's "
                    "rounds would exceed this site's budget; they are not compared again "
                    "in this federation"
                )
            ledger = self.ledger(delta)
            try:
                ledger.check_plan(self.pid, each, whole, own_prefix=own_prefix)
            except BudgetExceeded:
                self._keep_step_terms(federation, terms, admitted=False)
                raise
            self._keep_step_terms(federation, terms, admitted=True)
            return _charge_once(ledger, self.pid, each, release_id).to_json()

    def _keep_step_terms(self, federation: str, terms: bytes, *, admitted: bool) -> None:
        conn = self._connection()
        with conn:
            conn.execute(
                "INSERT OR REPLACE INTO site_dpsgd_terms (participant, federation, terms, "
                "admitted, at) VALUES (?, ?, ?, ?, ?)",
                (self.pid, federation, terms, int(admitted), time.time()),
            )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ------------------------------------------------------------ gate
    def require_noise(self, task: pb.StatisticsTask) -> None:
        """Refuse statistics without DP noise when this participant demands it."""
        if not self.settings.enabled:
            return
        if not task.HasField("privacy"):
            raise NoiseRequired(
                "this participant releases calibration statistics only with DP noise "
                "([privacy] enabled); the job carries no DP plan"
            )
        if not task.HasField("secure"):
            raise NoiseRequired("a DP release must be securely aggregated (noise before masking)")

    def admit(
        self,
        job_id: str,
        release: pb.DPRelease,
        spec: JobSpec,
        *,
        dim: int,
        num_classes: int,
        federation: str,
        per_kind: bool = False,
    ) -> tuple[CalibrationPlan, NoisePlan, dict[str, Any]]:
        """Plan, verify and charge one release; return (plan, noise plan, ledger entry).

        Raises :class:`PrivacyRefused` (the job does not match this participant's plan
        or policy) or :class:`BudgetExceeded` (with its numbers) — never because of the
        site's example count. Whether the site holds more than ``max_examples`` is a
        fact about its data: a refusal would tell it to the coordinator un-noised and
        without a charge, and the coordinator could ask again with another bound until
        a binary search gives the exact count. A site above the bound computes the
        release over a random ``max_examples`` of its examples instead
        (``LocalTrainer.private_statistics``): what it sends stays within the plan's
        value bound, and each example in it moves it by at most the plan's
        sensitivity (``docs/privacy.md`` states what this costs above the bound)."""
        s = self.settings
        if release.kind not in ("ffc", "ccvr"):
            raise PrivacyRefused(f"unknown release kind {release.kind!r}")
        if (release.dim, release.num_classes) != (dim, num_classes):
            raise PrivacyRefused(
                f"the job declares l={release.dim}, C={release.num_classes}; this model has "
                f"l={dim}, C={num_classes}"
            )
        if release.participants != spec.n:
            raise PrivacyRefused(
                f"the DP plan assumes {release.participants} participants, the job has {spec.n}"
            )
        if s.enabled and not math.isclose(release.delta, s.delta, rel_tol=1e-12):
            raise PrivacyRefused(f"the job's δ = {release.delta:g} differs from ours ({s.delta:g})")
        colluders = max(int(release.colluders), s.colluders if s.enabled else 0)
        t = int(release.min_contributors)
        if guaranteed_contributors(spec) < t:
            raise PrivacyRefused(
                f"the job guarantees only {guaranteed_contributors(spec)} contributors, "
                f"the DP plan assumes {t}"
            )
        try:
            plan = plan_calibration_release(
                release.kind,
                dim=dim,
                num_classes=num_classes,
                participants=spec.n,
                min_contributors=t,
                epsilon_target=float(release.epsilon),
                delta=float(release.delta),
                max_examples=int(release.max_examples),
                mechanism=release.mechanism,
                quant_bits=int(release.quant_bits),
                colluders=colluders,
            )
        except (ValueError, SecAggError) as exc:  # RingOverflowRisk, NoiseTooLarge…
            raise PrivacyRefused(f"cannot plan the release: {exc}") from None
        try:
            verify_plan(spec, plan.noise)
        except SecAggError as exc:
            raise PrivacyRefused(str(exc)) from None
        if spec.scale_bits != plan.scale_bits or spec.bound != plan.value_bound:
            raise PrivacyRefused(
                f"job scale 2^-{spec.scale_bits} / bound {spec.bound:g} differ from the plan's "
                f"2^-{plan.scale_bits} / {plan.value_bound:g}"
            )
        with self._lock:
            ledger = self.ledger(float(release.delta))
            scope = release.kind if per_kind else "moments"
            entry = self._admit_once(
                ledger, federation, scope, release.kind, plan.charge(plan.noise.min_contributors)
            )
        return plan, plan.noise, entry.to_json()

    def _admit_once(
        self,
        ledger: PrivacyLedger,
        federation: str,
        scope: str,
        kind: str,
        charge: PrivacyCharge,
    ) -> LedgerEntry:
        """The federation's one comparison of a DP statistics release with this site's
        budget, and its one charge (``release_id`` ``dp-statistics/<federation>``).

        Why once: whether ``spent + ε`` fits the budget is a bit about what the site
        has spent — its history in other releases and federations, and with local
        DP-SGD (whose ε follows the example count) its count. The coordinator picks
        each job's ε, and a refusal costs it nothing, so comparing per job let it sweep
        ε downward until the first admission: ``spent`` to any precision, the count
        with it. The first comparison in a federation is kept (``site_dp_statistics``:
        the kind, the charge's ε, the answer); a later job of the federation with the
        same kind and ε gets that answer — the same charge, or the same refusal —
        without comparing again, and any other plan is refused without comparing. The
        moments are one release per federation (``release_ledger``), so one charge
        covers every job that could release them; a retried job is no longer charged
        twice. ``scope`` is ``moments`` — one release per federation, the release
        ledger's default — or, where this site's ``[policy] one_release_per_model =
        false`` lets FFC and CCVR each leave once, the kind: one comparison per kind."""
        conn = self._connection()
        conn.execute(_ADMISSIONS_SCHEMA)
        row = conn.execute(
            "SELECT kind, epsilon, admitted FROM site_dp_statistics WHERE participant = ? "
            "AND federation = ? AND scope = ?",
            (self.pid, federation, scope),
        ).fetchone()
        release_id = f"dp-statistics/{federation}" + ("" if scope == "moments" else f"/{scope}")
        if row is not None:
            kind0, epsilon0, admitted = str(row[0]), float(row[1]), bool(row[2])
            asked = f"{kind0} at ε = {epsilon0:.4g}"
            if kind0 != kind or not math.isclose(epsilon0, charge.epsilon, rel_tol=1e-9):
                raise PrivacyRefused(
                    f"this federation's DP statistics release was already put to this "
                    f"site's budget ({asked}); a release of another plan is not compared "
                    "with it again in this federation"
                )
            if not admitted:
                raise PrivacyRefused(
                    f"this federation's DP statistics release ({asked}) was refused: it "
                    "would exceed this site's budget; it is not compared again in this "
                    "federation"
                )
            return _charge_once(ledger, self.pid, charge, release_id)
        try:
            entry = _charge_once(ledger, self.pid, charge, release_id)
        except BudgetExceeded:
            self._record_admission(federation, scope, kind, charge.epsilon, admitted=False)
            raise
        self._record_admission(federation, scope, kind, charge.epsilon, admitted=True)
        return entry

    def _record_admission(
        self, federation: str, scope: str, kind: str, epsilon: float, *, admitted: bool
    ) -> None:
        conn = self._connection()
        with conn:
            conn.execute(
                "INSERT OR IGNORE INTO site_dp_statistics (participant, federation, scope, "
                "kind, epsilon, admitted, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (self.pid, federation, scope, kind, epsilon, int(admitted), time.time()),
            )


def _charge_once(
    ledger: PrivacyLedger, subject: str, charge: PrivacyCharge, release_id: str
) -> LedgerEntry:
    """Charge ``release_id`` unless it is charged already (then its entry): a held
    job taken up after this site's restart (issue #20) was charged by the first
    process, and one job is one release."""
    for entry in ledger.store.entries(subject):
        if entry.release_id == release_id:
            return entry
    return ledger.charge(subject, charge, release_id=release_id)
