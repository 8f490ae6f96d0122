"""What participants refused, and whom the coordinator excluded: one record for the
events, the summary (``refusals``, ``excluded``) and ``spherecal audit``.

Refusals arrive typed (``FailureReport.kind`` ``POLICY_REFUSAL`` or
``BUDGET_EXCEEDED`` and ``FailureReport.rule``); they are recorded as they come,
never guessed from text.

Exclusion (issue #9): a participant that deals shares failing authentication can
make every retry of a job fail. Honest holders that detect it send a signed
complaint naming the dealer (:mod:`spherecal.crypto.complaints`); the server verifies each
one. A dealer is excluded from the rest of the federation when a strict majority of
its *other* share holders in the job complained — so a corrupt dealer facing honest
holders is always excluded, while a minority of malicious complainants cannot get an
honest dealer excluded (``docs/threat_model.md``). The driver then retries the job
without it, and every later task (rounds, statistics, evaluation) leaves it out —
also after a coordinator restart (the record, complainants included, is reloaded
from the database: ``results.json`` ``excluded`` reads the same before and after).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from spherecal.coordinator.state.store import Store
from spherecal.coordinator.summary_schema import ConductSummary
from spherecal.proto import spherecal_pb2 as pb

__all__ = ["REFUSAL_KINDS", "Conduct", "Exclusion", "Refusal", "should_exclude"]

REFUSAL_KINDS: frozenset[pb.FailureKind] = frozenset({pb.POLICY_REFUSAL, pb.BUDGET_EXCEEDED})


@dataclass(frozen=True)
class Refusal:
    participant: str
    job: str
    purpose: str
    kind: str  # FailureKind name
    rule: str  # PolicyRule name
    reason: str


@dataclass(frozen=True)
class Exclusion:
    participant: str
    job: str
    purpose: str
    reason: str
    complainants: tuple[str, ...]


def should_exclude(complainants: int, other_holders: int) -> bool:
    """A strict majority of the dealer's other share holders complained."""
    return other_holders > 0 and 2 * complainants > other_holders


class Conduct:
    """Thread-safe record (handlers add refusals, the driver adds exclusions)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self.refusals: list[Refusal] = []
        self.excluded: dict[str, Exclusion] = {}
        self._reload()

    def _reload(self) -> None:
        """A resumed coordinator keeps its record (one state directory is one
        federation): an excluded participant stays excluded after a restart."""
        rows = self.store.query(
            "SELECT type, participant, job, purpose, kind, rule, reason, complainants "
            "FROM policy_events ORDER BY id"
        )
        for type_, participant, job, purpose, kind, rule, reason, named in rows:
            if type_ == "exclusion":
                complainants = tuple(str(p) for p in json.loads(named)) if named else ()
                self.excluded.setdefault(
                    participant,
                    Exclusion(participant, job or "", purpose or "", reason, complainants),
                )
            else:
                self.refusals.append(
                    Refusal(participant, job or "", purpose or "", kind, rule or "", reason)
                )

    def refusal(
        self,
        *,
        participant: str,
        job: str,
        purpose: str,
        kind: pb.FailureKind,
        rule: pb.PolicyRule,
        reason: str,
    ) -> Refusal:
        entry = Refusal(
            participant=participant,
            job=job,
            purpose=purpose,
            kind=pb.FailureKind.Name(kind),
            rule=pb.PolicyRule.Name(rule),
            reason=reason,
        )
        with self._lock:
            self.refusals.append(entry)
        self.store.policy_event(
            type="refusal",
            participant=participant,
            job=job,
            purpose=purpose,
            kind=entry.kind,
            rule=entry.rule,
            reason=reason,
        )
        return entry

    def refusals_since(self, index: int) -> list[Refusal]:
        """The refusals recorded after the first ``index`` (``len(refusals)`` taken
        when a stage began: ``futile_retry.RefusalWatch``)."""
        with self._lock:
            return self.refusals[index:]

    def exclude(
        self, participant: str, *, job: str, purpose: str, complainants: tuple[str, ...]
    ) -> Exclusion | None:
        """Exclude ``participant`` (once); returns the new record, None if already out."""
        reason = (
            f"its shares failed authentication for {len(complainants)} holders "
            f"({', '.join(complainants)}) in {purpose} job {job[:8]}"
        )
        entry = Exclusion(participant, job, purpose, reason, complainants)
        with self._lock:
            if participant in self.excluded:
                return None
            self.excluded[participant] = entry
        self.store.policy_event(
            type="exclusion",
            participant=participant,
            job=job,
            purpose=purpose,
            kind="SHARE_AUTHENTICATION",
            rule=None,
            reason=reason,
            complainants=complainants,
        )
        self.store.event("warning", f"excluded {participant}: {reason}")
        return entry

    def is_excluded(self, participant: str) -> bool:
        with self._lock:
            return participant in self.excluded

    def eligible(self, participants: list[str]) -> list[str]:
        """``participants`` without the excluded ones (order kept)."""
        with self._lock:
            return [p for p in participants if p not in self.excluded]

    def summary(self) -> ConductSummary:
        with self._lock:
            return {
                "refusals": [
                    {
                        "participant": r.participant,
                        "job": r.job,
                        "purpose": r.purpose,
                        "kind": r.kind,
                        "rule": r.rule,
                        "reason": r.reason,
                    }
                    for r in self.refusals
                ],
                "excluded": [
                    {
                        "participant": e.participant,
                        "job": e.job,
                        "purpose": e.purpose,
                        "reason": e.reason,
                        "complainants": list(e.complainants),
                    }
                    for e in self.excluded.values()
                ],
            }
