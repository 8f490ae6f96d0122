"""The shape of the coordinator's ``summary.json``, declared once for its writer
(:func:`spherecal.coordinator.driver.outputs.summary`, ``main``) and its readers
(``spherecal status``, ``simulate``'s ``results.json``, the tests).

Why TypedDicts and not dataclasses: the document *is* JSON — written with
``json.dumps`` and read with ``json.loads`` by tools in any language — and a
TypedDict is a plain ``dict`` at run time, so nothing converts on either side and an
old file still loads; mypy checks every key a writer sets and a reader asks for.
The declarations are the schema: ``tests/json_shape.py`` holds real runs'
documents against them (every required key present, no key undeclared, value
types; the tests that do are listed in ``tests/unit/spherecal/test_results_shape.py``),
so a writer that drifts fails a test, and ``docs/deployment.md`` documents the same
fields for people.

What is typed by key: the document and every part a reader of ours looks into.
Parts whose keys are data (per participant, per head, per stage: ``dict[str, …]``)
are typed by their values; parts whose contents only pass through to people
(``integrity``, ``calibration_release``, the statistics' records, the privacy
ledger) are :data:`JsonObject`: JSON, checked as JSON, not by key.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypeAlias, TypedDict, TypeGuard

__all__ = [
    "AbortedSummary",
    "Accuracy",
    "ConductSummary",
    "CoordinatorSummary",
    "Coverage",
    "EndedResult",
    "EvaluationCounts",
    "EvaluationNoise",
    "Exclusion",
    "FederatedEvaluation",
    "HistoryRow",
    "JobSummary",
    "DriverResults",
    "JsonObject",
    "JsonValue",
    "ModelShape",
    "PrivacySummary",
    "PrivacyTotals",
    "Refusal",
    "Resources",
    "Retries",
    "RoundMetrics",
    "Status",
    "SummaryDocument",
    "SummarySettings",
    "Timings",
    "Traffic",
    "as_status",
    "is_complete",
]

JsonValue: TypeAlias = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
"""Any JSON value: what a part not typed by key may hold."""
JsonObject: TypeAlias = dict[str, JsonValue]
StageRecord: TypeAlias = dict[str, Any]
"""A JSON record a driver stage builds up in place (see :class:`DriverResults`)."""

SUMMARY_SCHEMA = "spherecal.coordinator-summary/1"

Status = Literal["completed", "degraded", "failed", "stopped", "stopping", "running"]
"""``completed``/``degraded``/``failed`` end a federation
(:mod:`spherecal.coordinator.driver.verdict`); ``stopped`` is one whose coordinator
process stopped before its end (SIGTERM, Ctrl-C, a storage fault, the stop
watchdog): not over — the same command with the same ``state_dir`` resumes it, as
the database's ``stopped`` says; ``stopping`` is what the sites are told meanwhile
(``Done(status="stopping")``), and ``running`` a summary taken before the end."""

STATUSES: tuple[Status, ...] = (
    "completed",
    "degraded",
    "failed",
    "stopped",
    "stopping",
    "running",
)


def as_status(value: str) -> Status:
    """``value`` as a :data:`Status`; a ValueError for anything else (the board keeps
    its status as a plain string)."""
    for status in STATUSES:
        if value == status:
            return status
    raise ValueError(f"unknown federation status {value!r}; expected one of {STATUSES}")


Accuracy: TypeAlias = dict[str, float | None]
"""Test accuracy per head (``none``, ``ffc``, ``ccvr``, ``lda``, …); None where a head
was asked for but not produced."""

Traffic: TypeAlias = dict[str, dict[str, dict[str, int]]]
"""``{participant: {stage: {"sent": n, "received": n}}}`` plus a ``total`` stage."""


class ModelSettings(TypedDict):
    extractor: str
    head: str
    norm: str
    classifier: str


class SummarySettings(TypedDict):
    """The settings the federation ran with (``summary.json`` ``settings``)."""

    name: str
    participants: list[str]
    seed: int
    rounds: int
    algorithm: str
    sample_fraction: float
    local_epochs: int
    batch_size: int
    lr: float
    loss: str
    model: ModelSettings
    calibration: list[str]
    ridge_grid: list[float]
    shrinkage_grid: list[float]
    secure_updates: bool
    secure_statistics: bool
    update_bound: float
    update_bound_source: str
    update_resolution: float | None
    statistics_bound: float | None
    statistics_bound_source: str


class HeadlineCoverage(TypedDict):
    """What the headline accuracy (the final federated evaluation) covers."""

    participants: int
    of: int
    test_samples: int
    missing: list[str]


class EvaluationNoise(TypedDict):
    """The noise on one federated evaluation's summed counts
    (``spherecal.spherefed.privacy.evaluation_noise.EvaluationNoise.to_json``)."""

    mechanism: str
    sd_target: float
    site_sd: float
    sum_sd: float
    sum_bound: float
    contributors: int


class EvaluationCounts(TypedDict):
    """An evaluation's summed counts as decoded (real numbers where DP noise is on):
    what its accuracies are the ratios of."""

    total: float
    correct: dict[str, float]


class FederatedEvaluation(TypedDict):
    """One federated evaluation: accuracy per head from counts summed over the sites
    (``driver/evaluation_stage.py``); with DP, the counts' noise."""

    accuracy: Accuracy
    participants: list[str]
    samples: float
    accuracy_sd: dict[str, float | None]
    noise: EvaluationNoise | None
    dropped: dict[str, str]
    secure: bool
    error: str | None
    counts: NotRequired[EvaluationCounts]
    """The sums, where the evaluation summed any (no ``error``)."""
    parts: NotRequired[list[list[str]]]
    """The final evaluation added from jobs over disjoint sites (a short attempt's and
    its retry's, ``add_evaluations``): each job's participants."""


class RoundCoverage(TypedDict):
    round: int
    attempt: int
    selected: int
    summed: int
    missing: dict[str, str]  # participant: why


class JobCoverage(TypedDict):
    purpose: str
    round: int | None
    status: str
    asked: int
    summed: int
    missing: dict[str, str]
    not_asked: list[str]
    error: str | None


class Coverage(TypedDict):
    """Per round and per job: who was asked, how many inputs were summed, who was
    missing and why (``driver/verdict.py``)."""

    rounds: list[RoundCoverage]
    jobs: list[JobCoverage]
    evaluation: HeadlineCoverage


class RoundMetrics(TypedDict):
    """One training round as the driver recorded it (``per_round``;
    ``coordinator/driver/training_rounds.py``)."""

    round: int
    status: NotRequired[Literal["lost"]]  # only on a round given up (``lose``)
    attempt: int
    selected: list[str]
    contributors: list[str]
    dropped: dict[str, str]
    train_loss: float | None
    weight: NotRequired[float | None]
    test_accuracy: float | None
    federated_accuracy: float | None
    federated_accuracy_sd: NotRequired[float | None]
    secure_job: str | None
    parts: NotRequired[list[list[str]]]  # only on a round whose sum was added from jobs
    seconds: float


class JobSummary(TypedDict):
    """One aggregation job (``jobs``): a secure-aggregation job's spec and outcome
    (``driver/stages.py``), or a plaintext sum's (``secure: false``,
    ``driver/calibration_stage.py``)."""

    job_id: str | None
    purpose: str
    round: int | None
    status: str
    participants: list[str]
    contributors: list[str]
    dropped: dict[str, str]
    vector_length: int
    secure: NotRequired[bool]  # only on a plaintext sum (false)
    threshold: NotRequired[int]
    graph: NotRequired[str]
    scale_bits: NotRequired[int]
    ring_bits: NotRequired[int]
    bound: NotRequired[float]
    dropouts: NotRequired[list[str]]
    excluded: NotRequired[list[str]]
    stage_seconds: NotRequired[dict[str, float]]
    error: NotRequired[str | None]


class Timings(TypedDict):
    """Seconds spent per phase (``timings``); a phase that did not run is absent."""

    secagg_stages_s: dict[str, float]
    train_s: NotRequired[float]
    statistics_ffc_s: NotRequired[float]
    statistics_ccvr_s: NotRequired[float]
    ffc_s: NotRequired[float]
    ccvr_s: NotRequired[float]
    closed_forms_s: NotRequired[float]
    evaluate_s: NotRequired[float]
    total_s: NotRequired[float]


class HistoryRow(TypedDict):
    """One small row per completed round, what a plot of the run needs."""

    round: int
    train_loss: float | None
    federated_accuracy: float | None
    test_accuracy: float | None
    contributors: int
    seconds: float


class Retries(TypedDict):
    count: int
    wait_s: float
    log: list[JsonObject]


class ModelShape(TypedDict):
    feature_dim: int
    num_classes: int
    parameters: int


class Resources(TypedDict):
    rss_after_setup_mb: float
    peak_rss_mb: float
    secagg_peak_vector_bytes: int


class Refusal(TypedDict):
    """A participant's refusal of a job, as it reported it (``refusals``)."""

    participant: str
    job: str
    purpose: str
    kind: str
    rule: str
    reason: str


class Exclusion(TypedDict):
    """A participant excluded for misconduct (``excluded``)."""

    participant: str
    job: str
    purpose: str
    reason: str
    complainants: list[str]


class ConductSummary(TypedDict):
    """The coordinator's record of refusals and exclusions (``driver/conduct.py``)."""

    refusals: list[Refusal]
    excluded: list[Exclusion]


class PrivacyTotals(TypedDict):
    """ε spent so far: the federation's and each participant's."""

    federation: float
    participants: dict[str, float]


class PrivacySummary(TypedDict):
    """``privacy``: only ``enabled`` without DP; the plan and the ledger with it.
    ``enabled`` is about DP calibration releases; ``updates`` names the training mode
    (``"distributed"``: distributed DP-SGD, one step per round, each in ``dpsgd_steps``)."""

    enabled: bool
    updates: NotRequired[str]
    dpsgd_steps: NotRequired[list[JsonObject]]
    mechanism: NotRequired[str]
    epsilon_per_release: NotRequired[float | None]
    total_epsilon: NotRequired[float | None]
    delta: NotRequired[float]
    max_examples: NotRequired[int]
    quant_bits: NotRequired[int]
    colluders: NotRequired[int]
    releases: NotRequired[list[JsonObject]]
    refusals: NotRequired[list[JsonObject]]
    totals: NotRequired[PrivacyTotals]
    ledger: NotRequired[JsonObject]


class DriverResults(TypedDict, total=False):
    """What the driver's stages accumulate while a federation runs
    (``Progress.results``): each key is written by the stage that produces it and
    copied into :class:`CoordinatorSummary` at the end (``driver.outputs``). Every key
    is optional because a run can end before any stage wrote it. The parts the
    summary passes through as :data:`JsonObject` are built up in place by their
    stages (a record per statistics kind, the calibration report per head), so here
    they are :data:`StageRecord`: the keys of the accumulator are checked, the
    insides of those records are what the summary's shape test holds."""

    accuracy: Accuracy
    validation_accuracy: Accuracy
    calibration: StageRecord
    calibration_release: StageRecord
    validation_evaluation: StageRecord
    gate_evaluation: StageRecord
    central_accuracy: Accuracy | None
    central_test_samples: int
    federated_evaluation: FederatedEvaluation
    statistics: dict[str, StageRecord]
    integrity: StageRecord
    ccvr: StageRecord
    ffc_ridge: float
    models: StageRecord
    saved_statistics: dict[str, str]


class CoordinatorSummary(TypedDict):
    """``summary.json``: the coordinator's record of one federation
    (``docs/deployment.md``, section ``summary.json``)."""

    schema: str
    federation_id: str
    status: Status
    status_reasons: list[str]
    errors: list[str]
    warnings: list[str]
    settings: SummarySettings
    accuracy: Accuracy
    accuracy_covers: HeadlineCoverage
    validation_accuracy: Accuracy | None
    calibration_selection: JsonObject | None
    calibration_release: JsonObject
    validation_evaluation: JsonObject | None
    central_accuracy: Accuracy | None
    central_test_samples: int | None
    federated_evaluation: FederatedEvaluation | None
    statistics: dict[str, JsonObject]
    integrity: JsonObject | None
    ccvr: JsonObject | None
    per_round: list[RoundMetrics]
    history: list[HistoryRow]
    resumed_after_round: int | None
    coverage: Coverage
    retries: Retries
    jobs: list[JobSummary]
    timings: Timings
    models: JsonObject
    saved_statistics: dict[str, str]
    model: ModelShape
    audit_log: str
    privacy: PrivacySummary
    refusals: list[Refusal]
    excluded: list[Exclusion]
    # added by ``main`` once the federation ended (absent from a summary written by
    # the stop watchdog)
    bytes: NotRequired[Traffic]
    resources: NotRequired[Resources]
    listen: NotRequired[str]


class AbortedSummary(TypedDict):
    """The ``summary.json`` the stop watchdog writes when the driver did not stop in
    time (``main._Stopper``): the process exits 1 right after."""

    federation_id: str
    status: Literal["failed"]
    status_reasons: list[str]
    completed_rounds: int


SummaryDocument: TypeAlias = CoordinatorSummary | AbortedSummary
"""What a reader may find in ``summary.json``."""


def is_complete(document: SummaryDocument) -> TypeGuard[CoordinatorSummary]:
    """Whether ``document`` is a whole summary (not the stop watchdog's few lines)."""
    return "settings" in document


class EndedResult(TypedDict):
    """What a restart reports for a federation that already ended when its
    ``summary.json`` is missing or another federation's
    (:func:`spherecal.coordinator.state.lifecycle.stored_result`)."""

    federation_id: str
    status: str
    status_reasons: list[str]
    accuracy: None
    errors: list[str]
    warnings: list[str]
