"""The release ledger's rules: which release a site refuses, given what already left it.

Why a module of its own: :mod:`spherecal.participant.release_ledger` keeps the
ledger's life cycle — a release reserved when the task is admitted, consumed when its
input leaves, annotated, recorded — and the per-federation facts beside it (the plan
fixed at join, the training weight drawn once). *What* a new release may not be is
another idea: one rule per purpose (the family of a kind, :func:`family_of`), each a
question to the rows that already left, keyed by what the release *is* (what its
computation depends on) and never by identifiers the coordinator can vary for free —
job ids, head names, a federation name alone. The ledger asks :class:`ReleaseConflicts`
inside its own lock and transaction: at reservation, and again atomically when the
input is about to leave.

The rules (each switched by :class:`LedgerRules`, from ``[policy]``):

* ``training`` (kind ``update``): one update per ``(federation, round)``, and an exact
  update — determined bit for bit by the executed model, the round's seed, the
  broadcast as executed and the plan's local training — once in any federation
  (:meth:`ReleaseConflicts.repeated_update`).
* ``moments`` (FFC, CCVR and what is solved from the per-class moments: one family):
  once per federation and per executed model; exactly once per data fingerprint; exact
  moments of changed data refused once exact moments left in another federation.
* ``evaluation``: the same evaluation (executed model, split, head contents) once;
  ``max_evaluations_per_federation`` per federation; ``max_evaluations_per_split`` of
  one split's records in all federations together (:meth:`ReleaseConflicts._split_spent`).
* every purpose: at most ``max_unreleased_attempts`` started jobs whose input never
  left (:meth:`ReleaseConflicts.attempts`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spherecal.participant.dp_gate import PrivacyRefused
from spherecal.participant.policy import (
    DEFAULT_MAX_UNRELEASED_ATTEMPTS,
    AttemptsExhausted,
    EvaluationsExhausted,
    ReleaseRepeated,
)
from spherecal.spherefed.privacy.evaluation_noise import DEFAULT_MAX_EVALUATIONS_PER_FEDERATION

__all__ = [
    "EVALUATE",
    "EVALUATION",
    "MOMENTS",
    "TRAINING",
    "UPDATE",
    "LedgerRules",
    "Release",
    "ReleaseConflicts",
    "family_of",
]

EVALUATE = "evaluate"
UPDATE = "update"
TRAINING = "training"
MOMENTS = "moments"
EVALUATION = "evaluation"

_COLUMNS = "job, kind, federation, model, data, content, round, noised"


def family_of(kind: str) -> str:
    """The purpose a kind belongs to: one rule per family."""
    if kind == UPDATE:
        return TRAINING
    if kind == EVALUATE:
        return EVALUATION
    return MOMENTS  # ffc, ccvr and anything derivable from the per-class moments


@dataclass(frozen=True)
class LedgerRules:
    """Which rules the ledger enforces (``[policy]``; all on by default)."""

    one_update_per_round: bool = True
    one_release_per_model: bool = True
    exact_data_once: bool = True
    """Not ``[policy] reuse_data_across_federations``."""
    exact_in_one_federation: bool = True
    """Not ``[policy] exact_moments_of_changed_data``: exact moments of *other* data
    (the split changed) are refused in any federation but the one exact moments
    already left in."""
    max_evaluations_per_federation: int = DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    """``[policy] max_evaluations_per_federation`` (0: no limit)."""
    max_evaluations_per_split: int | None = None
    """``[policy] max_evaluations_per_split``: evaluations of one split, by its
    fingerprint, across all federations (None: ``max_evaluations_per_federation``'s
    value; 0: no limit)."""
    max_unreleased_attempts: int = DEFAULT_MAX_UNRELEASED_ATTEMPTS
    """``[policy] max_unreleased_attempts`` (0: no limit)."""

    @property
    def evaluations_per_split(self) -> int:
        """The lifetime limit per split in force (0: no limit)."""
        if self.max_evaluations_per_split is None:
            return self.max_evaluations_per_federation
        return self.max_evaluations_per_split


@dataclass(frozen=True)
class Release:
    """What one release is, by what the computation depends on."""

    kind: str
    federation: str
    model: bytes
    """Executed-model digest."""
    data: bytes = b""
    """Fingerprint of the local split the release is computed from."""
    content: bytes = b""
    """Evaluation: split and head contents (no names)."""
    round: int | None = None
    noised: bool = False
    epsilon: float | None = None
    delta: float | None = None
    noise: dict[str, Any] | None = None
    trained: bytes | None = None
    """Training: the digest of what determines the update bit for bit
    (:meth:`~spherecal.participant.release_ledger.ReleaseLedger.admit_update`; known
    once the model is downloaded)."""

    @property
    def family(self) -> str:
        return family_of(self.kind)


class ReleaseConflicts:
    """The rules of :class:`LedgerRules` asked of one site's ``site_releases`` table.

    Read-only queries; the caller (:class:`~spherecal.participant.release_ledger.ReleaseLedger`)
    holds its lock and, where the answer must stay true until it writes, its
    transaction. ``connection`` opens the ledger's database on first use."""

    def __init__(
        self, connection: Callable[[], sqlite3.Connection], participant: str, rules: LedgerRules
    ) -> None:
        self._connect = connection
        self.participant = participant
        self.rules = rules

    @property
    def _conn(self) -> sqlite3.Connection:
        return self._connect()

    def _released(self, family: str, job: str) -> list[tuple[Any, ...]]:
        return list(
            self._conn.execute(
                f"SELECT {_COLUMNS} FROM site_releases WHERE participant = ? AND family = ? "
                "AND state = 'released' AND job != ?",
                (self.participant, family, job),
            ).fetchall()
        )

    def conflict(self, release: Release, job: str) -> PrivacyRefused | None:
        """The refusal a rule makes of ``release`` given what already left (``None``:
        admitted)."""
        repeated = self._repeated(release, job)
        if repeated is None:
            repeated = self.repeated_update(release, job)
        if repeated is not None:
            return ReleaseRepeated(repeated)
        most = self.rules.max_evaluations_per_federation
        if release.family == EVALUATION and most > 0:
            (made,) = self._conn.execute(
                "SELECT COUNT(*) FROM site_releases WHERE participant = ? AND family = ? "
                "AND federation = ? AND state = 'released' AND job != ?",
                (self.participant, EVALUATION, release.federation, job),
            ).fetchone()
            if made >= most:
                return EvaluationsExhausted(
                    f"this site already answered {made} evaluation(s) in this federation, "
                    f"its most ([policy] max_evaluations_per_federation = {most}): each "
                    "evaluation's noise is fresh, so more of them would average it down"
                )
        return self._split_spent(release, job)

    def split_evaluations(self, data: bytes, *, besides: str = "") -> tuple[int, int]:
        """How many evaluation releases of the split fingerprinted ``data`` left this
        site — under any key but ``besides`` — and in how many federations."""
        made, federations = self._conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT federation) FROM site_releases "
            "WHERE participant = ? AND family = ? AND data = ? AND state = 'released' "
            "AND job != ?",
            (self.participant, EVALUATION, bytes(data), besides),
        ).fetchone()
        return int(made), int(federations)

    def _split_spent(self, release: Release, job: str) -> EvaluationsExhausted | None:
        """The refusal of an evaluation of a split that already answered
        ``max_evaluations_per_split`` evaluations, in any federation (``None``:
        admitted).

        Why across federations: ``max_evaluations_per_federation`` starts over in each
        new federation, while what a coordinator can ask for again does not change
        with the federation — the split's total is an entry of every evaluation, a
        constant head's counts are the split's label histogram — as long as the
        split's records stay the same. Until 2026-11-28 each federation on unchanged
        data added its four fresh draws to the mean: twelve federations, 48 releases,
        a count's noise averaged to ≈ 0.16 counts, exact when rounded. Keyed by the
        split's fingerprint (``release.data``), which the coordinator cannot vary: a
        split that changed is other records and starts a count of its own. Decided
        from the ledger alone, before any work on the split, so the refusal says
        nothing about it."""
        most = self.rules.evaluations_per_split
        if release.family != EVALUATION or most <= 0:
            return None
        made, federations = self.split_evaluations(release.data, besides=job)
        if made < most:
            return None
        return EvaluationsExhausted(
            f"this site already answered {made} evaluation(s) of this split in "
            f"{federations} federation(s), its most for the same records ([policy] "
            f"max_evaluations_per_split = {most}): more would average their fresh noise "
            "down; a changed split starts anew"
        )

    def _repeated(self, release: Release, job: str) -> str | None:
        r = self.rules
        for other, kind, federation, model, data, content, rnd, noised in self._released(
            release.family, job
        ):
            was = f"(job {str(other)[:16]}, {kind}, federation {federation!r})"
            if release.family == TRAINING:
                if (
                    r.one_update_per_round
                    and federation == release.federation
                    and (rnd == release.round)
                ):
                    # the ledger keeps the wire's 0-based index; people read rounds
                    # 1-based, as the coordinator's log, status and summary count them
                    shown = "?" if release.round is None else str(release.round + 1)
                    return (
                        f"the update of round {shown} already left this site {was}; "
                        "one update per (federation, round)"
                    )
            elif release.family == EVALUATION:
                if (
                    r.one_release_per_model
                    and bytes(content) == release.content
                    and (bytes(model) == release.model)
                ):
                    return (
                        f"this evaluation (executed model, split and head contents) was "
                        f"already answered {was}"
                    )
            else:
                if r.one_release_per_model and federation == release.federation:
                    return (
                        f"the per-class moments already left this site for this federation "
                        f"{was}; FFC, CCVR, LDA and QDA are one release per federation"
                    )
                if r.one_release_per_model and bytes(model) == release.model:
                    return (
                        f"the per-class moments already left this site for this executed "
                        f"model {was}; one release per model"
                    )
                if (
                    r.exact_data_once
                    and not release.noised
                    and not noised
                    and bytes(data) == release.data
                ):
                    return (
                        f"exact statistics of this site's data already left it {was}; "
                        "another federation on the same data needs DP noise "
                        "([privacy] enabled) or [policy] reuse_data_across_federations"
                    )
                if (
                    r.exact_in_one_federation
                    and not release.noised
                    and not noised
                    and federation != release.federation
                    and bytes(data) != release.data
                ):
                    return (
                        f"exact statistics of this site's data already left it {was}, and "
                        "the data changed since: two exact releases differ by the changed "
                        "records' statistics; another federation needs DP noise ([privacy] "
                        "enabled) or [policy] exact_moments_of_changed_data"
                    )
        return None

    def repeated_update(self, release: Release, job: str) -> str | None:
        """Why an exact training release is the update of another that already left
        this site, in any federation (``None``: it is not).

        Only exact updates: a noised one (local DP-SGD, a distributed DP-SGD step)
        draws fresh noise each time, is never the same twice, and each is charged.
        The key holds what the coordinator sent and the plan it fixed, and nothing of
        the site's data or its client state, so refusing says nothing about them (an
        update asked again over changed data or state would differ; refusing it too
        is the safe side).

        In any federation (2026-11-28; until then within one): a coordinator that
        starts a second federation — the sites' operators start their processes
        again, as for any new one — with the first's model and seeds over a roster
        without one site had every other site send its first-federation update again,
        bit for bit, and the two sums' difference was that site's update. Each site
        refusing to send its own again is what makes the others' differences inexact.
        An honest coordinator meets it only when it runs a federation again from the
        same model and ``[federation] seed`` on unchanged data: its first round is lost
        (the next trains from the same model with the next round's seed, admitted) —
        another seed avoids it."""
        if (
            not self.rules.one_update_per_round
            or release.family != TRAINING
            or release.noised
            or not release.trained
        ):
            return None
        row = self._conn.execute(
            "SELECT job, round, federation FROM site_releases WHERE participant = ? "
            "AND family = ? AND trained = ? AND noised = 0 AND state = 'released' "
            "AND job != ? ORDER BY released LIMIT 1",
            (self.participant, TRAINING, bytes(release.trained), job),
        ).fetchone()
        if row is None:
            return None
        shown = "?" if row[1] is None else str(int(row[1]) + 1)
        where = (
            f"federation {release.federation!r}"
            if str(row[2]) == release.federation
            else f"federation {str(row[2])!r}, not this one: another [federation] seed avoids it"
        )
        return (
            f"this update — the same executed model, seed, broadcast and local training — "
            f"already left this site as round {shown}'s (job {str(row[0])[:16]}, {where}); "
            "one release per update, in any federation"
        )

    def attempts(self, release: Release, job: str) -> AttemptsExhausted | None:
        """The refusal of a *new* key when its purpose already holds the most started
        jobs whose input never left (``None``: admitted).

        Why: a reservation that is never consumed cost the site no release, so that an
        honest coordinator's retry is admitted — but the coordinator that abandoned the
        job during its local work saw when the site spoke next, which follows that
        work: its length (the example count), and whether a crafted model made it fail.
        Under fresh job ids that reading was free and unbounded (``docs/threat_model.md``,
        *Timing*). The purpose is what the coordinator cannot vary for free: a training
        round is ``(federation, round)`` (the plan bounds the rounds); the per-class
        moments and the evaluations are per federation — an evaluation's key changes
        with a model moved by one ulp, so its attempts are counted over the
        federation's evaluations together, ``max_evaluations_per_federation`` of them
        (4 when that is 0). Rows in ``released`` state never count: what left is
        bounded by the rules above. Decided from the ledger alone, before any local
        work, so the refusal says nothing about the data."""
        most = self.rules.max_unreleased_attempts
        if most <= 0:
            return None
        query = (
            "SELECT COUNT(*) FROM site_releases WHERE participant = ? AND family = ? "
            "AND federation = ? AND state = 'reserved' AND job != ?"
        )
        args: tuple[Any, ...] = (self.participant, release.family, release.federation, job)
        if release.family == TRAINING:
            query += " AND round IS ?"
            args += (release.round,)
            purpose = "round ?" if release.round is None else f"round {release.round + 1}"
        elif release.family == EVALUATION:
            most *= self.rules.max_evaluations_per_federation or (
                DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
            )
            purpose = "this federation's evaluations"
        else:
            purpose = "this federation's per-class moments"
        (started,) = self._conn.execute(query, args).fetchone()
        if started < most:
            return None
        return AttemptsExhausted(
            f"this site already started {started} job(s) for {purpose} whose input never "
            f"left, its most ([policy] max_unreleased_attempts): each one abandoned during "
            "its local work shows how long that work took"
        )
