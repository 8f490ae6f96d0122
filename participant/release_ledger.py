"""The site's release ledger: everything that leaves it, one accounted release each.

Why: secure aggregation hides one input inside one sum, but two sums that differ by
one site give that site's input exactly (differencing), and the coordinator chooses
every sum. So the site — the party at stake — counts what it releases, keyed by
what the release *is* (what the computation depends on), never by identifiers the
coordinator can vary for free (job ids, head names, a federation name alone). The
ledger lives in ``state_dir/privacy.db`` (table ``site_releases``) so a restart
does not reset it; ``spherecal audit --site STATE_DIR`` reads it
(:mod:`spherecal.site_audit`).

One rule per purpose (the family of a kind, :func:`family_of`), each a query that
:class:`~spherecal.participant.release_rules.ReleaseConflicts` asks of what already
left (:mod:`spherecal.participant.release_rules`):

* ``training`` (kind ``update``): at most one update per ``(federation, round)``,
  and one per *update* in a federation (``[policy] one_update_per_round`` switches
  both): an exact update is determined bit for bit by the executed model, the
  round's seed, the broadcast tensors as executed and the plan's local training
  (:meth:`spherecal.participant.trainer.LocalTrainer.update_digest`), so a second
  round from them — under another round index, from a model moved by one float64
  ulp — is the first round's update again, and two sums over rosters that differ
  by this site give it exactly (:meth:`ReleaseLedger.admit_update`).
* ``moments`` (``ffc``, ``ccvr`` and any statistic derivable from the per-class
  moments — LDA, QDA, FFC+bias are solved from CCVR's): one release per federation
  and one per *executed model* (``[policy] one_release_per_model``), whatever the
  kind within the family: CCVR's moments determine FFC's ``V`` and ``U``. The
  model digest is over the tensors the network computes with, after the dtype cast
  (:meth:`spherecal.participant.trainer.LocalTrainer.executed_digest`), so a 1-ulp
  float64 change that leaves the float32 network unchanged is the same model.
  Across federations, the site fingerprints its data split
  (:func:`spherecal.participant.data.fingerprint`): an *exact* (un-noised) release of
  the same data is allowed once per family, ever; a further one needs DP noise or
  ``[policy] reuse_data_across_federations = true`` (logged). Exact moments of
  *changed* data (another fingerprint) are refused too once exact moments left in
  another federation: a coordinator can run a new executed model with the same
  features (weights the features never read), and the two exact releases then
  differ by the changed records' statistics; ``[policy]
  exact_moments_of_changed_data = true`` admits them (logged).
* ``evaluation`` (kind ``evaluate``): counts leave with distributed DP noise
  (``[policy] evaluation_noise_sd``, :mod:`spherecal.spherefed.privacy.evaluation_noise`),
  each release's ε recorded here; the same evaluation — executed model, split and
  head *contents* (names are not part of the key) — is answered once, and at most
  ``[policy] max_evaluations_per_federation`` evaluations are answered per federation
  (each one's noise is fresh while its counts can be asked for again for free — a
  model moved by one ulp is a new key — so their number bounds how far the noise
  averages down), and ``[policy] max_evaluations_per_split`` of one split's records in
  all federations together (the counts do not change with the federation).
* the training weight (table ``site_example_counts``): the example count every
  update of a federation is weighted by, drawn with DP noise once per fingerprint of
  the training split and reused in every round, after a restart and in a later
  federation on the same data (:mod:`spherecal.participant.example_weight`), so any
  number of rounds, rosters and federation names is one release of it.

When a release counts: a job is *reserved* when the site admits the task and
*consumed* the moment its input leaves (right before the first masked chunk, or the
plaintext upload/report). A job that failed before that consumed nothing, so the
coordinator's retry with a fresh job id is admitted; one that failed after counts
(fail safe). But a job the coordinator abandons during its local work still showed
it something — when the site next speaks follows that work — so the reservations
that never left are *attempts*, bounded per purpose (``[policy]
max_unreleased_attempts``, :meth:`ReleaseConflicts.attempts`): per training round, for
the per-class moments, for the federation's evaluations together. Consuming re-checks
the rules atomically, so two concurrent jobs for one key cannot both be released.
The signed survivor set a release was summed with is stored when the unmask request
arrives (:meth:`ReleaseLedger.record_survivors`), and every refusal is recorded
(:meth:`ReleaseLedger.record_refusal`), so the site's own audit needs nothing from
the coordinator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from spherecal.participant.policy import ReleaseRepeated
from spherecal.participant.release_rules import (
    EVALUATE,
    EVALUATION,
    MOMENTS,
    TRAINING,
    UPDATE,
    LedgerRules,
    Release,
    ReleaseConflicts,
    family_of,
)
from spherecal.proto import spherecal_pb2 as pb

__all__ = [
    "EVALUATE",
    "EVALUATION",
    "INPUT",
    "ExampleCount",
    "REFUSAL",
    "MOMENTS",
    "TRAINING",
    "UPDATE",
    "LedgerRules",
    "Release",
    "ReleaseLedger",
    "evaluation_digest",
    "family_of",
    "plaintext_digest",
]


def plaintext_digest(vector: npt.NDArray[np.float64], meta: pb.UpdateMeta | None) -> bytes:
    """SHA-256 of a plaintext upload as it leaves: the vector's bytes (float64, its
    length) and its metadata (:meth:`ReleaseLedger.consume`'s ``value``)."""
    h = hashlib.sha256(b"spherecal plaintext upload v1")
    array = np.ascontiguousarray(vector, dtype=np.float64)
    h.update(len(array).to_bytes(8, "big"))
    h.update(array.tobytes())
    h.update(b"" if meta is None else meta.SerializeToString(deterministic=True))
    return h.digest()


def evaluation_digest(total: int, counts: dict[str, int]) -> bytes:
    """SHA-256 of a plaintext evaluation report as it leaves: its total and each
    head's count (:meth:`ReleaseLedger.consume`'s ``value``)."""
    text = json.dumps(
        {"total": int(total), "counts": {k: int(v) for k, v in counts.items()}}, sort_keys=True
    )
    return hashlib.sha256(b"spherecal plaintext evaluation v1" + text.encode()).digest()


def _release_of(row: tuple[Any, ...]) -> Release:
    """The release of a ``site_releases`` row read as :meth:`ReleaseLedger._kept`
    returns it (``kind, federation, model, data, content, round, noised, state,
    answer, value, trained``)."""
    return Release(
        kind=str(row[0]),
        federation=str(row[1]),
        model=bytes(row[2]),
        data=bytes(row[3]),
        content=bytes(row[4]),
        round=row[5],
        noised=bool(row[6]),
        trained=None if row[10] is None else bytes(row[10]),
    )


INPUT = "input"
"""What left in a release's place: the input (masked, or plaintext where allowed)."""
REFUSAL = "refusal"
"""What left in a release's place: a refusal that depends on the data (one bit)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS site_releases (
    participant TEXT NOT NULL,
    job         TEXT NOT NULL,
    kind        TEXT NOT NULL,
    family      TEXT NOT NULL,
    federation  TEXT NOT NULL,
    model       BLOB NOT NULL,
    data        BLOB NOT NULL,
    content     BLOB NOT NULL,
    round       INTEGER,
    noised      INTEGER NOT NULL,
    epsilon     REAL,
    delta       REAL,
    noise       TEXT,
    state       TEXT NOT NULL,
    reserved    REAL NOT NULL,
    released    REAL,
    survivors   TEXT,
    signers     TEXT,
    answer      TEXT,
    value       BLOB,
    executed    BLOB,
    trained     BLOB,
    PRIMARY KEY (participant, job)
);
CREATE TABLE IF NOT EXISTS site_example_counts (
    participant TEXT NOT NULL,
    federation  TEXT NOT NULL,
    data        BLOB NOT NULL,
    drawn_in    TEXT NOT NULL,
    count       INTEGER NOT NULL,
    released    INTEGER NOT NULL,
    sd          INTEGER NOT NULL,
    epsilon     REAL,
    delta       REAL,
    noise       TEXT,
    at          REAL NOT NULL,
    PRIMARY KEY (participant, federation)
);
CREATE TABLE IF NOT EXISTS site_plans (
    participant TEXT NOT NULL,
    federation  TEXT NOT NULL,
    terms       BLOB NOT NULL,
    at          REAL NOT NULL,
    PRIMARY KEY (participant, federation)
);
CREATE TABLE IF NOT EXISTS site_refusals (
    participant TEXT NOT NULL,
    task        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    rule        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    federation  TEXT NOT NULL,
    at          REAL NOT NULL
);
"""


@dataclass(frozen=True)
class ExampleCount:
    """A federation's training weight: the example count ``count`` it was drawn for
    and the value ``released`` that every update of the federation carries."""

    federation: str
    data: bytes
    """Fingerprint of the training split the count is of."""
    drawn_in: str
    """The federation whose draw this is: itself, or an earlier one on the same data
    whose value this federation reuses (no new release)."""
    count: int
    released: int
    sd: int
    """Standard deviation (examples) of the discrete Gaussian noise; 0: exact."""
    epsilon: float | None
    """ε of the release at ``delta`` (``None`` when exact: no bound)."""
    delta: float | None
    noise: dict[str, Any] = field(default_factory=dict)

    @property
    def reused(self) -> bool:
        """This federation sends an earlier federation's draw: nothing new left."""
        return self.drawn_in != self.federation

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> ExampleCount:
        federation, data, drawn_in, count, released, sd, eps, delta, noise = row
        return cls(
            federation=str(federation),
            data=bytes(data),
            drawn_in=str(drawn_in),
            count=int(count),
            released=int(released),
            sd=int(sd),
            epsilon=None if eps is None else float(eps),
            delta=None if delta is None else float(delta),
            noise=json.loads(noise) if noise else {},
        )


_COUNT_COLUMNS = "federation, data, drawn_in, count, released, sd, epsilon, delta, noise"


class ReleaseLedger:
    """Reserve-then-consume ledger of releases (thread-safe, durable, autocommit)."""

    def __init__(
        self,
        path: Path,
        *,
        participant: str = "",
        enforce: bool = True,
        rules: LedgerRules | None = None,
    ) -> None:
        self.path = path
        self.participant = participant
        """Whose releases (one state directory may, in tests, serve several ids)."""
        base = rules or LedgerRules()
        self.rules = (
            base
            if enforce
            else LedgerRules(
                one_update_per_round=False,
                one_release_per_model=False,
                exact_data_once=False,
                exact_in_one_federation=False,
                max_evaluations_per_federation=0,
                max_evaluations_per_split=0,
                max_unreleased_attempts=0,
            )
        )
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._checks = ReleaseConflicts(lambda: self._conn, participant, self.rules)
        """What a new release conflicts with (:mod:`spherecal.participant.release_rules`),
        asked inside this ledger's lock."""

    @property
    def enforce(self) -> bool:
        return self.rules.one_release_per_model

    @property
    def _conn(self) -> sqlite3.Connection:
        """Opened on first use (a participant that never releases creates no file)."""
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30.0
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(site_releases)")}
            if "answer" not in columns:  # a ledger written before the column existed
                self._db.execute("ALTER TABLE site_releases ADD COLUMN answer TEXT")
            if "value" not in columns:  # likewise (before 2026-11-27)
                self._db.execute("ALTER TABLE site_releases ADD COLUMN value BLOB")
            if "executed" not in columns:  # likewise (before 2026-11-27)
                self._db.execute("ALTER TABLE site_releases ADD COLUMN executed BLOB")
            if "trained" not in columns:  # likewise (before 2026-11-27)
                self._db.execute("ALTER TABLE site_releases ADD COLUMN trained BLOB")
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def split_evaluations(self, data: bytes) -> tuple[int, int]:
        """How many evaluation releases of the split fingerprinted ``data`` left this
        site, and in how many federations (for the site's log at join)."""
        with self._lock:
            return self._checks.split_evaluations(data)

    # ------------------------------------------------------------ life cycle
    def reserve(self, release: Release, *, job: str) -> None:
        """Admit a task (nothing leaves yet); raise :class:`ReleaseRepeated` when a
        rule forbids the release (:class:`EvaluationsExhausted` when it is the
        federation's evaluation count, :class:`AttemptsExhausted` when a new key's
        purpose holds the most unreleased attempts, :meth:`ReleaseConflicts.attempts`).

        A key reserved again while nothing has left under it takes the new
        reservation's ε, δ and noise where it states them (an evaluation's, planned
        from the job spec it comes with): the spec is the coordinator's, and what
        leaves is planned from the latest one. Until 2026-11-27 the row kept the
        first: an evaluation reserved under a spec of ``scale_bits`` 0 (ε ≈ 4.2),
        refused before its keys were made, then run under the same job id at
        ``scale_bits`` 10, left with noise of ε ≈ 14.2 and was recorded — and
        audited — at 4.2."""
        with self._lock:
            kept = self._check_key(release, job)
            conflict = self._checks.conflict(release, job)
            if conflict is None and kept is None:  # a continued job is the same attempt
                conflict = self._checks.attempts(release, job)
            if conflict is not None:
                raise conflict
            if kept is not None and kept[7] != "released" and release.epsilon is not None:
                self._conn.execute(
                    "UPDATE site_releases SET epsilon = ?, delta = ?, noise = ? "
                    "WHERE participant = ? AND job = ?",
                    (
                        release.epsilon,
                        release.delta,
                        None
                        if release.noise is None
                        else json.dumps(release.noise, sort_keys=True),
                        self.participant,
                        job,
                    ),
                )
                return
            self._conn.execute(
                "INSERT OR IGNORE INTO site_releases (participant, job, kind, family, "
                "federation, model, data, content, round, noised, epsilon, delta, noise, "
                "state, reserved) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'reserved', ?)",
                (
                    self.participant,
                    job,
                    release.kind,
                    release.family,
                    release.federation,
                    bytes(release.model),
                    bytes(release.data),
                    bytes(release.content),
                    release.round,
                    int(release.noised),
                    release.epsilon,
                    release.delta,
                    None if release.noise is None else json.dumps(release.noise, sort_keys=True),
                    time.time(),
                ),
            )

    def _check_key(self, release: Release, job: str) -> tuple[Any, ...] | None:
        """A key already in the ledger admits only the release it was reserved for;
        returns its row (:meth:`_kept`), None for a new key.

        Why: the key is a string the coordinator chooses (a secure job's id; for a
        plaintext release, ``task-<task id>``), and every rule above skips the rows
        of the key being reserved, so that a job continued after a restart is not
        refused by its own row. Without this check a second task under a used key
        passed every rule and was never counted: six evaluations of other heads under
        one task id where the site allows four. (What a plaintext key lets leave
        again is checked when it leaves: :meth:`consume`'s ``value``.)

        Whether the release is noised is part of what it is: the row keeps the
        first reservation's flag, and the rules that count exact releases only
        (``exact_data_once``, ``exact_in_one_federation``) read it. Until 2026-11-27
        it was not compared, and a key reserved for a DP statistics release that the
        site then refused (its plan named another kind) admitted the *exact*
        statistics under the same job id: they left recorded as noised, the site's
        audit showed no exact release, and the same data's exact moments left again
        in the next federation."""
        row = self._kept(job)
        if row is None:
            return None
        # what the release is (its ε and noise are annotated once its DP plan is
        # admitted, so a continued job's second reservation carries none yet; whether
        # it is noised is known at reservation)
        terms = (
            release.kind,
            release.federation,
            bytes(release.model),
            bytes(release.data),
            bytes(release.content),
            release.round,
            bool(release.noised),
        )
        kept = (
            str(row[0]),
            str(row[1]),
            bytes(row[2]),
            bytes(row[3]),
            bytes(row[4]),
            row[5],
            bool(row[6]),
        )
        if kept != terms:
            noise = "" if kept[:6] != terms[:6] else ", with DP noise" if row[6] else ", exact"
            raise ReleaseRepeated(
                f"the key {job[:24]!r} was reserved for another release ({row[0]}, "
                f"federation {row[1]!r}{noise}); a key admits one release"
            )
        return row

    def _kept(self, job: str) -> tuple[Any, ...] | None:
        """The row of key ``job``: ``kind, federation, model, data, content, round,
        noised, state, answer, value, trained`` (None when the key is new)."""
        row: tuple[Any, ...] | None = self._conn.execute(
            "SELECT kind, federation, model, data, content, round, noised, state, answer, "
            "value, trained FROM site_releases WHERE participant = ? AND job = ?",
            (self.participant, job),
        ).fetchone()
        return row

    def check_consumable(self, job: str) -> None:
        """Raise what :meth:`consume` would raise for ``job`` now (a concurrent job's
        release that left first), writing nothing.

        Why: a secure job's masked step does data-dependent work before the charge
        — a set input is masked, stored and synced (milliseconds per 10⁵ entries), a
        withheld one is not — so a refusal found only at the charge came later for
        a set input than for a withheld one. Checked first, it comes at the same
        moment for both, before any of that work (``SecureSteps``)."""
        with self._lock:
            row = self._kept(job)
            if row is None or row[7] == "released":
                return
            conflict = self._checks.conflict(_release_of(row), job)
            if conflict is not None:
                raise conflict

    def consume(self, job: str, *, answer: str = INPUT, value: bytes | None = None) -> None:
        """The input of ``job`` is about to leave: re-check and record it, atomically.
        Idempotent for one job (a retried upload); unknown jobs are a no-op.

        ``value``: the SHA-256 of a plaintext value about to leave (a plaintext key
        is ``task-<task id>``, which the coordinator picks, and nothing but this
        ledger stops a second upload under it). A key whose value already left admits
        the same value again — a coordinator that restarted asks the same task again
        and the site sends the bytes it kept as they left
        (``participant.sent_plaintext``; without them, recomputed bit for bit, which
        local DP-SGD's fresh noise never is) — and refuses any other: before
        2026-11-27 a round's update trained again under the same task id with another
        seed left twice. (A secure job's one masked input is the job's own.)

        ``answer``: what leaves in the release's place — :data:`INPUT` (the input,
        masked or not) or :data:`REFUSAL` (a refusal that depends on the data, which
        counts as the release: ``participant.secure_jobs``, *a refusal that depends on
        the data is the job's release*). A job charged for a refusal whose input
        leaves after all (the site restarted between the charge and the refusal, and
        its data changed meanwhile) is recorded as :data:`INPUT`: the stricter truth."""
        if answer not in (INPUT, REFUSAL):
            raise ValueError(f"answer must be {INPUT!r} or {REFUSAL!r}, got {answer!r}")
        with self._lock:
            row = self._kept(job)
            if row is None:
                return
            if row[7] == "released":
                if answer == INPUT and row[8] == REFUSAL:
                    self._conn.execute(
                        "UPDATE site_releases SET answer = ?, value = ? "
                        "WHERE participant = ? AND job = ?",
                        (INPUT, value, self.participant, job),
                    )
                elif value is not None and answer == INPUT and row[9] != value:
                    raise ReleaseRepeated(
                        f"a value under the key {job[:24]!r} already left this site, and "
                        "this one differs; a key admits one value"
                    )
                return
            release = _release_of(row)
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                conflict = self._checks.conflict(release, job)
                if conflict is not None:
                    raise conflict
                self._conn.execute(
                    "UPDATE site_releases SET state = 'released', released = ?, answer = ?, "
                    "value = ? WHERE participant = ? AND job = ?",
                    (time.time(), answer, value, self.participant, job),
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def annotate(
        self,
        job: str,
        *,
        epsilon: float | None,
        delta: float | None,
        noise: dict[str, Any] | None,
    ) -> None:
        """The noise and ε of a reserved release, once its DP plan is admitted. A row
        already released keeps what it records: what left, left at its own ε (a
        continued job is answered with its first plan, ``_answer_once``; this is the
        ledger's own guard, so no later path can rewrite a spent release's ε)."""
        with self._lock:
            self._conn.execute(
                "UPDATE site_releases SET noised = 1, epsilon = ?, delta = ?, noise = ? "
                "WHERE participant = ? AND job = ? AND state = 'reserved'",
                (
                    epsilon,
                    delta,
                    None if noise is None else json.dumps(noise, sort_keys=True),
                    self.participant,
                    job,
                ),
            )

    def record_executed(self, job: str, digest: bytes) -> None:
        """The executed-model digest of a training release, once its model is
        downloaded (before anything of the update is computed or leaves).

        Why a column of its own: a training release is reserved before its model is
        downloaded — the keys are advertised before any data-dependent work — so its
        ``model`` is the digest of the model's wire bytes (float64), which the
        reservation of a continued job must match. Two rounds from one executed model
        with one seed give the same update (training is deterministic), and the site's
        audit pairs them; compared by their wire bytes, a model moved by one float64
        ulp in the second round — the same float32 network — made the pair look like
        two unrelated updates (:mod:`spherecal.site_audit` compares this digest)."""
        with self._lock:
            self._conn.execute(
                "UPDATE site_releases SET executed = ? WHERE participant = ? AND job = ?",
                (bytes(digest), self.participant, job),
            )

    def admit_update(self, job: str, *, executed: bytes, trained: bytes) -> None:
        """Record a training release's executed-model digest and update digest
        (:meth:`record_executed`; ``trained``:
        :meth:`spherecal.participant.trainer.LocalTrainer.update_digest`), once its
        model is downloaded and before any training; raise :class:`ReleaseRepeated`
        when an exact update of the same digest already left, in any federation
        (:meth:`ReleaseConflicts.repeated_update`).

        Why: the rule one update per ``(federation, round)`` keys on the round index,
        which the coordinator chooses. Until 2026-11-27 round 1 from model ``M`` and
        round 2 from ``M`` moved by one float64 ulp (the same float32 network), with
        one seed, over rosters that differ by one site, were two admitted updates —
        bit for bit the same, so the two sums' difference was the missing site's
        update — and only the site's audit flagged the pair afterwards. The refusal
        depends only on what the coordinator sent (nothing of the data), so it goes
        out at once. A continued job (the same key after a restart) is its own
        release, not another; :meth:`consume` checks the rule again atomically, so
        two concurrent jobs of one update cannot both leave."""
        with self._lock:
            row = self._kept(job)
            if row is None:
                return
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if row[7] != "released":
                    repeated = self._checks.repeated_update(
                        dataclasses.replace(_release_of(row), trained=bytes(trained)), job
                    )
                    if repeated is not None:
                        raise ReleaseRepeated(repeated)
                self._conn.execute(
                    "UPDATE site_releases SET executed = ?, trained = ? "
                    "WHERE participant = ? AND job = ?",
                    (bytes(executed), bytes(trained), self.participant, job),
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def record_survivors(self, job: str, survivors: list[str], signers: list[str]) -> None:
        """The survivor set this release was summed with (from the unmask request,
        with the participants whose signatures over it came along)."""
        with self._lock:
            self._conn.execute(
                "UPDATE site_releases SET survivors = ?, signers = ? WHERE participant = ? "
                "AND job = ?",
                (json.dumps(sorted(survivors)), json.dumps(sorted(signers)), self.participant, job),
            )

    def record_refusal(
        self, *, task: str, kind: str, rule: str, reason: str, federation: str
    ) -> None:
        """A refusal (for the site's own audit)."""
        with self._lock:
            self._conn.execute(
                "INSERT INTO site_refusals (participant, task, kind, rule, reason, federation, "
                "at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (self.participant, task, kind, rule, reason[:300], federation, time.time()),
            )

    def fix_plan(self, federation: str, terms: bytes) -> bytes | None:
        """Keep ``terms`` as ``federation``'s plan if it has none yet; return the terms
        kept before when they differ (``None``: the same, or now kept). One transaction,
        so two processes of a site cannot both keep a plan
        (:mod:`spherecal.participant.fixed_plan`)."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "SELECT terms FROM site_plans WHERE participant = ? AND federation = ?",
                    (self.participant, federation),
                ).fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO site_plans (participant, federation, terms, at) "
                        "VALUES (?, ?, ?, ?)",
                        (self.participant, federation, terms, time.time()),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        if row is None or bytes(row[0]) == terms:
            return None
        return bytes(row[0])

    def example_count(self, federation: str) -> ExampleCount | None:
        """The training weight this site sent in ``federation``, if any."""
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_COUNT_COLUMNS} FROM site_example_counts WHERE participant = ? "
                "AND federation = ?",
                (self.participant, federation),
            ).fetchone()
        return None if row is None else ExampleCount.from_row(row)

    def example_count_of_data(self, data: bytes, sd: int) -> ExampleCount | None:
        """The first draw this site made at ``sd`` for a training split of fingerprint
        ``data``, in any federation."""
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_COUNT_COLUMNS} FROM site_example_counts WHERE participant = ? "
                "AND data = ? AND sd = ? AND drawn_in = federation ORDER BY at LIMIT 1",
                (self.participant, bytes(data), int(sd)),
            ).fetchone()
        return None if row is None else ExampleCount.from_row(row)

    def record_example_count(self, drawn: ExampleCount) -> ExampleCount:
        """Keep ``drawn`` as its federation's training weight unless one is already
        kept, and return the one kept: the first wins, also against a concurrent one,
        so every round of a federation leaves with the same value."""
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO site_example_counts (participant, federation, data, "
                "drawn_in, count, released, sd, epsilon, delta, noise, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self.participant,
                    drawn.federation,
                    bytes(drawn.data),
                    drawn.drawn_in,
                    drawn.count,
                    drawn.released,
                    drawn.sd,
                    drawn.epsilon,
                    drawn.delta,
                    json.dumps(drawn.noise, sort_keys=True),
                    time.time(),
                ),
            )
            row = self._conn.execute(
                f"SELECT {_COUNT_COLUMNS} FROM site_example_counts WHERE participant = ? "
                "AND federation = ?",
                (self.participant, drawn.federation),
            ).fetchone()
        return ExampleCount.from_row(row)

    def example_counts(self) -> list[ExampleCount]:
        """Every training weight this site sent, oldest first (audit)."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COUNT_COLUMNS} FROM site_example_counts WHERE participant = ? "
                "ORDER BY at",
                (self.participant,),
            ).fetchall()
        return [ExampleCount.from_row(r) for r in rows]

    def released(self) -> list[tuple[str, str, str]]:
        """(job, kind, federation) of every consumed release (tests, audit)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT job, kind, federation FROM site_releases WHERE participant = ? "
                "AND state = 'released' ORDER BY released",
                (self.participant,),
            ).fetchall()
        return [(str(a), str(b), str(c)) for a, b, c in rows]
