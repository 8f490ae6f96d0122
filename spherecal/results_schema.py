"""The shapes of the JSON documents the composition root writes: ``results.json`` of
``spherecal simulate``, ``audit.json`` of ``spherecal audit``, and the cells and
``results.json`` of ``spherecal experiment``. The coordinator's ``summary.json``,
which ``results.json`` carries on, is declared where it is written:
:mod:`spherecal.coordinator.summary_schema`.

TypedDicts, for the reasons given there (docs/design.md §6): the documents are JSON
for people and other tools, a TypedDict is the ``dict`` that ``json`` reads and
writes, and mypy checks every key our writers set and our readers ask for.
``tests/json_shape.py`` holds real documents against these declarations, key by
key (the tests that do are listed in ``tests/unit/spherecal/test_results_shape.py``);
the field-by-field prose is in ``docs/deployment.md`` (``results.json``),
``docs/privacy.md`` (``audit.json``) and ``docs/baselines.md`` (the experiment's
``results.json``).

Typed end to end: ``results.json`` (every engine's writer), ``audit.json``'s writer,
its checks and its text and HTML pages (:mod:`spherecal.audit_report`,
:mod:`spherecal.audit_html`), the experiment's cells; ``spherecal report``
(:mod:`spherecal.run_report`) reads its own ``RunDocument``, the keys it draws with
all but ``status`` optional, since it also draws older documents. The experiment's
``results.json`` builder returns :class:`ExperimentResults`; still read as plain
mappings: its table and plots (:mod:`spherecal.experiment.markdown`,
:mod:`spherecal.experiment.plots`), which walk ``settings`` (JSON) and the
calibration entries keyed by data (``ffc_gain``, ``oracle_gap``, …); those
documents are still held against the declarations at run time by the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict

from spherecal.coordinator.summary_schema import (
    Accuracy,
    Coverage,
    Exclusion,
    FederatedEvaluation,
    HeadlineCoverage,
    HistoryRow,
    JobSummary,
    JsonObject,
    JsonValue,
    ModelShape,
    PrivacySummary,
    Refusal,
    Retries,
    RoundMetrics,
    Status,
    Timings,
    Traffic,
)

__all__ = [
    "AuditCheck",
    "AuditChecks",
    "AuditEvidence",
    "AuditRun",
    "EmpiricalAudit",
    "AuditDocument",
    "CellRecord",
    "ExperimentResults",
    "ExperimentSettingsDocument",
    "ExperimentTimings",
    "calibration_stats",
    "ReferenceSettings",
    "GainSeed",
    "ServiceCell",
    "SimulationResults",
]

# ------------------------------------------------------------ results.json (simulate)


class ReferenceSettings(TypedDict):
    """``ReferenceConfig.to_json()``: every setting of a reference run (declared here,
    not beside the dataclass, so that reading a document imports no torch)."""

    dataset: str
    data_root: str | None
    samples: NotRequired[int]  # mnist1d only
    participants: int
    partition: str
    alpha: float
    shards_per_client: int
    model: str
    norm: str
    head: str
    classifier: str
    loss: str
    algorithm: str
    prox_mu: float
    fedopt_lr: float
    rounds: int
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    sample_fraction: float
    validation_fraction: float
    seed: int
    ffc_ridge: float
    ccvr: dict[str, float | int | bool]  # CCVRConfig
    calibrations: list[str]
    ridge_grid: list[float]
    shrinkage_grid: list[float]
    secure_sum: NotRequired[bool]  # only when true
    oracle_lrs: list[float]
    oracle_epochs: int
    synthetic: NotRequired[dict[str, float | int]]  # SyntheticConfig; synthetic data only


class SimulationSettings(ReferenceSettings):
    """``results.json`` ``settings``: the reference settings plus the harness's."""

    calibration: list[str]
    secure_updates: bool
    secure_statistics: bool
    threshold: int | None
    ffc_from_ccvr: bool
    drop: list[str]
    adversary: list[str]
    tls: bool
    threads: int | None
    epsilon: float | None
    delta: float | None
    dp_mechanism: str | None
    dp_budget: float | None


class SimulationTimings(Timings):
    wall_s: float  # the harness's wall clock, start to results.json


class EngineInfo(TypedDict):
    """Which engine hosted the participants (``results.json`` ``engine``)."""

    name: str
    workers: NotRequired[int]  # ray
    worker_cpus: NotRequired[float]
    address: NotRequired[str | None]
    nodes: NotRequired[list[str]]


class Dropped(TypedDict):
    """A participant the harness killed or cut off (``results.json`` ``dropped``)."""

    participant: str
    stage: str  # the secure-aggregation stage it was halted at, or "external"
    job: str  # the job's purpose, or "-"
    task_or_job_id: str
    how: str
    at_s: float  # seconds after the harness started


class SimulationResults(TypedDict):
    """``results.json`` of ``spherecal simulate`` (docs/deployment.md): the
    coordinator's summary and what only the harness knows."""

    schema: str
    federation_id: str | None
    status: Status | None
    status_reasons: list[str]
    errors: list[str]
    warnings: list[str]
    settings: SimulationSettings
    accuracy: Accuracy | None
    accuracy_covers: HeadlineCoverage | None
    central_accuracy: Accuracy | None
    validation_accuracy: Accuracy | None
    calibration: JsonObject | None
    calibration_release: JsonObject
    validation_evaluation: JsonObject | None
    federated_evaluation: FederatedEvaluation | None
    per_round: list[RoundMetrics]
    history: list[HistoryRow]
    jobs: list[JobSummary]
    statistics: dict[str, JsonObject]
    integrity: JsonObject | None
    ccvr: JsonObject | None
    timings: SimulationTimings
    bytes: Traffic
    dropped: list[Dropped]
    drops_not_triggered: list[str]
    exit_codes: dict[str, int | None]
    coordinator_starts: int
    resumed_after_round: int | None
    coverage: Coverage | None
    retries: Retries | None
    audit_log: str | None
    models: JsonObject
    saved_statistics: dict[str, str]
    model: ModelShape | None
    privacy: PrivacySummary
    refusals: list[Refusal]
    excluded: list[Exclusion]
    logs: str
    engine: NotRequired[EngineInfo]  # --engine threads / ray


# ------------------------------------------------------------ audit.json


class AuditRun(TypedDict):
    """Which run an audit is of (``audit.json`` ``run``); None where not known."""

    federation_id: str | None
    name: str | None
    status: str | None
    started: str | None
    ended: str | None
    sites: list[str]
    joined: list[str]
    coordinator: str | None
    database: str


class AuditEvidence(TypedDict):
    """The evidence of one audit check. The keys differ per check; each is declared
    with the check that writes it (``spherecal/audit.py``, ``audit_integrity.py``,
    ``audit_policy.py``)."""

    violations: Sequence[JsonValue]  # objects naming what failed; budgets: subject names
    # masked_uniformity, mask_reuse
    samples: NotRequired[int]
    pairs: NotRequired[int]
    p_threshold: NotRequired[float]
    # aggregate_inputs
    min_participants: NotRequired[int]
    jobs: NotRequired[list[JsonObject]]
    # dp_releases
    enabled: NotRequired[bool]
    releases: NotRequired[list[JsonObject]]
    # budgets
    delta: NotRequired[float]
    epsilon_per_release: NotRequired[float | None]
    total_epsilon: NotRequired[float | None]
    subjects: NotRequired[dict[str, JsonObject]]
    # participant_policy
    refusals: NotRequired[list[JsonObject]]
    excluded: NotRequired[list[JsonObject]]
    # integrity
    max_examples_per_site: NotRequired[int | None]
    cross_checks: NotRequired[list[JsonObject]]
    gate: NotRequired[JsonObject]
    withheld_dp_heads: NotRequired[list[str]]


class AuditCheck(AuditEvidence):
    """One check of ``audit.json`` ``checks``: the verdict, a sentence, the evidence."""

    ok: bool
    summary: str


class AuditChecks(TypedDict):
    no_plaintext_statistics: AuditCheck
    masked_uniformity: AuditCheck
    mask_reuse: AuditCheck
    aggregate_inputs: AuditCheck
    share_reveals: AuditCheck
    dp_releases: AuditCheck
    budgets: AuditCheck
    participant_policy: AuditCheck
    integrity: AuditCheck


class ProtectedPart(TypedDict):
    """How one kind of value left the sites (``audit.json`` ``protection``)."""

    transport: str
    dp: str
    secure_jobs: int
    plaintext_uploads: int
    dpsgd_sites: NotRequired[list[str]]  # model updates
    distributed_dpsgd_steps: NotRequired[int]  # model updates (issue #25)
    dp_releases: NotRequired[int]  # calibration statistics


class Protection(TypedDict):
    model_updates: ProtectedPart
    calibration_statistics: ProtectedPart
    updates_without_dp: bool


class Payloads(TypedDict):
    count: int
    rows: list[JsonObject]


class EmpiricalAudit(TypedDict):
    """``--empirical``: the canary audit's figures (or why it was skipped)."""

    empirical: JsonObject
    epsilon_claimed: NotRequired[float]
    epsilon_empirical_lower: NotRequired[float]
    tightness: NotRequired[float]


class AuditDocument(TypedDict):
    """``audit.json`` (docs/privacy.md, "spherecal audit: the report and audit.json")."""

    schema: str
    database: str
    federation_id: str | None
    run: AuditRun
    ok: bool
    privacy: JsonObject
    protection: Protection
    checks: AuditChecks
    payloads: Payloads
    # --empirical: the canary audit of the calibration mechanism
    epsilon_claimed: NotRequired[float]
    epsilon_empirical_lower: NotRequired[float]
    tightness: NotRequired[float]
    empirical: NotRequired[JsonObject]
    # not written to the file: where it went (returned by ``run_audit``)
    path: NotRequired[str]
    html: NotRequired[str]


# ------------------------------------------------------------ spherecal experiment


class CellRun(TypedDict):
    method: str
    column: str
    seed: int
    lr: float
    temperature: float
    oracle: bool


class CellIdentity(TypedDict):
    """Everything that determines a cell's numbers; its SHA-256 is the cell's key."""

    format: int
    config: ReferenceSettings
    method: JsonObject
    oracle: bool
    engine: NotRequired[str]  # absent for the in-process engine
    secure_sum_bound: NotRequired[str]  # with --secure-sum: how its fixed-point scale is chosen


class CellService(TypedDict):
    """How a cell trained through the service ran (``--engine service``)."""

    hosting: str
    wall_s: NotRequired[float | None]
    bytes: NotRequired[Traffic]
    dropped: NotRequired[list[Dropped]]


class ServiceCell(TypedDict):
    """What training a cell through the service adds to its :class:`CellRecord`."""

    engine: str
    service: CellService
    diverged: NotRequired[bool]
    error: NotRequired[str]
    accuracy: NotRequired[dict[str, float]]
    validation_accuracy: NotRequired[dict[str, float]]
    per_round: NotRequired[list[float | None]]
    train_loss: NotRequired[list[float | None]]


class CellRecord(TypedDict):
    """One trained cell of ``spherecal experiment`` (``DIR/cells/<key>.json``)."""

    key: str
    run: CellRun
    identity: CellIdentity
    engine: NotRequired[str]
    service: NotRequired[CellService]
    diverged: bool
    error: NotRequired[str]
    accuracy: NotRequired[dict[str, float]]
    validation_accuracy: NotRequired[dict[str, float]]
    per_round: NotRequired[list[float | None]]
    train_loss: NotRequired[list[float | None]]
    oracle: NotRequired[JsonObject]
    calibration: NotRequired[dict[str, float | None]]
    warnings: list[str]
    seconds: float


class ExperimentColumn(TypedDict):
    key: str
    label: str
    partition: str
    alpha: float | str | None
    shards: int | None


class ExperimentMethod(TypedDict):
    key: str
    label: str
    family: str
    algorithm: str
    head: str
    classifier: str
    loss: str
    source: str


class SkippedMethod(TypedDict):
    key: str
    label: str
    reason: str


class Stats(TypedDict):
    """Mean, spread and count over seeds (``selection.stats``)."""

    mean: float | None
    std: float | None
    n: int


class GainSeed(TypedDict):
    """One seed of ``calibration.<method>.<column>.per_seed``: the run selected
    without calibration and every head's test accuracy on it."""

    seed: int
    diverged: NotRequired[bool]
    lr: NotRequired[float]
    temperature: NotRequired[float]
    test: NotRequired[dict[str, float | None]]
    cell: NotRequired[str]
    chosen: NotRequired[dict[str, float | None]]
    oracle_cell: NotRequired[str]


class RowSeed(TypedDict):
    seed: int
    diverged: NotRequired[bool]
    lr: NotRequired[float]
    temperature: NotRequired[float]
    test: NotRequired[float]
    validation: NotRequired[float]
    cell: NotRequired[str]


class RowColumn(Stats):
    diverged_seeds: int
    per_seed: list[RowSeed]
    lr_grid: list[float]


class ExperimentRow(TypedDict):
    """One row of the table: a method with one calibration, per column."""

    method: str
    label: str
    family: str
    calibration: str
    selection: str
    columns: dict[str, RowColumn]


class Curve(TypedDict):
    mean: list[float]
    std: list[float]


class WarningCount(TypedDict):
    warning: str
    runs: int
    example: str


class Environment(TypedDict):
    python: str
    torch: str
    numpy: str
    threads: int
    workers: int
    cpus: int | None


class ExperimentSettingsDocument(TypedDict):
    """``settings`` of the experiment's ``results.json``: the grid's own fields
    (:meth:`ExperimentSettings.to_json`) and what the builder adds (the columns as
    run, the seeds' list, the base configuration, the lr and temperature grids).
    Keys added after the first committed tables are ``NotRequired``."""

    table: str
    dataset: str
    data_root: str | None
    samples: NotRequired[int | None]
    alphas: list[float | str]
    shards: list[int]
    seeds: list[int]
    participants: int
    rounds: int
    local_epochs: int
    batch_size: int
    model: str
    lr_grid: list[float] | None
    methods: list[str] | None
    fedopt_lr: float
    synthetic: NotRequired[JsonObject]
    quick: bool
    engine: NotRequired[str]
    hosting: NotRequired[str]
    secure_sum: NotRequired[bool]
    columns: list[ExperimentColumn]
    base_config: JsonObject
    lr_grids: dict[str, list[float]]
    temperature_grids: dict[str, list[float]]
    selection: str


class ExperimentTimings(TypedDict, total=False):
    """``timings`` of the experiment's ``results.json`` (absent keys read as 0)."""

    wall_s: float
    cells_run: int
    cells_cached: int
    cells_compute_s: float


def calibration_stats(cell: JsonObject, name: str) -> Stats | None:
    """One calibration's :class:`Stats` from a ``calibration.<method>.<column>``
    object, or ``None`` where the cell has none.

    Those objects are keyed by data (``none``, ``ffc``, ``ffc_gain``, ``ffc_gap``,
    ``per_seed`` …), so they are declared JSON; this is the one place that reads a
    calibration's numbers out of them, and it refuses anything that is not a
    :class:`Stats` rather than letting a key typo read as "absent"."""
    value = cell.get(name)
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or set(value) != {"mean", "std", "n"}
        or not isinstance(value["n"], int)
        or not all(v is None or isinstance(v, (int, float)) for v in (value["mean"], value["std"]))
    ):
        raise ValueError(f"calibration entry {name!r} is not mean/std/n: {value!r}")
    mean, std, n = value["mean"], value["std"], value["n"]
    stats: Stats = {
        "mean": float(mean) if isinstance(mean, (int, float)) else None,
        "std": float(std) if isinstance(std, (int, float)) else None,
        "n": n,
    }
    return stats


class ExperimentResults(TypedDict):
    """``results.json`` of ``spherecal experiment`` (docs/baselines.md, "results.json").

    ``calibration`` (per method, per column) holds ``none`` and per calibration ``c``
    the keys ``c`` and ``c_gain`` (and with the oracle ``c_gap``): named by data, so
    a :data:`JsonObject` checked as JSON."""

    schema: str
    table: str
    # engine and skipped_methods: absent from the tables made before the service engine
    # (the committed docs/baselines/*/results.json)
    engine: NotRequired[str]
    hosting: NotRequired[dict[str, int]]
    skipped_methods: NotRequired[list[SkippedMethod]]
    command: str
    settings: ExperimentSettingsDocument
    methods: list[ExperimentMethod]
    rows: list[ExperimentRow]
    calibration: dict[str, dict[str, JsonObject]]
    curves: dict[str, dict[str, Curve]]
    lr_sweep: dict[str, dict[str, list[JsonObject]]]
    warnings: list[WarningCount]
    timings: ExperimentTimings
    environment: Environment
