"""The coordinator and participant configs of a simulated federation.

One TOML file per process (``DIR/coordinator.toml``, ``DIR/participants/pK.toml``),
written so that the run can be repeated by hand. The settings are built as the
service's own dataclasses (``spherecal.coordinator.settings``, ``spherecal.participant.settings``)
and
written by :mod:`spherecal.config` — no key is spelled out here, so a new setting
cannot be forgotten on one side. Every participant reads its slice of the dataset
exactly as the reference runner partitions it (``spherecal.participant.data``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from spherecal.config import coordinator_document as _coordinator_toml
from spherecal.config import dump_toml
from spherecal.config import participant_document as _participant_toml
from spherecal.coordinator.evaluation_schedule import evaluations_per_site
from spherecal.coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    EvaluationSettings,
    ModelSettings,
    SecAggSettings,
    ServerSettings,
    Timeouts,
    TLSSettings,
    TrainingSettings,
)
from spherecal.participant.policy import (
    DEFAULT_EXAMPLE_COUNT_NOISE_SD,
    DEFAULT_MAX_EVALUATION_HEADS,
    PolicySettings,
)
from spherecal.participant.settings import ClientTLS, DataSettings, ParticipantSettings
from spherecal.simulate.settings import SimulationSettings
from spherecal.spherefed.calibration_suite import CLOSED_FORMS
from spherecal.spherefed.privacy.evaluation_noise import DEFAULT_MAX_EVALUATIONS_PER_FEDERATION
from spherecal.spherefed.privacy.settings import PrivacySettings

__all__ = [
    "DataShape",
    "coordinator_document",
    "coordinator_settings",
    "participant_document",
    "participant_settings",
    "write_toml",
]

DataShape = tuple[int, int, tuple[int, int]]
"""(classes, channels, (height, width)) of the dataset."""


def write_toml(path: Path, document: dict[str, dict[str, Any]]) -> Path:
    """Write ``document`` as TOML to ``path``; return ``path``."""
    path.write_text(dump_toml(document))
    return path


def coordinator_settings(
    settings: SimulationSettings,
    shape: DataShape,
    out: Path,
    listen: str,
    *,
    max_examples: int | None = None,
) -> CoordinatorSettings:
    """The coordinator of this simulation (listening on ``listen``).

    ``max_examples`` (the dataset's largest split: no site can hold more of any
    split than the whole federation has) becomes ``max_examples_per_site``, which
    bounds every count sum and the update jobs' entries (issue #24: the bound follows
    the data, so the demo's updates fit the 32-bit ring); ``None`` keeps the default.
    """
    s, ref = settings, settings.reference
    classes, channels, size = shape
    certs = out / "certs"
    return CoordinatorSettings(
        participants=s.participant_ids,
        name="simulate",
        example_count_noise_sd=s.example_count_noise_sd,
        seed=ref.seed,
        state_dir=Path("coordinator/state"),
        out_dir=Path("coordinator/out"),
        model=ModelSettings(
            extractor=ref.model,
            head=ref.head,
            norm=ref.norm,
            classifier=ref.classifier,
            num_classes=classes,
            in_channels=channels,
            image_size=size,
            feature_dim=s.feature_dim,
        ),
        training=TrainingSettings(
            rounds=ref.rounds,
            local_epochs=ref.local_epochs,
            batch_size=ref.batch_size,
            lr=ref.lr,
            momentum=ref.momentum,
            weight_decay=ref.weight_decay,
            loss=ref.loss,
            algorithm=ref.algorithm,
            prox_mu=ref.prox_mu,
            fedopt_lr=ref.fedopt_lr,
            sample_fraction=ref.sample_fraction,
            min_participants=2 if s.secure_updates else 1,
        ),
        calibration=CalibrationSettings(
            methods=s.calibration,
            ffc_ridge=ref.ffc_ridge,
            ffc_from_ccvr=s.ffc_from_ccvr,
            save_statistics=s.save_statistics,
            ccvr=ref.ccvr,
            ridge_grid=ref.ridge_grid,
            shrinkage_grid=ref.shrinkage_grid,
        ),
        secagg=SecAggSettings(
            updates=s.secure_updates,
            statistics=s.secure_statistics,
            evaluation=s.secure_statistics,  # evaluation counts are statistics too
            threshold=s.threshold,
            chunk_entries=s.chunk_entries,
            update_bound=s.update_bound,
            update_resolution=s.update_resolution,
            statistics_bound=s.statistics_bound,
        ),
        server=ServerSettings(
            listen=listen, insecure=not s.tls, port_file=Path("coordinator/port")
        ),
        tls=TLSSettings(
            cert=certs / "server.pem" if s.tls else None,
            key=certs / "server.key" if s.tls else None,
            client_ca=certs / "ca.pem" if s.tls else None,
        ),
        timeouts=Timeouts(
            join_s=300.0,
            round_s=s.round_s,
            stage_s=s.stage_s,
            evaluation_s=s.stage_s,
            heartbeat_interval_s=s.heartbeat_interval_s,
            heartbeat_timeout_s=s.heartbeat_timeout_s,
            linger_s=20.0,
            long_poll_s=s.long_poll_s,
            rejoin_grace_s=s.rejoin_grace_s,
        ),
        evaluation=EvaluationSettings(
            test_dataset=ref.dataset,
            test_data_root=ref.data_root,
            test_samples=ref.samples,
            federated_every=s.federated_every,
            # the simulated sites allow what the schedule asks (``_policy``)
            site_limit=max(DEFAULT_MAX_EVALUATIONS_PER_FEDERATION, _evaluations_asked(s)),
        ),
        privacy=_with_dpsgd(
            s,
            (
                PrivacySettings(
                    enabled=True, mechanism=s.dp_mechanism, epsilon=s.epsilon, delta=s.delta
                )
                if s.privacy
                else PrivacySettings()
            ),
            expected_batch=s.dpsgd_sample_rate * max_examples if max_examples else 0.0,
        ),
        max_examples_per_site=(
            max_examples if max_examples is not None else CoordinatorSettings.max_examples_per_site
        ),
    )


def coordinator_document(
    settings: SimulationSettings,
    shape: DataShape,
    out: Path,
    listen: str,
    *,
    max_examples: int | None = None,
) -> dict[str, dict[str, Any]]:
    """The coordinator's TOML document for this simulation."""
    coordinator = coordinator_settings(settings, shape, out, listen, max_examples=max_examples)
    document = _coordinator_toml(coordinator, threads=settings.threads)
    for section, table in settings.extra_coordinator.items():  # raw per-test overrides
        document.setdefault(section, {}).update(table)
    return document


def participant_settings(
    settings: SimulationSettings, k: int, port: int, out: Path
) -> ParticipantSettings:
    """Participant ``k`` of this simulation (its slice of the data, its drop points)."""
    s, ref = settings, settings.reference
    pid = s.participant_ids[k]
    certs = out / "certs"
    return ParticipantSettings(
        participant_id=pid,
        coordinator=f"127.0.0.1:{port}",
        insecure=not s.tls,
        state_dir=Path(f"../state/{pid}"),
        out_dir=Path(f"../out/{pid}"),
        extractors=(ref.model,) if ":" in ref.model else (),
        threads=s.threads,
        allow_plaintext=not (s.secure_updates and s.secure_statistics),
        long_poll_ms=round(s.long_poll_s * 1000),
        reconnect_max_s=2.0,
        give_up_s=300.0,
        halt_before=tuple(d.point for d in s.drops if d.participant == pid),
        corrupt_shares=pid in s.corrupt_shares,
        adversary=dict(s.adversaries).get(pid),
        identity_key=certs / f"{pid}.identity.key" if s.tls else None,
        tls=ClientTLS(
            ca=certs / "ca.pem" if s.tls else None,
            cert=certs / f"{pid}.pem" if s.tls else None,
            key=certs / f"{pid}.key" if s.tls else None,
            peer_keys=certs / "peers.txt" if s.tls else None,
        ),
        privacy=_with_dpsgd(
            s,
            (
                PrivacySettings(
                    enabled=True, epsilon=s.epsilon, total_epsilon=s.dp_budget, delta=s.delta
                )
                if s.privacy
                else PrivacySettings()
            ),
        ),
        policy=_policy(s),
        data=DataSettings(
            dataset=ref.dataset,
            root=ref.data_root,
            slice_index=k,
            slice_of=ref.participants,
            partition=ref.partition,
            alpha=ref.alpha,
            shards_per_client=ref.shards_per_client,
            seed=ref.seed,
            samples=ref.samples,
            validation_fraction=ref.validation_fraction,
        ),
    )


def _with_dpsgd(
    s: SimulationSettings, privacy: PrivacySettings, *, expected_batch: float = 0.0
) -> PrivacySettings:
    """``[privacy]`` with distributed DP-SGD (``--dpsgd``): the coordinator's σ, q, C
    and expected batch ``q·N`` (``N`` the dataset's training split: every site's
    records together), and each participant demanding it at σ at least the same, its
    total budget ``--dp-budget``. Unchanged without ``--dpsgd``."""
    if not s.dpsgd:
        return privacy
    return replace(
        privacy,
        updates="distributed",
        dpsgd_noise_multiplier=s.dpsgd_noise_multiplier,
        dpsgd_max_grad_norm=s.dpsgd_max_grad_norm,
        dpsgd_sample_rate=s.dpsgd_sample_rate,
        dpsgd_expected_batch_size=expected_batch,
        total_epsilon=s.dp_budget if privacy.total_epsilon is None else privacy.total_epsilon,
        delta=s.delta,
    )


def _policy(s: SimulationSettings) -> PolicySettings:
    """The participants' ``[policy]``: the defaults, except that a federation which
    evaluates more calibrated heads than ``max_evaluation_heads`` allows (FFC and
    CCVR) raises it to their number, one whose coordinator evaluates more often than
    ``max_evaluations_per_federation`` allows (per-round evaluations, a round gate)
    raises that to what the schedule asks, and one that runs separate FFC and CCVR jobs
    (``ffc_from_ccvr = false``: two releases of one family of per-class moments,
    issue #19) relaxes the release rules that would refuse the second — explicit in
    the generated config, and logged at WARNING by each participant as a
    relaxation."""
    heads = len(s.calibration)
    relaxed: dict[str, object] = {}
    if heads > DEFAULT_MAX_EVALUATION_HEADS:
        relaxed["max_evaluation_heads"] = heads
    asked = _evaluations_asked(s)
    if asked > DEFAULT_MAX_EVALUATIONS_PER_FEDERATION:
        relaxed["max_evaluations_per_federation"] = asked
    if s.example_count_noise_sd != DEFAULT_EXAMPLE_COUNT_NOISE_SD:
        relaxed["example_count_noise_sd"] = s.example_count_noise_sd
    if len(s.statistics_jobs) > 1:
        relaxed["one_release_per_model"] = False
        relaxed["reuse_data_across_federations"] = True
    return PolicySettings(**relaxed)  # type: ignore[arg-type]


def _evaluations_asked(s: SimulationSettings) -> int:
    """What the simulated coordinator's schedule asks of each site
    (:func:`spherecal.coordinator.settings.evaluations_per_site`), with the raw
    per-test coordinator overrides applied."""
    federation = s.extra_coordinator.get("federation", {})
    evaluation = s.extra_coordinator.get("evaluation", {})
    training = s.extra_coordinator.get("training", {})
    return evaluations_per_site(
        rounds=int(training.get("rounds", s.reference.rounds)),
        federated_every=int(evaluation.get("federated_every", s.federated_every)),
        round_gate=str(federation.get("round_gate", "off")),
        validation_gate=bool(federation.get("validation_gate", True)),
        closed_forms=any(c in CLOSED_FORMS for c in s.calibration),
    )


def participant_document(
    settings: SimulationSettings, k: int, port: int, out: Path
) -> dict[str, dict[str, Any]]:
    """Participant ``k``'s TOML document, with the raw per-test overrides
    (``extra_participant``, ``participant_privacy``: TOML keys) applied on top."""
    document = _participant_toml(participant_settings(settings, k, port, out))
    document["participant"].update(settings.extra_participant)
    pid = settings.participant_ids[k]
    if settings.privacy or settings.dpsgd:
        document["privacy"].update(settings.participant_privacy.get(pid, {}))
    return document
