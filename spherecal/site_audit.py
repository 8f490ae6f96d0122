"""``spherecal audit --site STATE_DIR``: a site's own audit, from its own ledger only.

Why: the coordinator's audit (:mod:`spherecal.audit`) reads the coordinator's
database — the party a site must not have to trust. A privacy officer at a site
runs this on the site's state directory alone: every value that left the site is a
row of its release ledger (``privacy.db``, table ``site_releases``, written by
:mod:`spherecal.participant.release_ledger`), with its kind, family, federation,
executed-model digest, data fingerprint, the signed survivor set it was summed
with, and its noise and ε; every refusal is a row of ``site_refusals``.

What it flags:

* **differencing pairs** — two releases of one family whose content is the same
  computation (training: same federation and round, or same executed model on the
  same data — a model moved by a float64 ulp is the same float32 network, and
  training from it with the same seed gives the same update;
  moments: same executed model on the same data, or both exact on the same data
  from any two models — a coordinator can vary weights the features never read, so
  the digest cannot tell a new model from one with the same features, and the
  ledger's ``exact_data_once`` refuses the second for that reason; evaluation: same
  executed model, data split and head contents) but whose survivor sets differ (or
  are unknown): the
  difference of their two sums is this site's input. A pair where either release
  is exact (no DP noise) is ``exact``. For moments and evaluations the default rules
  never let one through, so finding one means a rule was relaxed; two training rounds
  from one executed model they do admit (one update per round: the residual risk
  docs/threat_model.md names *Different training rounds*, which only DP-SGD bounds),
  so an exact training pair is a coordinator that sent a model again. A pair of
  noised releases is listed with the ε the two cost together.
* **started jobs that never released** — the ``reserved`` rows by purpose (a training
  round, the per-class moments, the federation's evaluations): jobs the coordinator
  abandoned before their input left, each one a reading of the local work's timing
  (or jobs still running), which the site bounds by ``[policy]
  max_unreleased_attempts``.
* **evaluations per split** — the released evaluations of each local split (its
  records, by fingerprint) across every federation, which the site bounds by
  ``[policy] max_evaluations_per_split`` for the split's lifetime: a count asked for
  in federation after federation on the same records averages its fresh noise down.
* **refusals** — each with its typed kind and rule (``RULE_RELEASE_REPEATED`` is a
  coordinator that asked twice; ``RULE_ATTEMPTS_EXHAUSTED`` one that started more jobs
  for a purpose than the site admits while nothing of them left — each such job is a
  ``reserved`` row among the releases, admitted and never left).
* **training weights** — the example count each federation's updates were weighted
  by (table ``site_example_counts``, :mod:`spherecal.participant.example_weight`):
  drawn once per training split with DP noise, so every round of a federation, and
  a later federation on the same data, carries the same value; each draw's ε is
  added to the site's total once. One with ``sd`` 0 left exactly
  (``[policy] example_count_noise_sd = 0``).
* **exact moments of changed data** — two *exact* releases of the per-class moments
  in different federations from different fingerprints of this site's data. The
  default rules refuse the second (since 2026-11-27); it is admitted under
  ``[policy] exact_moments_of_changed_data = true``, a logged weakening, and is
  found in ledgers written before. If the two models computed the same features —
  which the site cannot tell, since a coordinator can vary weights the features do
  not read — their difference is the statistics of the records that changed
  (docs/threat_model.md, "Exact statistics of data that grew"). Listed for the
  privacy officer to weigh; the exit status does not count them (a documented
  choice of the site's, or history).

A release whose ``answer`` is ``refusal`` is a job the site refused for a reason that
depends on its data (an input outside the job's bound, a failed local computation):
the refusal counted as the release, and nothing of the input left — so it is in no
differencing pair.

The exit status is 1 when an exact differencing pair exists, else 0 (2: unreadable).
The database is opened read-only, creating nothing beside it
(:mod:`spherecal.coordinator.state.read_only`): auditing never changes the ledger or
the site's state directory.
"""

from __future__ import annotations

import html
import json
import sqlite3
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from spherecal.coordinator.state.read_only import read_only

__all__ = [
    "ChangedDataPair",
    "DifferencingPair",
    "SiteAudit",
    "SiteAuditError",
    "SiteExampleCount",
    "SiteRefusal",
    "SiteRelease",
    "UnreleasedAttempts",
    "format_site_audit",
    "read_site_audit",
    "run_site_audit",
    "site_audit_html",
]


class SiteAuditError(Exception):
    """The state directory holds no readable release ledger."""


@dataclass(frozen=True)
class SiteRelease:
    participant: str
    job: str
    kind: str
    family: str
    federation: str
    model: str
    """Executed-model digest (hex). A training release is reserved before its model is
    downloaded, under the digest of the model's wire bytes; the executed model's is
    recorded once it is downloaded (``executed``) and shown here — a ledger written
    before 2026-11-27, or a round whose model was never downloaded, shows the wire
    digest."""
    data: str
    """Local data-split fingerprint (hex)."""
    content: str
    round: int | None
    """1-based, as the coordinator's log, status and summary count rounds (the
    ledger stores the wire's 0-based index); None for statistics and evaluation."""
    noised: bool
    epsilon: float | None
    delta: float | None
    noise: dict[str, Any] | None
    state: str
    """``released`` (it left the site) or ``reserved`` (admitted, never left)."""
    reserved: float
    released: float | None
    survivors: list[str] | None
    """The survivor set of the unmask request this site answered (None: not known —
    a plaintext release, or a job that never reached unmasking)."""
    signers: list[str] | None
    answer: str = "input"
    """What left in the release's place: ``input`` (the input, masked or plaintext)
    or ``refusal`` (a refusal that depends on the data, counted as the release; a
    ledger written before the column existed reads as ``input``)."""


@dataclass(frozen=True)
class SiteRefusal:
    participant: str
    task: str
    kind: str
    rule: str
    reason: str
    federation: str
    at: float


@dataclass(frozen=True)
class DifferencingPair:
    participant: str
    family: str
    first: str
    second: str
    why: str
    exact: bool
    """At least one of the two releases carried no DP noise."""
    epsilon: float | None
    """ε of the two noised releases together (basic composition), when both noised."""
    only_in_first: list[str] | None
    only_in_second: list[str] | None


@dataclass(frozen=True)
class ChangedDataPair:
    """Two exact releases of the per-class moments of changed data (module docstring)."""

    participant: str
    first: str
    second: str
    first_federation: str
    second_federation: str


@dataclass(frozen=True)
class SiteExampleCount:
    """The training weight one federation's updates carried (module docstring)."""

    participant: str
    federation: str
    drawn_in: str
    """The federation whose draw it is: this one, or an earlier one on the same
    training data whose value it sent again (no new release, no ε of its own)."""
    count: int
    released: int
    sd: int
    epsilon: float | None
    delta: float | None


@dataclass(frozen=True)
class UnreleasedAttempts:
    """Jobs a site admitted for one purpose whose input never left (module docstring).

    The site admits ``[policy] max_unreleased_attempts`` (3 by default) per purpose
    and refuses the next (``RULE_ATTEMPTS_EXHAUSTED``): each was either abandoned by
    the coordinator — during the local work, whose timing it then saw — or is still
    running."""

    participant: str
    federation: str
    purpose: str
    """``round N`` (1-based), ``moments`` or ``evaluations`` (counted together)."""
    jobs: list[str]


@dataclass(frozen=True)
class SplitEvaluations:
    """The evaluation releases of one local split (its records, by fingerprint)
    across every federation (module docstring).

    The site answers at most ``[policy] max_evaluations_per_split`` of them (by
    default ``max_evaluations_per_federation``'s value, 4) for the split's lifetime
    and refuses the next (``RULE_EVALUATIONS_EXHAUSTED``): the counts a coordinator
    can ask for again — the split's total, a constant head's label histogram — do not
    change with the federation."""

    participant: str
    split: str
    """The split's fingerprint (hex): the test and the validation split differ, and a
    split whose records changed is another."""
    evaluations: int
    federations: list[str]


@dataclass(frozen=True)
class SiteAudit:
    state_dir: str
    releases: list[SiteRelease]
    refusals: list[SiteRefusal]
    pairs: list[DifferencingPair]
    changed_data: list[ChangedDataPair] = field(default_factory=list)
    example_counts: list[SiteExampleCount] = field(default_factory=list)
    attempts: list[UnreleasedAttempts] = field(default_factory=list)
    splits: list[SplitEvaluations] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.exact for p in self.pairs)

    def to_json(self) -> dict[str, Any]:
        epsilon: dict[str, float] = {}
        for r in self.releases:
            if r.state == "released" and r.epsilon is not None:
                epsilon[r.participant] = epsilon.get(r.participant, 0.0) + r.epsilon
        for c in self.example_counts:
            if c.epsilon is not None and c.drawn_in == c.federation:
                epsilon[c.participant] = epsilon.get(c.participant, 0.0) + c.epsilon
        return {
            "state_dir": self.state_dir,
            "ok": self.ok,
            "releases": [asdict(r) for r in self.releases],
            "refusals": [asdict(r) for r in self.refusals],
            "differencing_pairs": [asdict(p) for p in self.pairs],
            "exact_moments_of_changed_data": [asdict(p) for p in self.changed_data],
            "example_counts": [asdict(c) for c in self.example_counts],
            "unreleased_attempts": [asdict(a) for a in self.attempts],
            "evaluations_per_split": [asdict(x) for x in self.splits],
            "epsilon_total": epsilon,
        }


def _ledger_path(state_dir: Path) -> Path:
    if not state_dir.exists():
        raise SiteAuditError(f"{state_dir}: no such directory (give the site's state_dir)")
    path = state_dir / "privacy.db" if state_dir.is_dir() else state_dir
    if not path.is_file():
        hint = (
            f"; a spherecal simulate run keeps each site's in {state_dir / 'state'}/<id>"
            if (state_dir / "state").is_dir()
            else ""
        )
        raise SiteAuditError(f"{state_dir}: no release ledger (privacy.db) there{hint}")
    return path


def _json_list(text: object) -> list[str] | None:
    return None if text is None else [str(x) for x in json.loads(str(text))]


def read_site_audit(state_dir: Path) -> SiteAudit:
    """Read one site's ledger (read-only) and find its differencing pairs."""
    path = _ledger_path(state_dir)
    with read_only(path) as conn:  # nothing created or changed beside the ledger
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "site_releases" not in tables:
            raise SiteAuditError(f"{path}: no site_releases table (nothing ever left this site)")
        columns = {r[1] for r in conn.execute("PRAGMA table_info(site_releases)")}
        answer = "answer" if "answer" in columns else "NULL"
        executed = "executed" if "executed" in columns else "NULL"
        rows = conn.execute(
            "SELECT participant, job, kind, family, federation, model, data, content, round, "
            f"noised, epsilon, delta, noise, state, reserved, released, survivors, signers, "
            f"{answer}, {executed} FROM site_releases ORDER BY participant, reserved"
        ).fetchall()
        refusal_rows = (
            conn.execute(
                "SELECT participant, task, kind, rule, reason, federation, at FROM site_refusals "
                "ORDER BY participant, at"
            ).fetchall()
            if "site_refusals" in tables
            else []
        )
        count_rows = (
            conn.execute(
                "SELECT participant, federation, drawn_in, count, released, sd, epsilon, "
                "delta FROM site_example_counts ORDER BY participant, at"
            ).fetchall()
            if "site_example_counts" in tables
            else []
        )
    releases = [
        SiteRelease(
            participant=str(r[0]),
            job=str(r[1]),
            kind=str(r[2]),
            family=str(r[3]),
            federation=str(r[4]),
            # a training row keys on its model's wire bytes; the executed model, once
            # downloaded, is what its update is computed from (record_executed)
            model=bytes(r[5] if r[19] is None else r[19]).hex(),
            data=bytes(r[6]).hex(),
            content=bytes(r[7]).hex(),
            round=None if r[8] is None else int(r[8]) + 1,
            noised=bool(r[9]),
            epsilon=None if r[10] is None else float(r[10]),
            delta=None if r[11] is None else float(r[11]),
            noise=None if r[12] is None else json.loads(str(r[12])),
            state=str(r[13]),
            reserved=float(r[14]),
            released=None if r[15] is None else float(r[15]),
            survivors=_json_list(r[16]),
            signers=_json_list(r[17]),
            answer="input" if r[18] is None else str(r[18]),
        )
        for r in rows
    ]
    refusals = [
        SiteRefusal(
            participant=str(r[0]),
            task=str(r[1]),
            kind=str(r[2]),
            rule=str(r[3]),
            reason=str(r[4]),
            federation=str(r[5]),
            at=float(r[6]),
        )
        for r in refusal_rows
    ]
    counts = [
        SiteExampleCount(
            participant=str(r[0]),
            federation=str(r[1]),
            drawn_in=str(r[2]),
            count=int(r[3]),
            released=int(r[4]),
            sd=int(r[5]),
            epsilon=None if r[6] is None else float(r[6]),
            delta=None if r[7] is None else float(r[7]),
        )
        for r in count_rows
    ]
    return SiteAudit(
        str(state_dir),
        releases,
        refusals,
        differencing_pairs(releases),
        changed_data_pairs(releases),
        counts,
        unreleased_attempts(releases),
        split_evaluations(releases),
    )


def _same_computation(a: SiteRelease, b: SiteRelease) -> str | None:
    """Why ``a`` and ``b`` are sums of the same computation of this site, or None."""
    if a.family != b.family or a.participant != b.participant:
        return None
    same_input = a.model == b.model and a.data == b.data
    if a.family == "training":
        if a.federation == b.federation and a.round == b.round:
            return f"the update of round {a.round} of federation {a.federation!r}, twice"
        return "an update from the same model on the same data, twice" if same_input else None
    if a.family == "evaluation":
        if same_input and a.content == b.content:
            return "the same evaluation (model, split, head contents), twice"
        return None
    if same_input:
        return "the per-class moments of the same model on the same data, twice"
    if a.data == b.data and not a.noised and not b.noised:
        # what the ledger's exact_data_once refuses: the executed-model digest cannot
        # tell a new model from one whose features are the same (unread weights)
        return (
            "the exact per-class moments of the same data, twice, from two executed "
            "models that may compute the same features"
        )
    return None


def differencing_pairs(releases: list[SiteRelease]) -> list[DifferencingPair]:
    """Every pair of released values of one computation over different (or unknown)
    survivor sets: their difference is this site's input (module docstring)."""
    out = []
    # a refusal counted as a release holds nothing of the input: no sum to difference
    left = [r for r in releases if r.state == "released" and r.answer != "refusal"]
    for a, b in combinations(left, 2):
        why = _same_computation(a, b)
        if why is None:
            continue
        if a.survivors is not None and b.survivors is not None and a.survivors == b.survivors:
            continue  # the same sum twice: nothing new
        exact = not (a.noised and b.noised)
        eps = None if exact or a.epsilon is None or b.epsilon is None else a.epsilon + b.epsilon
        known = a.survivors is not None and b.survivors is not None
        out.append(
            DifferencingPair(
                participant=a.participant,
                family=a.family,
                first=a.job,
                second=b.job,
                why=why,
                exact=exact,
                epsilon=eps,
                only_in_first=sorted(set(a.survivors or ()) - set(b.survivors or ()))
                if known
                else None,
                only_in_second=sorted(set(b.survivors or ()) - set(a.survivors or ()))
                if known
                else None,
            )
        )
    return out


def changed_data_pairs(releases: list[SiteRelease]) -> list[ChangedDataPair]:
    """Every pair of exact per-class-moment releases in different federations from
    different fingerprints of this site's data (module docstring)."""
    exact = [
        r
        for r in releases
        if r.state == "released"
        and r.answer != "refusal"
        and r.family == "moments"
        and not r.noised
    ]
    return [
        ChangedDataPair(a.participant, a.job, b.job, a.federation, b.federation)
        for a, b in combinations(exact, 2)
        if a.participant == b.participant and a.federation != b.federation and a.data != b.data
    ]


CHANGED_DATA_NOTE = (
    "exact per-class moments of two versions of this site's data; if the two models "
    "computed the same features, their difference is the statistics of the records "
    "that changed"
)


def unreleased_attempts(releases: list[SiteRelease]) -> list[UnreleasedAttempts]:
    """The ``reserved`` rows by site, federation and purpose — the purposes the site's
    ``[policy] max_unreleased_attempts`` counts (``ReleaseConflicts.attempts``): a
    training round, the per-class moments, the federation's evaluations together."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for r in releases:
        if r.state != "reserved":
            continue
        if r.family == "training":
            purpose = "round ?" if r.round is None else f"round {r.round}"
        elif r.family == "evaluation":
            purpose = "evaluations"
        else:
            purpose = "moments"
        groups.setdefault((r.participant, r.federation, purpose), []).append(r.job)
    return [
        UnreleasedAttempts(participant=p, federation=f, purpose=purpose, jobs=jobs)
        for (p, f, purpose), jobs in groups.items()
    ]


def split_evaluations(releases: list[SiteRelease]) -> list[SplitEvaluations]:
    """The released evaluations by site and split fingerprint, across federations —
    what ``[policy] max_evaluations_per_split`` counts (``ReleaseConflicts._split_spent``)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in releases:
        if r.state == "released" and r.family == "evaluation":
            groups.setdefault((r.participant, r.data), []).append(r.federation)
    return [
        SplitEvaluations(
            participant=p,
            split=data,
            evaluations=len(federations),
            federations=sorted(set(federations)),
        )
        for (p, data), federations in groups.items()
    ]


SPLITS_NOTE = (
    "evaluations of one split's records in all federations together; the site answers "
    "[policy] max_evaluations_per_split of them (by default max_evaluations_per_federation's "
    "value, 4) and refuses the rest until the split changes"
)


ATTEMPTS_NOTE = (
    "admitted, input never left: abandoned by the coordinator (it saw when the local work "
    "ended) or still running; the site admits [policy] max_unreleased_attempts (3; 12 "
    "for the evaluations together) per purpose"
)


def _short(digest: str) -> str:
    return digest[:12] if digest else "-"


def format_site_audit(audit: SiteAudit) -> str:
    """The report as text (one line per release, pair and refusal)."""
    lines = [f"site audit of {audit.state_dir}: {'OK' if audit.ok else 'EXACT DIFFERENCING'}"]
    lines.append(f"releases ({sum(r.state == 'released' for r in audit.releases)} left the site):")
    for r in audit.releases:
        noise = "noised" if r.noised else "exact"
        if r.epsilon is not None:
            noise = f"ε={r.epsilon:.3g}"
        roster = ",".join(r.survivors) if r.survivors is not None else "?"
        rnd = "" if r.round is None else f" round {r.round}"
        what = (
            "a refusal in its place (nothing of the input left)"
            if r.answer == "refusal"
            else f"survivors [{roster}]"
        )
        lines.append(
            f"  {r.participant} {r.state:8} {r.kind:8} {r.family:10} {r.federation}{rnd} "
            f"model {_short(r.model)} job {r.job[:16]} {noise} {what}"
        )
    lines.append(f"differencing pairs: {len(audit.pairs)}")
    for p in audit.pairs:
        tag = "EXACT" if p.exact else "noised"
        if not p.exact and p.epsilon is not None:
            tag = f"noised (ε {p.epsilon:.3g} together)"
        diff = (
            f"; only in first {p.only_in_first}, only in second {p.only_in_second}"
            if p.only_in_first is not None
            else "; survivor sets unknown"
        )
        lines.append(f"  {tag}: {p.first[:16]} vs {p.second[:16]}: {p.why}{diff}")
    lines.append(f"refusals: {len(audit.refusals)}")
    for f in audit.refusals:
        lines.append(f"  {f.participant} {f.task[:16]} {f.kind}/{f.rule}: {f.reason}")
    lines.append(f"training weights: {len(audit.example_counts)} (one per federation)")
    for w in audit.example_counts:
        noise = f"sd {w.sd}, ε={w.epsilon:.3g}" if w.epsilon is not None else "EXACT count"
        if w.drawn_in != w.federation:
            noise = f"sent again from {w.drawn_in}: no new release"
        lines.append(
            f"  {w.participant} {w.federation}: {w.released} sent for {w.count} examples ({noise})"
        )
    lines.append(f"started jobs that never released: {len(audit.attempts)} purpose(s)")
    for a in audit.attempts:
        lines.append(
            f"  {a.participant} {a.federation} {a.purpose}: {len(a.jobs)} job(s) ({ATTEMPTS_NOTE})"
        )
    lines.append(f"evaluations per split, all federations: {len(audit.splits)} split(s)")
    for x in audit.splits:
        lines.append(
            f"  {x.participant} split {_short(x.split)}: {x.evaluations} evaluation(s) in "
            f"{len(x.federations)} federation(s) ({', '.join(x.federations)}) ({SPLITS_NOTE})"
        )
    lines.append(f"exact moments of changed data: {len(audit.changed_data)}")
    for c in audit.changed_data:
        lines.append(
            f"  {c.first[:16]} ({c.first_federation}) vs {c.second[:16]} "
            f"({c.second_federation}): {CHANGED_DATA_NOTE}"
        )
    return "\n".join(lines)


def site_audit_html(audit: SiteAudit) -> str:
    """The report as one self-contained page (no scripts, no external resources)."""
    e = html.escape

    def table(head: list[str], rows: list[list[str]]) -> str:
        th = "".join(f"<th>{e(h)}</th>" for h in head)
        body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"

    releases = [
        [
            r.participant,
            r.state,
            r.kind,
            r.family,
            r.federation,
            "" if r.round is None else str(r.round),
            _short(r.model),
            r.job[:16],
            f"{r.epsilon:.3g}" if r.epsilon is not None else ("noised" if r.noised else "exact"),
            "a refusal in its place"
            if r.answer == "refusal"
            else (", ".join(r.survivors) if r.survivors is not None else "unknown"),
        ]
        for r in audit.releases
    ]
    pairs = [
        [
            "EXACT" if p.exact else "noised",
            p.first[:16],
            p.second[:16],
            p.why,
            "" if p.epsilon is None else f"{p.epsilon:.3g}",
        ]
        for p in audit.pairs
    ]
    refusals = [[f.participant, f.task[:16], f.kind, f.rule, f.reason] for f in audit.refusals]
    changed = [
        [c.first[:16], c.first_federation, c.second[:16], c.second_federation, CHANGED_DATA_NOTE]
        for c in audit.changed_data
    ]
    weights = [
        [
            c.participant,
            c.federation,
            str(c.count),
            str(c.released),
            str(c.sd),
            f"again from {c.drawn_in}"
            if c.drawn_in != c.federation
            else ("exact" if c.epsilon is None else f"{c.epsilon:.3g}"),
        ]
        for c in audit.example_counts
    ]
    attempts = [
        [
            a.participant,
            a.federation,
            a.purpose,
            str(len(a.jobs)),
            ", ".join(j[:16] for j in a.jobs),
        ]
        for a in audit.attempts
    ]
    splits = [
        [
            x.participant,
            _short(x.split),
            str(x.evaluations),
            ", ".join(x.federations),
        ]
        for x in audit.splits
    ]
    verdict = "OK: no exact differencing pair" if audit.ok else "EXACT DIFFERENCING PAIR FOUND"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>spherecal site audit</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #999;padding:2px 6px;font-size:90%}</style></head><body>"
        f"<h1>Site audit</h1><p>{e(audit.state_dir)}</p><h2>{e(verdict)}</h2>"
        "<h2>Releases</h2>"
        + table(
            [
                "site",
                "state",
                "kind",
                "family",
                "federation",
                "round",
                "model",
                "job",
                "ε / noise",
                "survivors",
            ],
            releases,
        )
        + "<h2>Differencing pairs</h2>"
        + table(["", "first", "second", "why", "ε together"], pairs)
        + "<h2>Refusals</h2>"
        + table(["site", "task", "kind", "rule", "reason"], refusals)
        + "<h2>Training weights (one per federation)</h2>"
        + table(["site", "federation", "examples", "sent", "sd", "ε"], weights)
        + "<h2>Started jobs that never released</h2>"
        + f"<p>{e(ATTEMPTS_NOTE)}</p>"
        + table(["site", "federation", "purpose", "jobs", "job ids"], attempts)
        + "<h2>Evaluations per split, all federations</h2>"
        + f"<p>{e(SPLITS_NOTE)}</p>"
        + table(["site", "split", "evaluations", "federations"], splits)
        + "<h2>Exact moments of changed data</h2>"
        + table(["first", "federation", "second", "federation", "what it means"], changed)
        + "</body></html>"
    )


def run_site_audit(
    state_dir: Path, *, html_path: Path | None = None, as_json: bool = False
) -> tuple[int, str]:
    """(exit status, text to print) for ``spherecal audit --site``."""
    try:
        audit = read_site_audit(state_dir)
    except sqlite3.DatabaseError as exc:
        return 2, (
            f"spherecal audit --site: error: {state_dir}: not a site's release ledger ({exc}); "
            "give the site's [participant] state_dir, which holds privacy.db"
        )
    except (SiteAuditError, OSError) as exc:
        return 2, f"spherecal audit --site: error: {exc}"
    if html_path is not None:
        html_path.write_text(site_audit_html(audit), encoding="utf-8")
    text = json.dumps(audit.to_json(), indent=2) if as_json else format_site_audit(audit)
    return (0 if audit.ok else 1), text
