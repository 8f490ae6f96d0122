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
from collections.abc import Callable
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
    "charge_once",
]


class PrivacyRefused(Exception):
    """A task this participant's privacy policy does not allow (here: a DP plan it
    does not accept; subclasses name the other rules)."""


class NoiseRequired(PrivacyRefused):
    """Calibration statistics without DP noise, or not securely aggregated, while this
    participant's ``[privacy] enabled`` demands it."""


class PlaintextRefused(PrivacyRefused, PermissionError):
    """A plaintext upload or report while ``allow_plaintext`` is false."""


_ANSWERS_SCHEMA = """
CREATE TABLE IF NOT EXISTS site_budget_answers (
    participant TEXT NOT NULL,
    federation  TEXT NOT NULL,
    scope       TEXT NOT NULL,
    terms       TEXT NOT NULL,
    admitted    INTEGER NOT NULL,
    at          REAL NOT NULL,
    PRIMARY KEY (participant, federation, scope)
)"""
"""Each federation's one comparison with the site's budget per scope — its DP statistics
release, its distributed DP-SGD steps — with the terms it was asked at and the answer
(:meth:`ParticipantPrivacy._answer_once`)."""


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
            return charge_once(ledger, self.pid, charge, release_id).to_json()

    def charge_plan_step(
        self,
        federation: str,
        terms: str,
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
            ledger = self.ledger(delta)
            self._answer_once(
                federation,
                "dpsgd",
                terms,
                "this federation's distributed DP-SGD steps were",
                lambda: ledger.check_plan(self.pid, each, whole, own_prefix=own_prefix),
            )
            return charge_once(ledger, self.pid, each, release_id).to_json()

    def _answer_once(
        self,
        federation: str,
        scope: str,
        terms: str,
        asked: str,
        compare: Callable[[], object],
    ) -> None:
        """The federation's one comparison with this site's budget in ``scope``: the
        first ``compare()`` (raising :class:`BudgetExceeded` over budget) is kept with
        its ``terms``; later, the same terms get the kept answer without comparing,
        other terms are refused without comparing (``asked`` names what was asked in
        the refusal). Why once: whether a release fits beside what the site has spent
        is a bit about that spending — its history in other releases and federations,
        and with local DP-SGD (whose ε follows the example count) its count — and the
        coordinator, choosing each job's ε and paying nothing for a refusal, could
        otherwise sweep it until the first admission."""
        conn = self._connection()
        conn.execute(_ANSWERS_SCHEMA)
        row = conn.execute(
            "SELECT terms, admitted FROM site_budget_answers WHERE participant = ? AND "
            "federation = ? AND scope = ?",
            (self.pid, federation, scope),
        ).fetchone()
        if row is not None:
            kept, admitted = str(row[0]), bool(row[1])
            if kept != terms:
                raise PrivacyRefused(
                    f"{asked} already put to this site's budget with other parameters "
                    f"({kept}); a release of other parameters is not compared with it "
                    "again in this federation"
                )
            if not admitted:
                raise PrivacyRefused(
                    f"{asked} refused: it would exceed this site's budget ({kept}); it is "
                    "not compared again in this federation"
                )
            return
        try:
            compare()
        except BudgetExceeded:
            self._keep_answer(federation, scope, terms, admitted=False)
            raise
        self._keep_answer(federation, scope, terms, admitted=True)

    def _keep_answer(self, federation: str, scope: str, terms: str, *, admitted: bool) -> None:
        conn = self._connection()
        with conn:
            conn.execute(
                "INSERT OR IGNORE INTO site_budget_answers (participant, federation, scope, "
                "terms, admitted, at) VALUES (?, ?, ?, ?, ?, ?)",
                (self.pid, federation, scope, terms, int(admitted), time.time()),
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
        budget (:meth:`_answer_once`, which says why), and its one charge (``release_id``
        ``dp-statistics/<federation>``): a later job of the federation with the same kind
        and ε gets the same charge or the same refusal, a retried job is not charged
        twice, and the moments being one release per federation (``release_ledger``),
        one charge covers every job that could release them. ``scope`` is ``moments``,
        or — where this site's ``[policy] one_release_per_model = false`` lets FFC and
        CCVR each leave once — the kind: one comparison per kind."""
        release_id = f"dp-statistics/{federation}" + ("" if scope == "moments" else f"/{scope}")
        self._answer_once(
            federation,
            scope,
            f"{kind} at ε = {charge.epsilon!r}",
            "this federation's DP statistics release was",
            lambda: charge_once(ledger, self.pid, charge, release_id),
        )
        return charge_once(ledger, self.pid, charge, release_id)


def charge_once(
    ledger: PrivacyLedger, subject: str, charge: PrivacyCharge, release_id: str
) -> LedgerEntry:
    """Charge ``release_id`` unless it is charged already (then its entry): a held
    job taken up after this site's restart (issue #20) was charged by the first
    process, and one job is one release."""
    for entry in ledger.store.entries(subject):
        if entry.release_id == release_id:
            return entry
    return ledger.charge(subject, charge, release_id=release_id)
