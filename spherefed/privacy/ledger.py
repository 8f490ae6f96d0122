"""The privacy ledger: every release charged to a subject, composed, checked against a budget.

A *subject* is whose privacy is spent: a participant id (each participant keeps its
own ledger in its own local database, and refuses jobs that would overrun its
budget) or the federation as a whole (the coordinator's view). Each entry records
the release (kind, job, mechanism, noise, sensitivity), ε(δ) of that release alone,
and the composed total after it — the numbers a privacy officer signs off on.

**Budget** (:class:`PrivacyBudget`): a target ε per release, a total ε, or both, at
one δ. :meth:`PrivacyLedger.check` projects the composition with a prospective charge
and raises :class:`BudgetExceeded` — carrying the numbers — if either limit would be
crossed; :meth:`PrivacyLedger.charge` checks and records in one step under a lock.
Composition is RDP addition of the stored curves (:mod:`spherecal.spherefed.privacy.accounting`);
the reported δ adds the truncation term ``(1 + e^ε)·Σ η`` of the integer noise.

**Storage** is a :class:`LedgerStore`: :class:`MemoryLedgerStore`, or
:class:`SqliteLedgerStore` on a ``sqlite3.Connection`` its owner opened (the
coordinator's database, a participant's local file); the store creates its own table
and never closes the connection. One contract test suite runs against both.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from spherecal.spherefed.privacy.accounting import compose, delta_with_truncation, epsilon
from spherecal.spherefed.privacy.charge import PrivacyCharge

__all__ = [
    "BudgetExceeded",
    "DuplicateRelease",
    "LedgerEntry",
    "LedgerError",
    "LedgerStore",
    "MemoryLedgerStore",
    "PrivacyBudget",
    "PrivacyLedger",
    "Spent",
    "SqliteLedgerStore",
]


class LedgerError(Exception):
    """Base of the ledger's errors."""


class DuplicateRelease(LedgerError):
    """The same (subject, release id) was recorded before; nothing was written."""


class BudgetExceeded(LedgerError):
    """A release would cross the subject's budget. Every number is an attribute."""

    def __init__(
        self,
        *,
        subject: str,
        limit: str,
        budget_epsilon: float,
        spent_epsilon: float,
        release_epsilon: float,
        projected_epsilon: float,
        delta: float,
        release_kind: str,
    ) -> None:
        self.subject = subject
        self.limit = limit
        self.budget_epsilon = budget_epsilon
        self.spent_epsilon = spent_epsilon
        self.release_epsilon = release_epsilon
        self.projected_epsilon = projected_epsilon
        self.delta = delta
        self.release_kind = release_kind
        super().__init__(
            f"refusing {release_kind} release for {subject!r}: it would exceed the "
            f"{self.limit_name} "
            f"ε = {budget_epsilon:g} at δ = {delta:g} (this release ε = {release_epsilon:.4g}, "
            f"already spent ε = {spent_epsilon:.4g}, total after it ε = {projected_epsilon:.4g})"
        )

    @property
    def limit_name(self) -> str:
        """The limit crossed, in words: ``per-release target`` or ``total budget``."""
        return "per-release target" if self.limit == "per_release" else "total budget"

    def numbers(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "limit": self.limit,
            "budget_epsilon": self.budget_epsilon,
            "spent_epsilon": self.spent_epsilon,
            "release_epsilon": self.release_epsilon,
            "projected_epsilon": self.projected_epsilon,
            "delta": self.delta,
            "release_kind": self.release_kind,
        }


@dataclass(frozen=True)
class PrivacyBudget:
    """Limits at one δ: a per-release ε target, a total ε, or both (``None`` = no limit)."""

    delta: float
    total_epsilon: float | None = None
    epsilon_per_release: float | None = None
    tolerance: float = 1e-9
    """Relative slack for the comparisons (the calibration lands just below targets)."""

    def __post_init__(self) -> None:
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        for name in ("total_epsilon", "epsilon_per_release"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded release."""

    subject: str
    release_id: str
    job_id: str
    charge: PrivacyCharge
    epsilon_total: float
    """Composed ε of the subject after this release, at the charge's δ."""
    created_at: float

    def to_json(self) -> dict[str, Any]:
        out = self.charge.to_json()
        out.update(
            {
                "subject": self.subject,
                "release_id": self.release_id,
                "job_id": self.job_id,
                "epsilon_total": self.epsilon_total,
                "created_at": self.created_at,
            }
        )
        return out


@dataclass(frozen=True)
class Spent:
    """A subject's composed spend."""

    subject: str
    releases: int
    epsilon: float
    delta: float
    delta_with_truncation: float
    best_order: float


class LedgerStore(Protocol):
    """Append-only storage of ledger entries."""

    def append(self, entry: LedgerEntry) -> None:
        """Store ``entry``; raise :class:`DuplicateRelease` for a known (subject, release id)."""
        ...

    def entries(self, subject: str) -> list[LedgerEntry]:
        """The subject's entries in recording order."""
        ...

    def subjects(self) -> list[str]:
        """Every subject with at least one entry, sorted."""
        ...


class MemoryLedgerStore:
    """In-process store (tests, simulations)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, list[LedgerEntry]] = {}

    def append(self, entry: LedgerEntry) -> None:
        with self._lock:
            rows = self._entries.setdefault(entry.subject, [])
            if any(e.release_id == entry.release_id for e in rows):
                raise DuplicateRelease(
                    f"release {entry.release_id!r} already recorded for {entry.subject!r}"
                )
            rows.append(entry)

    def entries(self, subject: str) -> list[LedgerEntry]:
        with self._lock:
            return list(self._entries.get(subject, []))

    def subjects(self) -> list[str]:
        with self._lock:
            return sorted(s for s, rows in self._entries.items() if rows)


_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class SqliteLedgerStore:
    """Entries in a table of an existing SQLite database.

    The connection belongs to the caller (the coordinator's or participant's database);
    the store creates ``table`` if needed and commits each insert with the
    connection's context manager — which also commits a transaction the owner left
    open, so record releases between the owner's transactions. Use the connection
    from one thread at a time, as ``sqlite3`` requires.
    """

    def __init__(self, connection: sqlite3.Connection, *, table: str = "privacy_ledger") -> None:
        if not _TABLE_NAME.match(table):
            raise ValueError(f"invalid table name {table!r}")
        self._conn = connection
        self._table = table
        with self._conn:
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} ("
                " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                " subject TEXT NOT NULL,"
                " release_id TEXT NOT NULL,"
                " job_id TEXT NOT NULL,"
                " kind TEXT NOT NULL,"
                " mechanism TEXT NOT NULL,"
                " epsilon REAL NOT NULL,"
                " delta REAL NOT NULL,"
                " epsilon_total REAL NOT NULL,"
                " created_at REAL NOT NULL,"
                " charge_json TEXT NOT NULL,"
                " UNIQUE (subject, release_id))"
            )

    def append(self, entry: LedgerEntry) -> None:
        c = entry.charge
        try:
            with self._conn:
                self._conn.execute(
                    f"INSERT INTO {self._table} (subject, release_id, job_id, kind, mechanism, "
                    "epsilon, delta, epsilon_total, created_at, charge_json) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        entry.subject,
                        entry.release_id,
                        entry.job_id,
                        c.kind,
                        c.mechanism,
                        c.epsilon,
                        c.delta,
                        entry.epsilon_total,
                        entry.created_at,
                        json.dumps(c.to_json(), sort_keys=True),
                    ),
                )
        except sqlite3.IntegrityError as exc:
            raise DuplicateRelease(
                f"release {entry.release_id!r} already recorded for {entry.subject!r}"
            ) from exc

    def entries(self, subject: str) -> list[LedgerEntry]:
        rows = self._conn.execute(
            f"SELECT subject, release_id, job_id, epsilon_total, created_at, charge_json "
            f"FROM {self._table} WHERE subject = ? ORDER BY seq",
            (subject,),
        ).fetchall()
        return [
            LedgerEntry(
                subject=r[0],
                release_id=r[1],
                job_id=r[2],
                charge=PrivacyCharge.from_json(json.loads(r[5])),
                epsilon_total=float(r[3]),
                created_at=float(r[4]),
            )
            for r in rows
        ]

    def subjects(self) -> list[str]:
        rows = self._conn.execute(f"SELECT DISTINCT subject FROM {self._table} ORDER BY subject")
        return [r[0] for r in rows.fetchall()]


class PrivacyLedger:
    """Budget checks and recording on top of a :class:`LedgerStore`."""

    def __init__(self, store: LedgerStore, budget: PrivacyBudget) -> None:
        self.store = store
        self.budget = budget
        self._lock = threading.Lock()

    # ------------------------------------------------------------ reading
    def _compose(self, charges: Sequence[PrivacyCharge]) -> Spent:
        delta = self.budget.delta
        if not charges:
            return Spent("", 0, 0.0, delta, delta, math.nan)
        eps, order = epsilon(compose([c.curve for c in charges]), delta)
        tail = sum(c.tail_probability for c in charges)
        return Spent("", len(charges), eps, delta, delta_with_truncation(eps, delta, tail), order)

    def spent(self, subject: str) -> Spent:
        s = self._compose([e.charge for e in self.store.entries(subject)])
        return Spent(subject, s.releases, s.epsilon, s.delta, s.delta_with_truncation, s.best_order)

    def entries(self, subject: str) -> list[LedgerEntry]:
        return self.store.entries(subject)

    def report(self) -> dict[str, Any]:
        """Every subject's entries and composed spend, as JSON."""
        out: dict[str, Any] = {
            "budget": {
                "delta": self.budget.delta,
                "total_epsilon": self.budget.total_epsilon,
                "epsilon_per_release": self.budget.epsilon_per_release,
            },
            "subjects": {},
        }
        for subject in self.store.subjects():
            s = self.spent(subject)
            out["subjects"][subject] = {
                "releases": s.releases,
                "epsilon": s.epsilon,
                "delta": s.delta,
                "delta_with_truncation": s.delta_with_truncation,
                "within_budget": self.budget.total_epsilon is None
                or s.epsilon <= self.budget.total_epsilon * (1 + self.budget.tolerance),
                "entries": [e.to_json() for e in self.store.entries(subject)],
            }
        return out

    # ------------------------------------------------------------ checking
    def check(self, subject: str, charge: PrivacyCharge) -> float:
        """Raise :class:`BudgetExceeded` if ``charge`` would cross a limit; else return
        the projected composed ε."""
        spent_on = [e.charge for e in self.store.entries(subject)]
        return self._check(subject, charge, charge, spent_on)

    def check_plan(
        self, subject: str, each: PrivacyCharge, whole: PrivacyCharge, *, own_prefix: str
    ) -> None:
        """Admit a plan of several releases at once, or none of it: ``each`` release
        within the per-release target, and ``whole`` (the plan's releases composed)
        within the total beside everything charged *outside* the plan (entries whose
        ``release_id`` starts with ``own_prefix`` are the plan's own and left out).

        Why: where a release's ε depends on the subject's data (local DP-SGD: the
        sampling rate and steps follow its example count), a check per release
        refuses at the first release that no longer fits, and *which* release that is
        tells the asker ``budget / ε`` and with it the count. Checked against the
        whole plan the answer is the same at every release of the plan, after every
        restart (its own charges are left out): the plan reveals one comparison with
        the budget, again only when a release outside it is charged between two of
        its releases. Raises
        :class:`BudgetExceeded` (``release_epsilon`` is ``each``'s for the
        per-release target, the plan's for the total)."""
        spent_on = [
            e.charge for e in self.store.entries(subject) if not e.release_id.startswith(own_prefix)
        ]
        self._check(subject, each, whole, spent_on)

    def _check(
        self,
        subject: str,
        each: PrivacyCharge,
        whole: PrivacyCharge,
        spent_on: list[PrivacyCharge],
    ) -> float:
        """``each`` within the per-release target and ``whole`` composed with
        ``spent_on`` within the total, or :class:`BudgetExceeded`; the projected ε."""
        if not math.isclose(whole.delta, self.budget.delta, rel_tol=1e-12):
            raise ValueError(
                f"charge δ = {whole.delta} differs from the budget's δ = {self.budget.delta}"
            )
        spent = self._compose(spent_on).epsilon
        projected = self._compose([*spent_on, whole]).epsilon
        b, tol = self.budget, 1 + self.budget.tolerance
        limits = (
            ("per_release", b.epsilon_per_release, each.epsilon, each),
            ("total", b.total_epsilon, projected, whole),
        )
        for limit, budget_eps, value, charge in limits:
            if budget_eps is not None and value > budget_eps * tol:
                raise BudgetExceeded(
                    subject=subject,
                    limit=limit,
                    budget_epsilon=budget_eps,
                    spent_epsilon=spent,
                    release_epsilon=charge.epsilon,
                    projected_epsilon=projected,
                    delta=b.delta,
                    release_kind=whole.kind,
                )
        return projected

    def charge(
        self, subject: str, charge: PrivacyCharge, *, release_id: str, job_id: str = ""
    ) -> LedgerEntry:
        """Check the budget and record the release atomically (within this process)."""
        with self._lock:
            projected = self.check(subject, charge)
            entry = LedgerEntry(
                subject=subject,
                release_id=release_id,
                job_id=job_id or release_id,
                charge=charge,
                epsilon_total=projected,
                created_at=time.time(),
            )
            self.store.append(entry)
            return entry

    def record(
        self, subject: str, charge: PrivacyCharge, *, release_id: str, job_id: str = ""
    ) -> LedgerEntry:
        """Record a release that already happened, without a budget check (the
        coordinator's account of what was released; the check happened at the
        participants). The composed total is still computed and stored."""
        with self._lock:
            charges = [e.charge for e in self.store.entries(subject)]
            entry = LedgerEntry(
                subject=subject,
                release_id=release_id,
                job_id=job_id or release_id,
                charge=charge,
                epsilon_total=self._compose([*charges, charge]).epsilon,
                created_at=time.time(),
            )
            self.store.append(entry)
            return entry
