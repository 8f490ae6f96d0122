"""Every setting of a coordinator, as frozen dataclasses (parsed from TOML elsewhere).

The coordinator package does not read files itself: ``spherecal.config`` turns a
TOML document into a :class:`CoordinatorSettings`, and tests build one directly.
Defaults reproduce ``spherecal reference`` (SphereFed on digits) so that the same
seed and settings give the same federation.

:meth:`CoordinatorSettings.fingerprint` hashes everything that determines the
federation's numbers; a restarted coordinator refuses to resume a state directory
written under a different fingerprint (resuming a run with, say, another learning
rate would silently splice two different experiments together).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spherecal.coordinator.evaluation_schedule import essential_evaluations, evaluations_per_site
from spherecal.spherefed.algorithms.registry import ALGORITHM_NAMES
from spherecal.spherefed.calibrate import CCVRConfig
from spherecal.spherefed.calibration_suite import (
    CALIBRATION_NAMES,
    CLOSED_FORMS,
    DEFAULT_RIDGE_GRID,
    DEFAULT_SHRINKAGE_GRID,
)
from spherecal.spherefed.fl import model_seeds
from spherecal.spherefed.network import ModelSpec
from spherecal.spherefed.privacy.evaluation_noise import (
    DEFAULT_EVALUATION_NOISE_SD,
    DEFAULT_MAX_EVALUATIONS_PER_FEDERATION,
)
from spherecal.spherefed.privacy.settings import PrivacySettings

__all__ = [
    "CalibrationSettings",
    "CoordinatorSettings",
    "EvaluationSettings",
    "ModelSettings",
    "SecAggSettings",
    "ServerSettings",
    "TLSSettings",
    "Timeouts",
    "TrainingSettings",
]

CALIBRATION_METHODS = CALIBRATION_NAMES  # ffc, ccvr, ffc_bias, lda, qda
GRAPHS = ("auto", "complete", "harary")
ROUND_GATES = ("off", "flag", "rollback")


DURABILITY = ("power-loss", "process-crash")
"""``[federation] durability``: what the state database's commits survive
(:mod:`spherecal.coordinator.state.store`)."""


@dataclass(frozen=True)
class ModelSettings:
    """The network every participant builds (``spherecal.spherefed.network.ModelSpec`` minus seeds,
    which derive from the federation seed exactly as the reference runner does)."""

    extractor: str = "digits_cnn"
    """Feature extractor (``spherecal.spherefed.models``), or your own ``"package.module:factory"``
    (docs/models.md; every participant must list it in ``[participant] extractors``)."""
    head: str = "sphere"
    """Projection head: ``sphere`` (SphereFed) or a plain one."""
    norm: str = "group"
    """Normalisation layers of the extractor."""
    classifier: str = "orthonormal"
    """Classifier: ``orthonormal`` (SphereFed's fixed one) or learned."""
    num_classes: int = 10
    """The model's classes; ``dataset`` fills it. Each site checks its own labels
    against it (a site without the highest classes takes part; one with labels beyond
    it refuses the plan) and never sends its label range."""
    in_channels: int = 1
    """Image channels; ``dataset`` fills it."""
    image_size: tuple[int, int] = (8, 8)
    """``[height, width]``; ``dataset`` fills it."""
    feature_dim: int | None = None
    """Feature dimension; unset: the extractor's default."""

    def spec(self, seed: int) -> ModelSpec:
        classifier_seed, init_seed = model_seeds(seed)
        return ModelSpec(
            extractor=self.extractor,
            head=self.head,
            norm=self.norm,
            classifier=self.classifier,
            classifier_seed=classifier_seed,
            init_seed=init_seed,
            num_classes=self.num_classes,
            in_channels=self.in_channels,
            image_size=self.image_size,
            feature_dim=self.feature_dim,
        )


@dataclass(frozen=True)
class TrainingSettings:
    rounds: int = 30
    """Federated rounds."""
    local_epochs: int = 2
    """Local epochs per round."""
    batch_size: int = 32
    """Local SGD batch size."""
    lr: float = 0.1
    """Local SGD learning rate."""
    momentum: float = 0.9
    """Local SGD momentum."""
    weight_decay: float = 0.0
    """Local SGD weight decay."""
    loss: str = "mse"
    """Local loss; default ``mse`` for the ``sphere`` head, else ``ce``."""
    algorithm: str = "fedavg"
    """Algorithm from the one registry ``spherecal.spherefed.algorithms.STRATEGIES``: ``fedavg``,
    ``fedprox``, ``fednova``, ``fedadam``, ``fedyogi``, ``scaffold`` (its server control
    variate is broadcast and checkpointed; each participant keeps its own in
    ``state_dir/algorithm/``). See docs/extending.md, "Add an algorithm"."""
    prox_mu: float = 0.01
    """FedProx proximal weight μ (``fedprox`` only)."""
    fedopt_lr: float = 0.01
    """Server learning rate η of FedAdam / FedYogi (Reddi et al. 2021, Algorithm 2)."""
    sample_fraction: float = 1.0
    """Participants sampled per round (seeded, as the reference)."""
    min_participants: int = 2
    """A round completes only with at least this many updates. A secure job's sum of
    fewer is kept (its sites released their update for the round and refuse a second;
    a plaintext retry asks the same task again and gets the same bytes): a retry asks
    the others and its sum is added, and the round completes once the union reaches
    this; it is lost if it never does. Not with distributed DP-SGD, whose step and
    noise are planned for one job: a short step is not kept, its sites refuse a
    retry, and the round is lost."""
    max_round_attempts: int = 3
    """A round that misses its minimum (or whose secure job fails) is retried, with a
    fresh job, at most this many times before the federation gives up (the statistics
    and the final evaluation likewise). A site admits 3 started jobs per purpose whose
    input never left (its ``[policy] max_unreleased_attempts``): above 3 is logged at
    start, and a site that did not raise its key refuses the later attempts
    (``RULE_ATTEMPTS_EXHAUSTED``)."""
    max_lost_rounds_in_a_row: int = 3
    """Rounds *lost* in a row before the federation gives up (``failed``). A round is
    lost, not failed, when its sites' releases for it were spent in a failed job —
    their updates left, or they refused at its masked step for a reason that depends
    on their data, such as an update outside the declared bound — or they already
    started their most jobs for the round whose input never left (their ``[policy]
    max_unreleased_attempts``, attempts before a restart included), so no retry can
    reach the minimum; the model keeps its state and the run goes on ``degraded``. The
    next round starts from the same model, so several in a row mean the cause repeats
    (e.g. ``update_bound`` too small for every site). 0: never give up for this."""
    max_update_change: float = 1.0
    """The model's declared update limit: the largest ``|θ_k − θ|`` one round of local
    training may move any entry. With ``[federation] max_examples_per_site`` it bounds
    every entry of a round's update vector (``n_k(θ_k−θ)`` by ``max_examples ×
    max(1, this)``; the algorithm states the rest:
    ``spherecal.spherefed.algorithms.ServerStrategy.entry_bound``), which sizes the
    secure-aggregation ring of update jobs (``[secure_aggregation] update_bound = 0``).
    A site whose update leaves that bound refuses to send it (a typed
    ``EncodingOverflow`` withdrawal at the job's masked step, counted as its update
    for the round; never a wrapped sum)."""

    def __post_init__(self) -> None:
        if self.rounds < 0:
            raise ValueError(f"rounds must be >= 0, got {self.rounds}")
        if self.algorithm not in ALGORITHM_NAMES:
            raise ValueError(f"algorithm must be one of {ALGORITHM_NAMES}, got {self.algorithm!r}")
        if not 0 < self.sample_fraction <= 1:
            raise ValueError(f"sample_fraction must be in (0, 1], got {self.sample_fraction}")
        if not self.fedopt_lr > 0:
            raise ValueError(f"fedopt_lr must be > 0, got {self.fedopt_lr}")
        if self.min_participants < 1:
            raise ValueError("min_participants must be >= 1")
        if self.max_round_attempts < 1:
            raise ValueError("max_round_attempts must be >= 1")
        if self.max_lost_rounds_in_a_row < 0:
            raise ValueError("max_lost_rounds_in_a_row must be >= 0")
        change = self.max_update_change
        if isinstance(change, bool) or not (math.isfinite(change) and change > 0):
            raise ValueError(f"max_update_change must be a positive number, got {change!r}")

    @property
    def effective_prox_mu(self) -> float:
        return self.prox_mu if self.algorithm == "fedprox" else 0.0


@dataclass(frozen=True)
class CalibrationSettings:
    methods: tuple[str, ...] = ("ffc",)
    """Calibrations to run: ``ffc``, ``ccvr``, ``ffc_bias``, ``lda``, ``qda``
    (docs/baselines.md, "Which calibrator when"). The last three are closed forms
    from the CCVR sums, their ridge / shrinkage chosen on the participants'
    validation splits (one evaluation job for the whole grid)."""
    ffc_ridge: float = 0.0
    """λ of FFC's ``(V + λI)⁻¹U``."""
    ffc_from_ccvr: bool = True
    """With the CCVR sums collected (``ccvr``, ``ffc_bias``, ``lda`` or ``qda``
    configured), derive FFC from them (one job, as the reference runner does)
    instead of running a separate, smaller FFC job."""
    ridge_grid: tuple[float, ...] = DEFAULT_RIDGE_GRID
    """FFC+bias ridge candidates λ, scored on the validation split."""
    shrinkage_grid: tuple[float, ...] = DEFAULT_SHRINKAGE_GRID
    """LDA / QDA shrinkage candidates γ ∈ [0, 1], scored on the validation split."""
    ccvr: CCVRConfig = field(default_factory=CCVRConfig)
    min_participants: int = 0
    """Fewest participants each statistics job (and the final federated evaluation)
    must sum for the run to count as ``completed``; fewer makes it ``degraded`` and a
    statistics job is retried (``[timeouts] rejoin_grace_s``). 0: the training
    minimum, raised to the secure-aggregation minimum when statistics are secure."""
    save_statistics: bool = False
    """Also write the aggregated statistics (``statistics_{kind}.npz``) to ``out_dir``.
    Off by default: the aggregate is the coordinator's legitimate output, but keeping
    per-class second moments on disk is an exposure a deployment should opt into."""

    def __post_init__(self) -> None:
        unknown = set(self.methods) - set(CALIBRATION_METHODS)
        if unknown:
            raise ValueError(
                f"unknown calibration method(s) {sorted(unknown)}; use {CALIBRATION_METHODS}"
            )
        if self.ffc_ridge < 0:
            raise ValueError("ffc_ridge must be >= 0")
        if self.min_participants < 0:
            raise ValueError("calibration min_participants must be >= 0")
        object.__setattr__(self, "ridge_grid", tuple(float(v) for v in self.ridge_grid))
        object.__setattr__(self, "shrinkage_grid", tuple(float(v) for v in self.shrinkage_grid))
        if not self.ridge_grid or any(not (0 <= v < float("inf")) for v in self.ridge_grid):
            raise ValueError(f"ridge_grid must be non-empty, finite, >= 0: {self.ridge_grid}")
        if not self.shrinkage_grid or any(not 0 <= v <= 1 for v in self.shrinkage_grid):
            raise ValueError(f"shrinkage_grid must be non-empty, in [0, 1]: {self.shrinkage_grid}")

    @property
    def closed_forms(self) -> tuple[str, ...]:
        """The configured calibrators chosen on validation (``ffc_bias``, ``lda``, ``qda``)."""
        return tuple(m for m in CLOSED_FORMS if m in self.methods)

    def grid(self, name: str) -> tuple[float, ...]:
        return self.ridge_grid if name == "ffc_bias" else self.shrinkage_grid

    @property
    def jobs(self) -> tuple[str, ...]:
        """Which statistics jobs to run, in order: the CCVR sums whenever any
        calibrator needs ``N_c``, ``S_c``, ``M_c`` (``ccvr``, ``ffc_bias``, ``lda``,
        ``qda``); a separate FFC job only when FFC cannot come from them."""
        needs_ccvr = "ccvr" in self.methods or bool(self.closed_forms)
        out: list[str] = []
        if "ffc" in self.methods and not (needs_ccvr and self.ffc_from_ccvr):
            out.append("ffc")
        if needs_ccvr:
            out.append("ccvr")
        return tuple(out)


@dataclass(frozen=True)
class SecAggSettings:
    updates: bool = True
    """Aggregate model updates through secure aggregation."""
    statistics: bool = True
    """Aggregate calibration statistics through secure aggregation."""
    evaluation: bool = True
    """Sum federated evaluation counts through secure aggregation: the coordinator
    learns only federation totals, never one participant's counts (participants
    refuse plaintext counts unless ``allow_plaintext``)."""
    evaluation_noise_sd: float = DEFAULT_EVALUATION_NOISE_SD
    """Distributed DP noise on secure evaluation counts: the total standard deviation
    (counts) any guaranteed set of contributors reaches on each entry of the sum
    (``spherecal.spherefed.privacy.evaluation_noise``). It sizes the job spec's noise
    bound; sites add their own ``[policy] evaluation_noise_sd`` and refuse a job whose
    spec cannot carry it, so it must be at least the sites'. Accuracies are reported
    with the noise's standard deviation (``federated_evaluation.noise``)."""
    threshold: int | None = None
    """Absolute Shamir threshold t; default ``max(2, floor(threshold_fraction·(h + c)) + 1)``
    with ``h`` the largest set of one participant's share holders (``n`` for the complete
    graph, ``k+1`` or ``k+2`` for Harary) and ``c`` the members assumed to collude with
    the coordinator (``[privacy] colluders``, default 0): a strict majority ``2t > h + c``,
    which participants' default policy (``spherecal.crypto.policy.SecAggPolicy``, with
    their own ``[privacy] colluders``) demands: a lower t makes them refuse. (Until
    2026-11-27 ``c`` was not counted, and sites assuming colluders refused the default
    threshold of a job with an odd number of share holders.)"""
    threshold_fraction: float = 0.5
    """Fraction of the share holders below the default threshold (t = ⌊fraction·n⌋ + 1)."""
    min_participants: int = 3
    """Fewest inputs a job may aggregate; participants' default policy refuses jobs of
    fewer than 3 participants and sums of fewer than 3 inputs."""
    graph: str = "auto"
    """``complete``, ``harary``, ``harary:K`` or ``auto`` (complete up to 32 participants)."""
    consistency_check: bool = True
    """The signed survivor-set round (Bonawitz et al. 2017, round 3). On by default:
    participants' default policy refuses jobs without it."""
    update_bound: float = 0.0
    """Declared bound on every entry of the round's vector (the algorithm's named sums
    then ``mean_loss``). 0 (the default): derived from what the federation declares —
    ``[federation] max_examples_per_site``, ``[training] max_update_change``, local
    epochs, batch size and momentum — by the algorithm
    (``spherecal.coordinator.driver.strategy.update_bound``; FedAvg/FedProx/FedOpt:
    ``max_examples × max(1, max_update_change)``; FedNova also ``n_k‖a_k‖₁ ≤
    max_examples × steps / (1 − momentum)``), so the ring follows the model. SCAFFOLD
    states none (its control variates accumulate): 1e5 then, or set one here. A
    positive value overrides the derivation (logged). A scalar sum whose reach at
    ``max_examples_per_site`` still exceeds the bound in use (a configured bound below
    FedNova's ``n_k‖a_k‖₁``) travels divided by a power of two that fits
    (``ServerStrategy.scalar_reach``; docs/extending.md)."""
    update_resolution: float = 2.0**-16
    """Largest fixed-point step (``2^-f``) allowed on an update entry: a round's update
    job uses the 32-bit ring — half the upload bytes and half the mask AES work —
    whenever the update bound, the participant count and a step this fine fit it
    (``spherecal.crypto.ring.choose_ring``, at the finest step that fits), else the
    64-bit ring at its finest scale. The default 2^-16 (≈ 1.5e-5 on ``n_k(θ_k−θ)``;
    each site's entry is rounded to the nearest step, so at a step of 2^-17 the averaged
    update moves by at most ``n · 2^-18 / Σn_k`` per entry) puts the digits demo (10
    sites, derived bound 1,386: 1,349 examples plus the weights' noise bound) on 32
    bits at 2^-17, while a federation whose ``n ×`` bound exceeds 2^15 (the default
    ``max_examples_per_site`` of 100,000 among them) stays on 64 bits. Measured over
    16 seeds of the demo, paired, the 32-bit ring moved no head's mean central
    accuracy by more than 0.06 points (26 of 48 head-seeds identical, the rest ±1–3 of
    448 test images, both signs; docs/performance.md). 0
    keeps every update job on 64 bits.
    Each job's ring and scale are in the summary's ``jobs`` (and the log at DEBUG).
    Statistics always use 64 bits."""
    statistics_bound: float = 0.0
    """Declared bound on every entry of a calibration-statistics job without DP (a DP
    release's plan sets its own). 0 (the default): derived — a unit-norm head's
    (``sphere``, ``fn``) entries are at most a site's example count, so ``[federation]
    max_examples_per_site``; other heads 1e6 (``coordinator/driver/bounds.py``). A
    positive value overrides (logged). It sets the fixed-point scale (2^-33 at the
    default 100,000 examples, 2^-30 at 1e6); a site beyond it withdraws
    (``EncodingOverflow``). Evaluation jobs use the configured value, or 1e6."""
    chunk_entries: int = 1 << 18
    """Ring entries per masked chunk (2 MiB); one chunk per gRPC message."""
    max_in_flight: int = 2
    """Concurrent masked uploads (each costs one vector of coordinator memory); more while
    their vectors fit ``in_flight_mb``."""
    in_flight_mb: float = 256.0
    """Coordinator memory (MiB) that incomplete masked uploads of one job may hold: a job
    accepts ``max(max_in_flight, ⌊in_flight_mb / vector size⌋)`` concurrent uploads (at
    most its participants), so a small job's sites upload at once while a large one keeps
    ``max_in_flight`` (CCVR at l = 512, 105 MB: 2). An upload that finds every slot
    taken waits for one, in the order the uploads began waiting (a site of an earlier
    version, whose first message carries a chunk, is refused and retries after
    0.2–0.7 s); with 2 slots, FFC at l = 1280 (7.6 MB, 10 sites) queued its uploads and
    its masked stage ended 0.5–1 s later (docs/performance.md). 0: only
    ``max_in_flight``."""
    audit_sample_bytes: int = 64 << 10
    """Keep this many leading payload bytes of each sender's first masked chunk per job
    in the database, for ``spherecal audit``'s byte-uniformity and mask-reuse tests
    (masked bytes reveal nothing; 0 disables)."""

    def __post_init__(self) -> None:
        if not 0 < self.threshold_fraction < 1:
            raise ValueError("threshold_fraction must be in (0, 1)")
        if self.threshold is not None and self.threshold < 2:
            raise ValueError("threshold must be >= 2 (t = 1 would let one holder rebuild secrets)")
        if self.min_participants < 2:
            raise ValueError("secure aggregation min_participants must be >= 2")
        kind = self.graph.split(":", 1)[0]
        if kind not in GRAPHS:
            raise ValueError(f"graph must be one of {GRAPHS} or 'harary:K', got {self.graph!r}")
        if not (math.isfinite(self.update_resolution) and self.update_resolution >= 0):
            raise ValueError("update_resolution must be a non-negative number (0: 64-bit ring)")
        sd = self.evaluation_noise_sd
        if isinstance(sd, bool) or not isinstance(sd, (int, float)) or not 0 <= sd <= 1e6:
            raise ValueError(f"evaluation_noise_sd must be in [0, 1e6] counts, got {sd!r}")
        if not (math.isfinite(self.update_bound) and self.update_bound >= 0):
            raise ValueError("update_bound must be a non-negative number (0: derived)")
        if not (math.isfinite(self.statistics_bound) and self.statistics_bound >= 0):
            raise ValueError("statistics_bound must be 0 (derived) or a positive number")
        if self.chunk_entries < 2 or self.chunk_entries % 2:
            raise ValueError("chunk_entries must be even and >= 2")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if not (math.isfinite(self.in_flight_mb) and self.in_flight_mb >= 0):
            raise ValueError("in_flight_mb must be a non-negative number of MiB")

    def upload_slots(self, vector_bytes: int, participants: int) -> int:
        """Concurrent masked uploads a job of ``participants`` accepts whose vector is
        ``vector_bytes``: ``max_in_flight``, raised to as many as ``in_flight_mb`` holds,
        never above the participants (nobody else uploads)."""
        fit = int(self.in_flight_mb * (1 << 20) // max(vector_bytes, 1))
        return max(self.max_in_flight, min(fit, participants))

    def threshold_for(self, holders: int, colluders: int = 0) -> int:
        """The job's threshold for ``holders`` share holders per participant (its
        largest closed neighbourhood) and ``colluders`` members assumed to collude
        with the coordinator: :attr:`threshold`, or a strict majority of both."""
        if self.threshold is not None:
            return self.threshold
        return max(2, math.floor(self.threshold_fraction * (holders + colluders)) + 1)


@dataclass(frozen=True)
class TLSSettings:
    cert: Path | None = None
    """Server certificate (PEM); required unless ``[server] insecure``."""
    key: Path | None = None
    """Server private key (PEM)."""
    client_ca: Path | None = None
    """CA that signs the participants' client certificates."""
    crl: Path | None = None
    """A PEM CRL signed by ``client_ca``: revoked client certificates are refused on
    every call; the file is re-read when it changes, and a list older than the newest
    applied (its CRL number) is refused (``spherecal.coordinator.server.revocation``)."""


@dataclass(frozen=True)
class ServerSettings:
    listen: str = "127.0.0.1:50051"
    """``host:port``; port 0 picks a free port."""
    insecure: bool = False
    """Plaintext gRPC, loopback addresses only."""
    max_message_bytes: int = 8 << 20
    """gRPC message limit (both directions)."""
    max_chunk_bytes: int = 4 << 20
    """Largest upload chunk."""
    max_workers: int = 0
    """Most threads for synchronous RPC work (uploads, joins, submissions; presence
    streams and long polls hold none); 0 chooses ``participants + 16``."""
    port_file: Path | None = None
    """Write the bound port here."""
    log_format: str = "text"
    """``text`` or ``json``: stderr log lines with an ISO-8601 UTC timestamp and a level
    (``--log-format`` overrides; ``spherecal.logs``)."""
    log_level: str = "info"
    """``info``: one line per training round (with its ETA) and what goes wrong;
    ``debug`` adds every secure-aggregation stage and job (``--log-level`` overrides;
    ``spherecal.coordinator.driver.progress_log``)."""

    def __post_init__(self) -> None:
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, got {self.log_format!r}")
        if self.log_level not in ("info", "debug"):
            raise ValueError(f"log_level must be info or debug, got {self.log_level!r}")


@dataclass(frozen=True)
class AdminSettings:
    """Who may read the operator's status view (``GetFederationStatus``)."""

    allow: tuple[str, ...] = ()
    """Certificate identities (as ``spherecal certs issue NAME`` writes them) allowed
    the read-only status view over mutual TLS. Empty: nobody over TLS. In plaintext
    loopback mode (``[server] insecure``) loopback callers are allowed."""


@dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus endpoint (``spherecal.coordinator.server.metrics``); off unless ``listen`` is
    set."""

    listen: str | None = None
    """``host:port`` for ``/metrics`` (e.g. ``"127.0.0.1:9464"``). Plain HTTP: a
    non-loopback address must be allowed explicitly with ``allow_remote``."""
    allow_remote: bool = False
    """Allow a non-loopback ``listen`` (the endpoint is plain HTTP: expose it deliberately)."""


@dataclass(frozen=True)
class Timeouts:
    join_s: float = 300.0
    """Wait this long for the roster — but for a site that refused the federation's
    plan: it is not waited for, and where the sites still to come cannot make the
    minimum the federation fails at once."""
    round_s: float = 900.0
    """A round's training (and a statistics job's computation). In a secure job it is
    the deadline of each stage that can wait on local work: advertise, share, and
    masked (participants share keys before their local work and upload after it)."""
    stage_s: float = 120.0
    """Each later secure-aggregation stage (consistency, unmask)."""
    evaluation_s: float = 300.0
    """Federated evaluation."""
    heartbeat_interval_s: float = 2.0
    """Fallback liveness for participants without a presence stream."""
    heartbeat_timeout_s: float = 20.0
    """A participant silent this long is dropped (must exceed the interval)."""
    linger_s: float = 30.0
    """Keep serving after the end until everyone was told."""
    clock_skew_s: float = 300.0
    """Join timestamps outside this window are refused."""
    long_poll_s: float = 2.0
    """Longest a NextInstruction call is held."""
    rejoin_grace_s: float = 60.0
    """After a failed round or statistics attempt, wait up to this long for the
    participants it needs to reconnect (a restarted participant takes seconds);
    the next attempt starts as soon as all of them are back, or at the end of the
    grace with whoever is there. 0: retry after the back-off alone."""
    retry_backoff_s: float = 1.0
    """Back-off before a retry: ``retry_backoff_s · 2^(attempt−2)``, capped at 30 s,
    with jitter (half fixed, half random), so restarted participants are not met by
    a burst of attempts."""

    def __post_init__(self) -> None:
        for name in ("rejoin_grace_s", "retry_backoff_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value}")


@dataclass(frozen=True)
class EvaluationSettings:
    test_dataset: str | None = None
    """Held-out test data for central evaluation (the reference's test split);
    federated evaluation always runs."""
    test_data_root: str | None = None
    """Where ``test_dataset`` lives (CIFAR directory or ``.npz``)."""
    test_samples: int | None = None
    """Dataset size for ``mnist1d`` (``spherecal.spherefed.data.load_dataset``'s ``samples``)."""
    federated_every: int = 0
    """Also evaluate federatedly after every this-many rounds (0: only at the end).
    Each is one more evaluation release per site, so they stop once ``site_limit``
    leaves only room for the evaluations the run needs (logged at start)."""
    site_limit: int = DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
    """The most evaluations per federation the sites answer — their ``[policy]
    max_evaluations_per_federation`` (default 4; each evaluation is fresh noise on
    counts that can be asked for again at no cost, so the sites bound their number).
    The coordinator keeps room within it for the evaluations the run needs (the
    validation grid and gate, the final evaluation, a round gate's checks: a
    configuration needing more is refused at start) and stops per-round
    evaluations (``federated_every``) before they would take it. Raise it only with
    every site's limit raised as well (logged); 0: the sites set no limit. What a
    site's split has left of its lifetime allowance (``[policy]
    max_evaluations_per_split``, used up by earlier federations on the same records) is
    not known here: such a site refuses, and the run says what its evaluations lack."""

    def __post_init__(self) -> None:
        for key in ("federated_every", "site_limit"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"[evaluation] {key} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class CoordinatorSettings:
    participants: tuple[str, ...]
    """The roster, in partition order: participant ``k`` trains with seed
    ``derive_seed(seed, "train", round, k)`` and is ``k`` in the reference runner."""
    name: str = "spherecal"
    """The federation's name."""
    seed: int = 0
    """Every seed derives from this one, as in the reference runner. A new
    federation over sites that took part in an earlier one with the same seed, model
    and training asks them in its first round for the update they already released
    (the same bits, on unchanged data), which they refuse in any federation: that
    round is lost. Give a federation run again another seed (``--new-federation``
    warns when the training equals the one set aside)."""
    model: ModelSettings = field(default_factory=ModelSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)
    secagg: SecAggSettings = field(default_factory=SecAggSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    tls: TLSSettings = field(default_factory=TLSSettings)
    timeouts: Timeouts = field(default_factory=Timeouts)
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings)
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    """Noisy (differentially private) calibration releases; off by default."""
    state_dir: Path = Path("coordinator-state")
    """SQLite database and round checkpoints."""
    out_dir: Path = Path("coordinator-out")
    """Outputs: ``summary.json``, models, ``model_spec.json``."""
    admin: AdminSettings = field(default_factory=AdminSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    max_examples_per_site: int = 100_000
    """Most training examples one honest site may hold: every decoded sum of example
    counts (a round's weights ``Σ n_k``, the statistics' counts, an evaluation's
    total) must be at most ``contributors ×`` this, or the aggregate is refused
    (``spherecal.coordinator.driver.integrity``). It bounds what one dishonest site
    can claim; raise it for larger sites. It also sizes the secure-aggregation rings:
    the update bound (``[secure_aggregation] update_bound = 0``; with the bound of the
    noise on the sites' weights added, ``example_count_noise_sd``) and, with a
    unit-norm head, every entry of a site's statistics (``statistics_bound = 0``)."""
    example_count_noise_sd: int = 4
    """Standard deviation (examples) of the DP noise each site adds, once per
    training split, to the example count its training updates are weighted by
    (``spherecal.participant.example_weight``): stated in the plan, it widens the
    integrity checks that compare the rounds' weights ``Σ ñ_k`` with the statistics'
    counts and the bound by ``NOISE_SDS`` of that noise. A site whose own ``[policy]
    example_count_noise_sd`` is larger refuses the plan; 0 admits only sites that
    send their exact count (their weakening, not the coordinator's)."""
    validation_gate: bool = True
    """Ship no calibrated head (FFC, CCVR, FFC+bias, LDA, QDA) that scores worse on
    the federated validation split than the uncalibrated model beyond the
    difference's uncertainty (``gate_sigmas``); the run is then ``degraded``, saying
    why. Turning it off is a logged weakening."""
    gate_sigmas: float = 3.0
    """How many standard errors of a validation-accuracy difference (plus the counts'
    DP noise, if any) the gates allow before they reject."""
    round_gate: str = "off"
    """After each training round, score the new model on the federated validation
    split and compare with the previous round's: ``off``; ``flag`` (a drop of more
    than ``round_max_drop`` and ``gate_sigmas`` standard errors makes the run
    ``degraded``); ``rollback`` (the same, and the round's step is undone). Each
    check is one more secure evaluation job (one more release of validation counts)
    per round — more than sites answer by default (``[policy]
    max_evaluations_per_federation``, 4 per federation; logged at start)."""
    round_max_drop: float = 0.1
    """Smallest drop of federated validation accuracy between rounds that
    ``round_gate`` treats as sharp."""
    durability: str = "power-loss"
    """What the state database's commits survive. ``power-loss``: every commit the
    coordinator acts on (a job instruction sent, a message acknowledged, a round
    begun) is synced to disk first, so an OS crash or power cut never rolls back
    what a site already saw and a restart continues the same jobs. ``process-crash``:
    commits are synced only at checkpoints (each completed round, the end) — a killed
    process loses nothing, but a power loss may roll back the last commits, and a
    job the sites already released into is then asked for again and refused (the
    release lost); a logged weakening, for state on storage where syncs are costly."""

    def __post_init__(self) -> None:
        if self.max_examples_per_site < 1:
            raise ValueError("max_examples_per_site must be >= 1")
        sd = self.example_count_noise_sd
        if isinstance(sd, bool) or not isinstance(sd, int) or not 0 <= sd <= 1_000_000:
            raise ValueError(
                f"example_count_noise_sd must be an integer in [0, 1000000] examples, got {sd!r}"
            )
        if self.round_gate not in ROUND_GATES:
            raise ValueError(f"round_gate must be one of {ROUND_GATES}, got {self.round_gate!r}")
        if not (math.isfinite(self.gate_sigmas) and self.gate_sigmas >= 0):
            raise ValueError(f"gate_sigmas must be a number >= 0, got {self.gate_sigmas}")
        if self.durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, got {self.durability!r}")
        if not 0 <= self.round_max_drop <= 1:
            raise ValueError(f"round_max_drop must be in [0, 1], got {self.round_max_drop}")
        limit, needed = self.evaluation.site_limit, self.essential_evaluations
        if 0 < limit < needed:
            raise ValueError(
                f"this run needs {needed} evaluation releases from each site (the final "
                "evaluation, the validation gate and calibrators' grid, and with "
                "[federation] round_gate one per round plus one), but [evaluation] "
                f"site_limit = {limit}: sites answer no more (their [policy] "
                "max_evaluations_per_federation). Raise both after agreeing it with every "
                "site, or turn the round gate off"
            )
        ids = self.participants
        if not ids:
            raise ValueError("the roster (participants) is empty")
        if len(set(ids)) != len(ids):
            raise ValueError("participant ids in the roster must be unique")
        for pid in ids:
            if not pid or not pid.isprintable() or len(pid.encode()) > 64 or pid.strip() != pid:
                raise ValueError(f"invalid participant id {pid!r} (1-64 printable bytes)")
        needs = self.training.min_participants
        if needs > len(ids):
            raise ValueError(f"min_participants={needs} exceeds the roster of {len(ids)}")
        if self.calibration.min_participants > len(ids):
            raise ValueError(
                f"calibration min_participants={self.calibration.min_participants} exceeds "
                f"the roster of {len(ids)}"
            )
        chunk_bytes = 8 * self.secagg.chunk_entries
        if chunk_bytes > self.server.max_chunk_bytes:
            raise ValueError(
                f"secure-aggregation chunks of {chunk_bytes} bytes exceed the server's "
                f"max_chunk_bytes ({self.server.max_chunk_bytes}); lower chunk_entries"
            )
        if self.server.max_chunk_bytes + (64 << 10) > self.server.max_message_bytes:
            raise ValueError("max_chunk_bytes must stay well below max_message_bytes")
        if self.privacy.distributed_updates:
            if not self.secagg.updates:
                raise ValueError(
                    '[privacy] updates = "distributed" needs secure updates: each site adds '
                    "only a share of the noise, so no site's sum may be seen alone (set "
                    "[secure_aggregation] updates = true)"
                )
            if not self.privacy.dpsgd_expected_batch_size > 0:
                raise ValueError(
                    '[privacy] updates = "distributed" needs dpsgd_expected_batch_size > 0: '
                    "the public q·N the noisy gradient sum is divided by"
                )
        if self.privacy.enabled and not self.secagg.statistics:
            raise ValueError(
                "[privacy] enabled needs secure statistics: DP noise is added in the ring "
                "before masking (set [secure_aggregation] statistics = true)"
            )

    @property
    def secure(self) -> bool:
        return self.secagg.updates or self.secagg.statistics

    @property
    def evaluations_per_site(self) -> int:
        """:func:`evaluations_per_site` of this configuration."""
        return evaluations_per_site(
            rounds=self.training.rounds,
            federated_every=self.evaluation.federated_every,
            round_gate=self.round_gate,
            validation_gate=self.validation_gate,
            closed_forms=bool(self.calibration.closed_forms),
        )

    @property
    def essential_evaluations(self) -> int:
        """:func:`essential_evaluations` of this configuration."""
        return essential_evaluations(
            rounds=self.training.rounds,
            round_gate=self.round_gate,
            validation_gate=self.validation_gate,
            closed_forms=bool(self.calibration.closed_forms),
        )

    def evaluates_after_round(self, r: int) -> bool:
        """Whether round ``r`` (0-based) ends with a federated test evaluation: every
        ``federated_every`` rounds, while the sites' limit (``[evaluation]
        site_limit``) still has room beside the evaluations the run needs. Decided
        by the schedule alone, so a restarted coordinator decides the same."""
        every = self.evaluation.federated_every
        if every <= 0 or (r + 1) % every:
            return False
        limit = self.evaluation.site_limit
        return limit == 0 or (r + 1) // every + self.essential_evaluations <= limit

    @property
    def calibration_minimum(self) -> int:
        """Inputs a statistics job must sum for a ``completed`` run (see
        ``CalibrationSettings.min_participants``)."""
        if self.calibration.min_participants:
            return self.calibration.min_participants
        floor = self.training.min_participants
        if self.secagg.statistics:
            floor = max(floor, self.secagg.min_participants)
        return min(floor, len(self.participants))

    def fingerprint(self) -> str:
        """SHA-256 over the settings that determine the federation's results."""
        relevant: dict[str, Any] = {
            "participants": list(self.participants),
            "seed": self.seed,
            "model": asdict(self.model),
            "training": {
                k: v
                for k, v in asdict(self.training).items()
                if k not in ("max_round_attempts", "min_participants")
            },
            "secure_updates": self.secagg.updates,
        }
        text = json.dumps(relevant, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()
