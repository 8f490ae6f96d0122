"""TOML configuration files for ``spherecal coordinator`` and ``spherecal participant``.

Parsing is strict: an unknown table or key, or a value of the wrong type, is an error
naming the file, table and key — a typo in a privacy setting must not be silently
ignored. Relative paths are resolved against the directory of the config file.

The keys are not spelled out here: every table is a settings dataclass
(``spherecal.coordinator.settings``, ``spherecal.participant.settings``,
``spherecal.spherefed.privacy.settings``)
mapped by :mod:`spherecal.config_schema`, which also writes configs back
(:func:`coordinator_document`, :func:`participant_document`, :func:`dump_toml` with
``tomli-w``) and renders the key reference in ``docs/deployment.md``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

from spherecal.config_schema import (
    Codec,
    ConfigError,
    Extra,
    Section,
    Table,
    did_you_mean,
    read_table,
    write_table,
)
from spherecal.coordinator.settings import (
    AdminSettings,
    CalibrationSettings,
    CoordinatorSettings,
    EvaluationSettings,
    MetricsSettings,
    ModelSettings,
    SecAggSettings,
    ServerSettings,
    Timeouts,
    TLSSettings,
    TrainingSettings,
)
from spherecal.crypto import SecAggError
from spherecal.participant.faults import parse_halt
from spherecal.participant.policy import PolicySettings
from spherecal.participant.settings import ClientTLS, DataSettings, ParticipantSettings
from spherecal.spherefed.privacy.settings import PrivacySettings

__all__ = [
    "COORDINATOR_TABLES",
    "ConfigError",
    "DATASET_SHAPES",
    "PARTICIPANT_TABLES",
    "coordinator_document",
    "dump_toml",
    "load_coordinator_config",
    "load_participant_config",
    "parse_coordinator_config",
    "parse_participant_config",
    "participant_document",
]

#: (num_classes, in_channels, (height, width)) of the built-in datasets.
DATASET_SHAPES: dict[str, tuple[int, int, tuple[int, int]]] = {
    "digits": (10, 1, (8, 8)),
    "mnist1d": (10, 40, (1, 1)),
    "cifar10": (10, 3, (32, 32)),
    "cifar100": (100, 3, (32, 32)),
}

# ====================================================================== the tables
PRIVACY = Table(
    "privacy",
    PrivacySettings,
    note="DP calibration releases ([privacy.md](privacy.md)); on a participant, its own policy",
    help={
        "enabled": "Coordinator: add DP noise to every calibration release (needs "
        "`[secure_aggregation] statistics`). Participant: refuse statistics without it.",
        "mechanism": "`skellam` or `dgauss` (distributed discrete noise).",
        "delta": "δ of every release; a participant's must equal the job's.",
        "quant_bits": "Fixed-point bits of the noisy statistics.",
        "dpsgd_noise_multiplier": "DP-SGD noise multiplier σ (local; distributed: the "
        "coordinator's, and the least a participant accepts).",
        "dpsgd_max_grad_norm": "DP-SGD per-example clipping norm `C` (local, or the "
        "coordinator's for distributed DP-SGD).",
        "updates": '`"distributed"`: training is distributed DP-SGD (coordinator: run it, '
        "needs secure updates; participant: refuse any other training). `\"none\"`: no DP "
        "on updates unless `dpsgd`.",
        "dpsgd_sample_rate": "Coordinator, distributed DP-SGD: the federation-wide Poisson "
        "rate `q`.",
        "dpsgd_expected_batch_size": "Coordinator, distributed DP-SGD: the public `q·N` the "
        "noisy gradient sum is divided by (required).",
    },
)

_SUB_TABLES = frozenset(
    {"model", "training", "calibration", "secagg", "server", "tls", "timeouts", "evaluation"}
    | {"privacy", "admin", "metrics"}
)

COORDINATOR_TABLES: tuple[Table, ...] = (
    Table(
        "federation",
        CoordinatorSettings,
        skip=frozenset(_SUB_TABLES),
        extras=(Extra("threads", int, 1, "Torch threads (central evaluation, CCVR)."),),
    ),
    Table(
        "model",
        ModelSettings,
        extras=(
            Extra(
                "dataset",
                str,
                None,
                "`digits`, `cifar10`, `cifar100` fill `num_classes`, `in_channels`, "
                "`image_size`; for any other dataset give those three.",
            ),
        ),
    ),
    Table(
        "training",
        TrainingSettings,
        default_text={
            "loss": '`"mse"` for the `sphere` head, else `"ce"`',
            "min_participants": "`2` (at most the roster)",
        },
    ),
    Table(
        "calibration",
        CalibrationSettings,
        flatten={"ccvr": "ccvr_"},
        help={
            "ccvr_virtual_per_class": "CCVR: virtual features per class (`M_c`).",
            "ccvr_tukey": "CCVR: Tukey's transformation of the features.",
            "ccvr_lr": "CCVR: learning rate of the classifier retraining.",
            "ccvr_epochs": "CCVR: epochs of the classifier retraining.",
            "ccvr_batch_size": "CCVR: batch size of the classifier retraining.",
            "ccvr_seed": "CCVR: seed of the virtual features.",
        },
    ),  # fmt: skip
    Table(
        "secure_aggregation",
        SecAggSettings,
        default_text={"threshold": "majority"},
    ),
    Table(
        "server",
        ServerSettings,
        rename={"max_message_bytes": "max_message_mb", "max_chunk_bytes": "max_chunk_mb"},
        mebibytes=frozenset({"max_message_bytes", "max_chunk_bytes"}),
    ),
    Table("tls", TLSSettings, note="required unless `[server] insecure`"),
    Table("timeouts", Timeouts, note="seconds"),
    Table("evaluation", EvaluationSettings),
    PRIVACY,
    Table("admin", AdminSettings, note="who may read the live status view (`spherecal status`)"),
    Table("metrics", MetricsSettings, note="Prometheus endpoint, off by default"),
)

PARTICIPANT_TABLES: tuple[Table, ...] = (
    Table(
        "participant",
        ParticipantSettings,
        rename={"participant_id": "id", "max_message_bytes": "max_message_mb"},
        skip=frozenset({"tls", "data", "privacy", "policy"}),
        mebibytes=frozenset({"max_message_bytes"}),
        codecs={"halt_before": Codec(parse_halt)},
        hidden=frozenset({"halt_before", "corrupt_shares", "adversary"}),
        default_text={
            "state_dir": "`participant-<id>`",
            "out_dir": "`participant-<id>-out`",
            "identity_key": "`state_dir/identity.key`",
        },
    ),
    Table("tls", ClientTLS, note="required unless `insecure`"),
    Table("data", DataSettings, paths=frozenset({"root", "test_root"})),
    PRIVACY,
    Table(
        "policy",
        PolicySettings,
        note="what this participant refuses ([privacy.md](privacy.md#participant-policy))",
        default_text={"max_evaluations_per_split": "`max_evaluations_per_federation`'s"},
    ),
)


def _by_name(tables: tuple[Table, ...]) -> dict[str, Table]:
    return {t.name: t for t in tables}


def _sections(
    source: str, document: Mapping[str, Any], tables: tuple[Table, ...], base: Path
) -> dict[str, Section]:
    allowed = [t.name for t in tables]
    unknown = sorted(set(document) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{source}: unknown section(s) {unknown}{did_you_mean(unknown, allowed)}; "
            f"expected {allowed}"
        )
    return {name: Section(source, name, document.get(name, {}), base) for name in allowed}


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _privacy(section: Section) -> PrivacySettings:
    try:
        return PrivacySettings(**read_table(section, PRIVACY))
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{section.source}: [privacy] {exc}") from None


def _policy(section: Section, table: Table) -> PolicySettings:
    try:
        return PolicySettings(**read_table(section, table))
    except ConfigError:
        raise
    except (ValueError, SecAggError) as exc:
        raise ConfigError(f"{section.source}: [policy] {exc}") from None


# ====================================================================== coordinator
def load_coordinator_config(path: str | Path) -> tuple[CoordinatorSettings, int]:
    """(settings, torch threads) from a coordinator TOML file."""
    target = Path(path)
    return parse_coordinator_config(_read(target), source=str(target), base=target.parent)


def parse_coordinator_config(
    document: Mapping[str, Any], *, source: str = "<config>", base: Path = Path(".")
) -> tuple[CoordinatorSettings, int]:
    try:
        return _parse_coordinator(document, source, base)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parse_coordinator(
    document: Mapping[str, Any], source: str, base: Path
) -> tuple[CoordinatorSettings, int]:
    s = _sections(source, document, COORDINATOR_TABLES, base)
    tables = _by_name(COORDINATOR_TABLES)
    fed = read_table(
        s["federation"],
        tables["federation"],
        {
            "participants": (),
            "state_dir": base / "coordinator-state",
            "out_dir": base / "coordinator-out",
        },
    )
    participants = fed["participants"]
    if not participants:
        raise ConfigError(f"{source}: [federation] participants (the roster) is required")
    threads = fed.pop("threads")

    m = s["model"]
    dataset = m.optional("dataset", str)
    classes, channels, size = DATASET_SHAPES.get(dataset or "digits", DATASET_SHAPES["digits"])
    if dataset is not None and dataset not in DATASET_SHAPES:
        for key in ("num_classes", "in_channels", "image_size"):
            if not m.has(key):
                raise ConfigError(f"{source}: [model] {key} is required for dataset {dataset!r}")
    model_args = read_table(
        m, tables["model"], {"num_classes": classes, "in_channels": channels, "image_size": size}
    )
    model_args.pop("dataset")
    model = ModelSettings(**model_args)

    training = TrainingSettings(
        **read_table(
            s["training"],
            tables["training"],
            {
                "loss": "mse" if model.head == "sphere" else "ce",
                "min_participants": min(TrainingSettings().min_participants, len(participants)),
            },
        )
    )
    calibration = CalibrationSettings(**read_table(s["calibration"], tables["calibration"]))
    secagg = SecAggSettings(**read_table(s["secure_aggregation"], tables["secure_aggregation"]))
    server = ServerSettings(**read_table(s["server"], tables["server"]))
    if server.max_chunk_bytes + 4096 > server.max_message_bytes:
        raise ConfigError(f"{source}: [server] max_chunk_mb must be below max_message_mb")
    tls = TLSSettings(**read_table(s["tls"], tables["tls"]))
    timeouts = Timeouts(**read_table(s["timeouts"], tables["timeouts"]))
    if timeouts.heartbeat_timeout_s <= timeouts.heartbeat_interval_s:
        raise ConfigError(f"{source}: [timeouts] heartbeat_timeout_s must exceed the interval")
    evaluation = EvaluationSettings(**read_table(s["evaluation"], tables["evaluation"]))
    privacy = _privacy(s["privacy"])
    admin = AdminSettings(**read_table(s["admin"], tables["admin"]))
    metrics = MetricsSettings(**read_table(s["metrics"], tables["metrics"]))
    for section in s.values():
        section.finish()
    try:
        settings = CoordinatorSettings(
            **fed,
            model=model,
            training=training,
            calibration=calibration,
            secagg=secagg,
            server=server,
            tls=tls,
            timeouts=timeouts,
            evaluation=evaluation,
            privacy=privacy,
            admin=admin,
            metrics=metrics,
        )
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if threads < 1:
        raise ConfigError(f"{source}: [federation] threads must be >= 1")
    return settings, threads


def coordinator_document(settings: CoordinatorSettings, *, threads: int = 1) -> dict[str, Any]:
    """``settings`` as a coordinator config document (what :func:`dump_toml` writes)."""
    tables = _by_name(COORDINATOR_TABLES)
    parts = {
        "federation": settings,
        "model": settings.model,
        "training": settings.training,
        "calibration": settings.calibration,
        "secure_aggregation": settings.secagg,
        "server": settings.server,
        "tls": settings.tls,
        "timeouts": settings.timeouts,
        "evaluation": settings.evaluation,
        "privacy": settings.privacy,
        "admin": settings.admin,
        "metrics": settings.metrics,
    }
    extras = {"federation": {"threads": threads}}
    return {
        name: write_table(tables[name], value, extras.get(name)) for name, value in parts.items()
    }


# ====================================================================== participant
def load_participant_config(path: str | Path) -> ParticipantSettings:
    target = Path(path)
    return parse_participant_config(_read(target), source=str(target), base=target.parent)


def parse_participant_config(
    document: Mapping[str, Any], *, source: str = "<config>", base: Path = Path(".")
) -> ParticipantSettings:
    try:
        return _parse_participant(document, source, base)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parse_participant(document: Mapping[str, Any], source: str, base: Path) -> ParticipantSettings:
    s = _sections(source, document, PARTICIPANT_TABLES, base)
    tables = _by_name(PARTICIPANT_TABLES)
    p = s["participant"]
    pid = p.optional("id", str)
    if not pid:
        raise ConfigError(f"{source}: [participant] id is required")
    top = read_table(
        p,
        tables["participant"],
        {
            "id": pid,
            "state_dir": base / f"participant-{pid}",
            "out_dir": base / f"participant-{pid}-out",
        },
    )
    tls = ClientTLS(**read_table(s["tls"], tables["tls"]))
    try:
        data = DataSettings(**read_table(s["data"], tables["data"]))
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{source}: [data] {exc}") from None
    settings = ParticipantSettings(
        **top,
        tls=tls,
        data=data,
        privacy=_privacy(s["privacy"]),
        policy=_policy(s["policy"], tables["policy"]),
    )
    for section in s.values():
        section.finish()
    return settings


def participant_document(settings: ParticipantSettings) -> dict[str, Any]:
    """``settings`` as a participant config document (what :func:`dump_toml` writes)."""
    tables = _by_name(PARTICIPANT_TABLES)
    return {
        "participant": write_table(tables["participant"], settings),
        "tls": write_table(tables["tls"], settings.tls),
        "data": write_table(tables["data"], settings.data),
        "privacy": write_table(tables["privacy"], settings.privacy),
        "policy": write_table(tables["policy"], settings.policy),
    }


# ====================================================================== writing
def dump_toml(document: Mapping[str, Mapping[str, Any]]) -> str:
    """A TOML document of tables (``tomli-w``); ``None`` values are left out (TOML has
    no null: an absent key reads back as the default)."""
    clean = {
        section: {
            k: (str(v) if isinstance(v, Path) else v) for k, v in table.items() if v is not None
        }
        for section, table in document.items()
    }
    return tomli_w.dumps(clean)
