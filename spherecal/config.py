"""TOML configuration files for ``spherecal coordinator`` and ``spherecal participant``.

Parsing is strict: an unknown section or key, or a value of the wrong type, is an
error naming the file, section and key — a typo in a privacy setting must not be
silently ignored. Relative paths are resolved against the directory of the config
file. The reference of every key is in ``docs/deployment.md``; the defaults are those
of the dataclasses in ``coordinator.settings`` and ``participant.settings``.

:func:`dump_toml` writes the (flat, two-level) documents the simulation harness
generates, so a simulated federation's configs can be read, copied and rerun.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar, cast

from coordinator.settings import (
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
from participant.faults import parse_halt
from participant.settings import ClientTLS, DataSettings, ParticipantSettings
from spherefed.calibrate import CCVRConfig
from spherefed.privacy.settings import PrivacySettings

__all__ = [
    "ConfigError",
    "DATASET_SHAPES",
    "dump_toml",
    "load_coordinator_config",
    "load_participant_config",
    "parse_coordinator_config",
    "parse_participant_config",
]

T = TypeVar("T")

#: (num_classes, in_channels, (height, width)) of the built-in datasets.
DATASET_SHAPES: dict[str, tuple[int, int, tuple[int, int]]] = {
    "digits": (10, 1, (8, 8)),
    "cifar10": (10, 3, (32, 32)),
    "cifar100": (100, 3, (32, 32)),
}


class ConfigError(ValueError):
    """A configuration file that cannot be used as written."""


class _Section:
    """Typed, strict access to one TOML table."""

    def __init__(self, source: str, name: str, table: Mapping[str, Any], base: Path) -> None:
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [{name}] must be a table")
        self.source, self.name, self.base = source, name, base
        self._table = dict(table)
        self._used: set[str] = set()

    def _where(self, key: str) -> str:
        return f"{self.source}: [{self.name}] {key}"

    def has(self, key: str) -> bool:
        return key in self._table

    def get(self, key: str, kind: type[T] | tuple[type, ...], default: T) -> T:
        self._used.add(key)
        if key not in self._table:
            return default
        value = self._table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if bool not in kinds and isinstance(value, bool):
            raise ConfigError(f"{self._where(key)} must be {self._names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise ConfigError(
                f"{self._where(key)} must be {self._names(kinds)}, got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{self._where(key)} must be finite")
        return cast(T, value)

    @staticmethod
    def _names(kinds: tuple[type, ...]) -> str:
        names = {
            int: "an integer",
            float: "a number",
            str: "a string",
            bool: "true/false",
            list: "a list",
        }
        return " or ".join(names.get(k, k.__name__) for k in kinds)

    def optional(self, key: str, kind: type[T]) -> T | None:
        return cast("T | None", self.get(key, (kind,), None))

    def path(self, key: str, default: Path | None = None) -> Path | None:
        text = self.optional(key, str)
        if text is None:
            return default
        p = Path(text).expanduser()
        return p if p.is_absolute() else (self.base / p)

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.get(key, list, list(default))
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self._where(key)} must be a list of strings")
        return tuple(value)

    def finish(self) -> None:
        unknown = sorted(set(self._table) - self._used)
        if unknown:
            raise ConfigError(
                f"{self.source}: [{self.name}] unknown key(s) {unknown}; see docs/deployment.md"
            )


def _sections(
    source: str, document: Mapping[str, Any], allowed: tuple[str, ...], base: Path
) -> dict[str, _Section]:
    unknown = sorted(set(document) - set(allowed))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {unknown}; expected {list(allowed)}")
    return {name: _Section(source, name, document.get(name, {}), base) for name in allowed}


def _privacy(section: _Section) -> PrivacySettings:
    """The ``[privacy]`` table (same keys for coordinator and participant)."""
    d = PrivacySettings()
    try:
        return PrivacySettings(
            enabled=section.get("enabled", bool, d.enabled),
            mechanism=section.get("mechanism", str, d.mechanism),
            epsilon=section.optional("epsilon", float),
            total_epsilon=section.optional("total_epsilon", float),
            delta=section.get("delta", float, d.delta),
            max_examples=section.get("max_examples", int, d.max_examples),
            quant_bits=section.get("quant_bits", int, d.quant_bits),
            colluders=section.get("colluders", int, d.colluders),
            dpsgd=section.get("dpsgd", bool, d.dpsgd),
            dpsgd_noise_multiplier=section.get(
                "dpsgd_noise_multiplier", float, d.dpsgd_noise_multiplier
            ),
            dpsgd_max_grad_norm=section.get("dpsgd_max_grad_norm", float, d.dpsgd_max_grad_norm),
        )
    except ValueError as exc:
        raise ConfigError(f"{section.source}: [privacy] {exc}") from None


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


# ====================================================================== coordinator
COORDINATOR_SECTIONS = (
    "federation",
    "model",
    "training",
    "calibration",
    "secure_aggregation",
    "server",
    "tls",
    "timeouts",
    "evaluation",
    "privacy",
    "admin",
    "metrics",
)


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
    s = _sections(source, document, COORDINATOR_SECTIONS, base)
    fed = s["federation"]
    participants = fed.strings("participants", ())
    if not participants:
        raise ConfigError(f"{source}: [federation] participants (the roster) is required")
    name = fed.get("name", str, "spherecal")
    seed = fed.get("seed", int, 0)
    state_dir = fed.path("state_dir", base / "coordinator-state")
    out_dir = fed.path("out_dir", base / "coordinator-out")
    threads = fed.get("threads", int, 1)

    m = s["model"]
    dataset = m.optional("dataset", str)
    classes, channels, size = DATASET_SHAPES.get(dataset or "digits", DATASET_SHAPES["digits"])
    if dataset is not None and dataset not in DATASET_SHAPES:
        for key in ("num_classes", "in_channels", "image_size"):
            if not m.has(key):
                raise ConfigError(f"{source}: [model] {key} is required for dataset {dataset!r}")
    image = m.get("image_size", list, list(size))
    if len(image) != 2 or not all(isinstance(v, int) and v > 0 for v in image):
        raise ConfigError(f"{source}: [model] image_size must be [height, width]")
    d = ModelSettings()
    head = m.get("head", str, d.head)
    model = ModelSettings(
        extractor=m.get("extractor", str, d.extractor),
        head=head,
        norm=m.get("norm", str, d.norm),
        classifier=m.get("classifier", str, d.classifier),
        num_classes=m.get("num_classes", int, classes),
        in_channels=m.get("in_channels", int, channels),
        image_size=(int(image[0]), int(image[1])),
        feature_dim=m.optional("feature_dim", int),
    )

    t = s["training"]
    td = TrainingSettings()
    training = TrainingSettings(
        rounds=t.get("rounds", int, td.rounds),
        local_epochs=t.get("local_epochs", int, td.local_epochs),
        batch_size=t.get("batch_size", int, td.batch_size),
        lr=t.get("lr", float, td.lr),
        momentum=t.get("momentum", float, td.momentum),
        weight_decay=t.get("weight_decay", float, td.weight_decay),
        loss=t.get("loss", str, "mse" if head == "sphere" else "ce"),
        algorithm=t.get("algorithm", str, td.algorithm),
        prox_mu=t.get("prox_mu", float, td.prox_mu),
        fedopt_lr=t.get("fedopt_lr", float, td.fedopt_lr),
        sample_fraction=t.get("sample_fraction", float, td.sample_fraction),
        min_participants=t.get(
            "min_participants", int, min(td.min_participants, len(participants))
        ),
        max_round_attempts=t.get("max_round_attempts", int, td.max_round_attempts),
    )

    c = s["calibration"]
    cd, vd = CalibrationSettings(), CCVRConfig()
    calibration = CalibrationSettings(
        methods=c.strings("methods", cd.methods),
        ffc_ridge=c.get("ffc_ridge", float, cd.ffc_ridge),
        ffc_from_ccvr=c.get("ffc_from_ccvr", bool, cd.ffc_from_ccvr),
        save_statistics=c.get("save_statistics", bool, cd.save_statistics),
        ccvr=CCVRConfig(
            virtual_per_class=c.get("ccvr_virtual_per_class", int, vd.virtual_per_class),
            tukey=c.get("ccvr_tukey", bool, vd.tukey),
            lr=c.get("ccvr_lr", float, vd.lr),
            epochs=c.get("ccvr_epochs", int, vd.epochs),
            batch_size=c.get("ccvr_batch_size", int, vd.batch_size),
            seed=c.get("ccvr_seed", int, vd.seed),
        ),
    )

    a = s["secure_aggregation"]
    ad = SecAggSettings()
    secagg = SecAggSettings(
        updates=a.get("updates", bool, ad.updates),
        statistics=a.get("statistics", bool, ad.statistics),
        threshold=a.optional("threshold", int),
        threshold_fraction=a.get("threshold_fraction", float, ad.threshold_fraction),
        min_participants=a.get("min_participants", int, ad.min_participants),
        graph=a.get("graph", str, ad.graph),
        consistency_check=a.get("consistency_check", bool, ad.consistency_check),
        update_bound=a.get("update_bound", float, ad.update_bound),
        statistics_bound=a.get("statistics_bound", float, ad.statistics_bound),
        chunk_entries=a.get("chunk_entries", int, ad.chunk_entries),
        max_in_flight=a.get("max_in_flight", int, ad.max_in_flight),
        audit_sample_bytes=a.get("audit_sample_bytes", int, ad.audit_sample_bytes),
    )

    sv = s["server"]
    sd = ServerSettings()
    server = ServerSettings(
        listen=sv.get("listen", str, sd.listen),
        insecure=sv.get("insecure", bool, sd.insecure),
        max_message_bytes=int(
            sv.get("max_message_mb", float, sd.max_message_bytes / 2**20) * 2**20
        ),
        max_chunk_bytes=int(sv.get("max_chunk_mb", float, sd.max_chunk_bytes / 2**20) * 2**20),
        max_workers=sv.get("max_workers", int, sd.max_workers),
        port_file=sv.path("port_file"),
    )
    if server.max_chunk_bytes + 4096 > server.max_message_bytes:
        raise ConfigError(f"{source}: [server] max_chunk_mb must be below max_message_mb")

    tl = s["tls"]
    tls = TLSSettings(
        cert=tl.path("cert"),
        key=tl.path("key"),
        client_ca=tl.path("client_ca"),
        crl=tl.path("crl"),
    )

    to = s["timeouts"]
    tdd = Timeouts()
    timeouts = Timeouts(
        **{
            name: to.get(name, float, getattr(tdd, name))
            for name in (
                "join_s",
                "round_s",
                "stage_s",
                "evaluation_s",
                "heartbeat_interval_s",
                "heartbeat_timeout_s",
                "linger_s",
                "clock_skew_s",
                "long_poll_s",
            )
        }
    )
    if timeouts.heartbeat_timeout_s <= timeouts.heartbeat_interval_s:
        raise ConfigError(f"{source}: [timeouts] heartbeat_timeout_s must exceed the interval")

    e = s["evaluation"]
    evaluation = EvaluationSettings(
        test_dataset=e.optional("test_dataset", str),
        test_data_root=e.optional("test_data_root", str),
        federated_every=e.get("federated_every", int, 0),
    )
    privacy = _privacy(s["privacy"])
    admin = AdminSettings(allow=s["admin"].strings("allow", ()))
    mx = s["metrics"]
    metrics = MetricsSettings(
        listen=mx.optional("listen", str), allow_remote=mx.get("allow_remote", bool, False)
    )
    for section in s.values():
        section.finish()
    try:
        settings = CoordinatorSettings(
            admin=admin,
            metrics=metrics,
            participants=participants,
            name=name,
            seed=seed,
            model=model,
            training=training,
            calibration=calibration,
            secagg=secagg,
            server=server,
            tls=tls,
            timeouts=timeouts,
            evaluation=evaluation,
            privacy=privacy,
            state_dir=state_dir or base / "coordinator-state",
            out_dir=out_dir or base / "coordinator-out",
        )
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if threads < 1:
        raise ConfigError(f"{source}: [federation] threads must be >= 1")
    return settings, threads


# ====================================================================== participant
PARTICIPANT_SECTIONS = ("participant", "tls", "data", "privacy")


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
    s = _sections(source, document, PARTICIPANT_SECTIONS, base)
    p = s["participant"]
    pid = p.optional("id", str)
    if not pid:
        raise ConfigError(f"{source}: [participant] id is required")
    d = ParticipantSettings(participant_id=pid)
    halts = p.strings("halt_before", ())
    try:
        halt_points = tuple(parse_halt(h) for h in halts)
    except ValueError as exc:
        raise ConfigError(f"{source}: [participant] halt_before: {exc}") from None
    t = s["tls"]
    tls = ClientTLS(
        ca=t.path("ca"),
        cert=t.path("cert"),
        key=t.path("key"),
        server_name=t.optional("server_name", str),
    )
    dd = DataSettings()
    da = s["data"]
    try:
        data = DataSettings(
            dataset=da.get("dataset", str, dd.dataset),
            root=str(da.path("root")) if da.has("root") else None,
            slice_index=da.optional("slice_index", int),
            slice_of=da.optional("slice_of", int),
            partition=da.get("partition", str, dd.partition),
            alpha=da.get("alpha", float, dd.alpha),
            shards_per_client=da.get("shards_per_client", int, dd.shards_per_client),
            seed=da.get("seed", int, dd.seed),
            validation_fraction=da.get("validation_fraction", float, dd.validation_fraction),
            test_fraction=da.get("test_fraction", float, dd.test_fraction),
            num_classes=da.optional("num_classes", int),
            test_root=str(da.path("test_root")) if da.has("test_root") else None,
        )
    except ValueError as exc:
        raise ConfigError(f"{source}: [data] {exc}") from None
    settings = ParticipantSettings(
        participant_id=pid,
        coordinator=p.get("coordinator", str, d.coordinator),
        insecure=p.get("insecure", bool, d.insecure),
        tls=tls,
        data=data,
        state_dir=p.path("state_dir", base / f"participant-{pid}") or base,
        out_dir=p.path("out_dir", base / f"participant-{pid}-out") or base,
        extractors=p.strings("extractors", d.extractors),
        identity_key=p.path("identity_key"),
        threads=p.get("threads", int, d.threads),
        allow_plaintext=p.get("allow_plaintext", bool, d.allow_plaintext),
        max_message_bytes=int(p.get("max_message_mb", float, d.max_message_bytes / 2**20) * 2**20),
        long_poll_ms=p.get("long_poll_ms", int, d.long_poll_ms),
        reconnect_max_s=p.get("reconnect_max_s", float, d.reconnect_max_s),
        give_up_s=p.get("give_up_s", float, d.give_up_s),
        rpc_timeout_s=p.get("rpc_timeout_s", float, d.rpc_timeout_s),
        halt_before=halt_points,
        privacy=_privacy(s["privacy"]),
    )
    for section in s.values():
        section.finish()
    return settings


def with_overrides(settings: ParticipantSettings, **changes: Any) -> ParticipantSettings:
    return replace(settings, **changes)


# ====================================================================== writing
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("TOML cannot hold non-finite floats here")
        return repr(value)
    if isinstance(value, str | Path):
        text = str(value).replace("\\", "\\\\").replace('"', '\\"')
        return f'"{text}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dump_toml(document: Mapping[str, Mapping[str, Any]]) -> str:
    """A two-level TOML document (sections of scalars/lists); ``None`` values are omitted."""
    lines: list[str] = []
    for section, table in document.items():
        lines.append(f"[{section}]")
        for key, value in table.items():
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
