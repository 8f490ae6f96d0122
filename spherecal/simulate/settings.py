"""What one simulated federation is: :class:`SimulationSettings` and its validation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spherecal.coordinator.settings import SecAggSettings
from spherecal.participant.policy import DEFAULT_EXAMPLE_COUNT_NOISE_SD
from spherecal.simulate.drops import Drop
from spherecal.simulate.launch import LAUNCHERS
from spherecal.spherefed.calibration_suite import CALIBRATION_NAMES, CLOSED_FORMS
from spherecal.spherefed.reference import ReferenceConfig

__all__ = ["Progress", "SimulationError", "SimulationSettings"]

Progress = Callable[[str], None]


class SimulationError(RuntimeError):
    """The simulated federation could not be run or did not produce results."""


@dataclass(frozen=True)
class SimulationSettings:
    reference: ReferenceConfig
    out: Path
    calibration: tuple[str, ...] = ("ffc", "ccvr")
    secure_updates: bool = True
    secure_statistics: bool = True
    drops: tuple[Drop, ...] = ()
    corrupt_shares: tuple[str, ...] = ()
    """TEST ONLY (``--corrupt-shares``): these participants deal shares that fail
    authentication in every job (their processes get ``SPHERECAL_TEST_FAULTS=1``)."""
    adversaries: tuple[tuple[str, str], ...] = ()
    """TEST ONLY (``--adversary``): (participant, ``ATTACK[:N]``) pairs whose local
    computation is replaced (``spherecal.participant.adversary``; their processes get
    ``SPHERECAL_TEST_FAULTS=1``)."""
    threshold: int | None = None
    ffc_from_ccvr: bool = True
    threads: int = 1
    tls: bool = False
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 4.0
    stage_s: float = 120.0
    round_s: float = 900.0
    timeout_s: float = 3600.0
    rejoin_grace_s: float = 60.0
    """The coordinator's ``[timeouts] rejoin_grace_s`` (tests that never restart a
    killed participant shorten it)."""
    chunk_entries: int = 1 << 18
    federated_every: int = 0
    feature_dim: int | None = None
    save_statistics: bool = False
    update_bound: float = SecAggSettings().update_bound
    update_resolution: float = SecAggSettings().update_resolution
    statistics_bound: float = SecAggSettings().statistics_bound
    example_count_noise_sd: int = DEFAULT_EXAMPLE_COUNT_NOISE_SD
    """σ (examples) of the noise on every site's training weight, at the coordinator
    (``[federation]``) and at every site (``[policy]``). 0: each site weights its
    updates by its exact count, as the reference runner does (tests that compare the
    two model for model); a weakening each site logs."""
    extra_participant: dict[str, Any] = field(default_factory=dict)
    extra_coordinator: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Extra coordinator TOML tables/keys (tests: ``[admin]``, ``[metrics]``)."""
    epsilon: float | None = None
    """Target ε per calibration release (``--epsilon``): switches DP noise on."""
    delta: float = 1e-5
    dp_mechanism: str = "skellam"
    dp_budget: float | None = None
    """Total ε budget of every participant's local ledger (``--dp-budget``)."""
    dpsgd: bool = False
    """Train with distributed DP-SGD (``--dpsgd``; ``[privacy] updates = "distributed"``
    at the coordinator and every participant): one noisy step per round."""
    dpsgd_noise_multiplier: float = 1.0
    dpsgd_sample_rate: float = 0.01
    dpsgd_max_grad_norm: float = 1.0
    participant_privacy: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-participant overrides of its ``[privacy]`` table (tests: a tiny budget)."""
    launcher: str = "forkserver"
    """How each OS process starts (``--launcher``, :mod:`spherecal.simulate.launch`):
    ``forkserver`` forks it from a helper that imported torch and the project once
    (milliseconds instead of ~2 CPU-seconds of imports per process), ``exec`` runs a
    fresh interpreter for each."""

    @property
    def privacy(self) -> bool:
        return self.epsilon is not None

    @property
    def long_poll_s(self) -> float:
        """How long a ``NextInstruction`` long poll waits. A waiting poll is woken
        the moment its instruction may change (``spherecal.coordinator.driver.board``), so the
        length
        only sets how often an idle participant asks again: 2 s up to 100
        participants, 10 s beyond — at 1,000, 2 s polls are 500 empty RPCs a second
        on both sides."""
        return 2.0 if self.reference.participants <= 100 else 10.0

    @property
    def participant_ids(self) -> tuple[str, ...]:
        return tuple(f"p{k}" for k in range(self.reference.participants))

    @property
    def statistics_jobs(self) -> tuple[str, ...]:
        """As the coordinator's ``CalibrationSettings.jobs``: the CCVR sums whenever a
        calibrator needs them (``ccvr``, ``ffc_bias``, ``lda``, ``qda``)."""
        needs_ccvr = any(c in self.calibration for c in ("ccvr", *CLOSED_FORMS))
        jobs = []
        if "ffc" in self.calibration and not (needs_ccvr and self.ffc_from_ccvr):
            jobs.append("ffc")
        if needs_ccvr:
            jobs.append("ccvr")
        return tuple(jobs)

    def validate(self) -> None:
        ref = self.reference
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"--launcher accepts {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        unknown = set(self.calibration) - set(CALIBRATION_NAMES)
        if unknown:
            raise ValueError(
                f"--calibration accepts {', '.join(CALIBRATION_NAMES)}, got {sorted(unknown)}"
            )
        per_round = max(1, round(ref.sample_fraction * ref.participants))
        if self.secure_updates and per_round < 2:
            raise ValueError(
                "secure updates need at least 2 participants per round "
                f"(participants × sample fraction = {per_round})"
            )
        if self.secure_statistics and ref.participants < 2:
            raise ValueError("secure statistics need at least 2 participants")
        if not 0 <= self.example_count_noise_sd <= 1_000_000:
            raise ValueError(
                "--example-count-noise-sd must be in [0, 1000000] examples, got "
                f"{self.example_count_noise_sd}"
            )
        if self.epsilon is not None:
            if not self.epsilon > 0:
                raise ValueError("--epsilon must be > 0")
            if not 0 < self.delta < 1:
                raise ValueError("--delta must be in (0, 1)")
            if self.dp_mechanism not in ("skellam", "dgauss"):
                raise ValueError("--dp-mechanism must be skellam or dgauss")
            if not self.secure_statistics:
                raise ValueError(
                    "--epsilon needs secure statistics: the DP noise is added in the ring "
                    "before masking"
                )
        if self.dpsgd:
            if not self.secure_updates:
                raise ValueError(
                    "--dpsgd needs secure updates: each site adds only a share of the noise"
                )
            if not 0 < self.dpsgd_sample_rate <= 1:
                raise ValueError("--dpsgd-rate must be in (0, 1]")
            if not (self.dpsgd_noise_multiplier > 0 and self.dpsgd_max_grad_norm > 0):
                raise ValueError("--dpsgd-sigma and --dpsgd-clip must be > 0")
        for drop in self.drops:
            point = drop.point
            secagg_stage = point.stage != "train"
            if point.when in ("ffc", "ccvr"):
                if point.when not in self.statistics_jobs:
                    raise ValueError(
                        f"--drop {drop}: there is no {point.when} statistics job (jobs: "
                        f"{list(self.statistics_jobs)}; FFC derives from CCVR unless "
                        "--separate-ffc)"
                    )
                if secagg_stage and not self.secure_statistics:
                    raise ValueError(f"--drop {drop}: statistics are not securely aggregated")
            elif point.when is not None and point.when.startswith("r"):
                if int(point.when[1:]) > ref.rounds:
                    raise ValueError(f"--drop {drop}: there are only {ref.rounds} rounds")
                if secagg_stage and not self.secure_updates:
                    raise ValueError(f"--drop {drop}: updates are not securely aggregated")
            elif secagg_stage and not (self.secure_updates or self.secure_statistics):
                raise ValueError(f"--drop {drop}: secure aggregation is off (--no-secure)")
