"""Settings from one source: the TOML reader, writer and docs tables all derive from
the settings dataclasses (``spherecal.config_schema``)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest

from spherecal.config import (
    COORDINATOR_TABLES,
    PARTICIPANT_TABLES,
    ConfigError,
    coordinator_document,
    dump_toml,
    parse_coordinator_config,
    parse_participant_config,
    participant_document,
)
from spherecal.config_docs import DOC, main, render
from spherecal.config_schema import field_docs, table_keys
from spherecal.coordinator.settings import (
    CalibrationSettings,
    CoordinatorSettings,
    ModelSettings,
    SecAggSettings,
    ServerSettings,
    Timeouts,
    TLSSettings,
    TrainingSettings,
)
from spherecal.participant.faults import parse_halt
from spherecal.participant.settings import ClientTLS, DataSettings, ParticipantSettings
from spherecal.spherefed.calibrate import CCVRConfig
from spherecal.spherefed.privacy.settings import PrivacySettings


def _coordinator(tmp: Path) -> CoordinatorSettings:
    """Settings with a non-default value wherever one is easy to pick."""
    return CoordinatorSettings(
        participants=("a", "b", "c"),
        name="multi\nline name",  # the old hand-written writer broke TOML here
        seed=7,
        model=ModelSettings(
            extractor="mlp", head="plain", num_classes=3, in_channels=2, image_size=(5, 6),
            feature_dim=12,
        ),
        training=TrainingSettings(
            rounds=4, lr=0.05, loss="ce", algorithm="fedyogi", fedopt_lr=0.02,
            sample_fraction=0.5, min_participants=3, max_round_attempts=5,
        ),
        calibration=CalibrationSettings(
            methods=("ffc", "ccvr"), ffc_ridge=0.5, ffc_from_ccvr=False,
            ccvr=CCVRConfig(virtual_per_class=7, tukey=True, lr=0.3, epochs=2, batch_size=5,
                            seed=9),
        ),
        secagg=SecAggSettings(threshold=3, graph="harary:2", chunk_entries=1024,
                              update_bound=12.5),
        server=ServerSettings(listen="127.0.0.1:0", insecure=True, max_message_bytes=3 << 20,
                              max_chunk_bytes=1 << 19, port_file=tmp / "port"),
        tls=TLSSettings(cert=tmp / "c.pem", crl=tmp / "crl.pem"),
        timeouts=Timeouts(join_s=11.0, heartbeat_interval_s=0.25),
        privacy=PrivacySettings(enabled=True, epsilon=2.0, delta=1e-6, colluders=1),
        state_dir=tmp / "state",
        out_dir=tmp / "out",
    )  # fmt: skip


def test_coordinator_settings_round_trip_through_toml(tmp_path: Path) -> None:
    original = _coordinator(tmp_path)
    text = dump_toml(coordinator_document(original, threads=3))
    settings, threads = parse_coordinator_config(tomllib.loads(text), source="c.toml")
    assert settings == original and threads == 3


def test_participant_settings_round_trip_through_toml(tmp_path: Path) -> None:
    original = ParticipantSettings(
        participant_id="p1",
        coordinator="10.0.0.1:9",
        state_dir=tmp_path / "s",
        out_dir=tmp_path / "o",  # the loader always sets one (None: programmatic only)
        identity_key=tmp_path / "id.key",
        max_message_bytes=5 << 20,
        give_up_s=3.5,
        halt_before=(parse_halt("share@ccvr"), parse_halt("train@r2")),
        tls=ClientTLS(ca=tmp_path / "ca.pem", server_name='quote " and \\ back'),
        data=DataSettings(root=str(tmp_path / "d.npz"), slice_index=1, slice_of=3, alpha=0.7),
        privacy=PrivacySettings(enabled=True, epsilon=1.0, total_epsilon=3.0, dpsgd=True),
    )
    text = dump_toml(participant_document(original))
    assert parse_participant_config(tomllib.loads(text), source="p.toml") == original


def test_dump_toml_writes_valid_toml_for_awkward_strings() -> None:
    awkward = 'two\nlines, a "quote", a \\ backslash and a tab\t'
    document = {"a": {"s": awkward, "p": Path("x/y"), "n": None, "l": [1, 2]}}
    assert tomllib.loads(dump_toml(document)) == {"a": {"s": awkward, "p": "x/y", "l": [1, 2]}}


def test_every_field_is_a_key_with_a_meaning() -> None:
    documented = {(t.name, k.key) for t in COORDINATOR_TABLES for k in table_keys(t)}
    # every field of every settings dataclass appears (nested ones flattened)
    for cls, table in [
        (TrainingSettings, "training"),
        (SecAggSettings, "secure_aggregation"),
        (Timeouts, "timeouts"),
        (PrivacySettings, "privacy"),
    ]:
        for f in dataclasses.fields(cls):
            assert (table, f.name) in documented, f"{cls.__name__}.{f.name} has no TOML key"
    for f in dataclasses.fields(CCVRConfig):
        assert ("calibration", f"ccvr_{f.name}") in documented
    for tables in (COORDINATOR_TABLES, PARTICIPANT_TABLES):
        for schema in tables:
            for key in table_keys(schema):
                if key.key not in schema.hidden:
                    assert key.help, f"[{schema.name}] {key.key} has no docstring/help"


def test_reading_a_config_reads_no_source(tmp_path: Path) -> None:
    """Every coordinator and site process reads its config at start: the keys' help
    (docstrings found by parsing the settings modules' source) is for the docs and is
    not looked up then — it cost about 0.1 s of processor per coordinator start."""
    coordinator = dump_toml(coordinator_document(_coordinator(tmp_path), threads=1))
    participant = dump_toml(participant_document(ParticipantSettings(participant_id="p1")))
    field_docs.cache_clear()
    parse_coordinator_config(tomllib.loads(coordinator), source="c.toml")
    parse_participant_config(tomllib.loads(participant), source="p.toml")
    assert field_docs.cache_info().currsize == 0
    table = COORDINATOR_TABLES[0]
    key = next(k for k in table_keys(table) if k.key not in table.help)
    assert key.help and field_docs.cache_info().currsize == 1  # asked for: read then


def test_field_docs_reads_the_docstrings_under_fields() -> None:
    docs = field_docs(TrainingSettings)
    assert docs["fedopt_lr"].startswith("Server learning rate η of FedAdam / FedYogi")
    assert "\n" not in docs["max_round_attempts"]


def test_the_committed_docs_tables_are_current() -> None:
    text = DOC.read_text()
    assert render(text) == text, "docs/deployment.md is stale: python -m spherecal.config_docs"
    assert main(["--check"]) == 0


def test_the_docs_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    page = tmp_path / "deployment.md"
    page.write_text(DOC.read_text().replace("| `rounds` | integer | `30` |", "| `rounds` | x |"))
    assert main(["--check", "--doc", str(page)]) == 1
    assert main(["--doc", str(page)]) == 0 and main(["--check", "--doc", str(page)]) == 0


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"calibration": {"ccvr_lr": "fast"}},
         r"^c\.toml: \[calibration\] ccvr_lr must be a number, got str$"),
        ({"calibration": {"ccvr_lrr": 0.1}}, r"\[calibration\] unknown key\(s\) \['ccvr_lrr'\]"),
        ({"server": {"max_message_mb": "8"}}, r"\[server\] max_message_mb must be a number"),
        ({"model": {"image_size": [8]}}, r"\[model\] image_size must be a list of 2 positive"),
        ({"model": {"image_size": [8, True]}}, r"image_size must be a list of 2 positive"),
        ({"federation": {"state_dir": 3}}, r"\[federation\] state_dir must be a string, got int"),
        ({"federation": {"threads": 0}}, r"threads must be >= 1"),
        ({"training": {"max_lost_rounds_in_a_row": -1}}, r"max_lost_rounds_in_a_row must be >= 0"),
        ({"privacy": {"epsilon": float("inf")}}, r"\[privacy\] epsilon must be finite"),
        ({"privacy": {"mechanism": "laplace"}}, r"^c\.toml: \[privacy\] "),
        ({"tls": "x"}, r"\[tls\] must be a table"),
    ],
)  # fmt: skip
def test_coordinator_mistakes_are_one_line_errors(document: dict[str, Any], message: str) -> None:
    document = {"federation": {"participants": ["a", "b"]}, **document}
    if "participants" not in document["federation"]:
        document["federation"]["participants"] = ["a", "b"]
    with pytest.raises(ConfigError, match=message) as info:
        parse_coordinator_config(document, source="c.toml")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"participant": {"id": "a", "halt_before": ["nap"]}}, r"\[participant\] halt_before: "),
        ({"participant": {"id": "a", "max_message_mb": True}}, r"must be a number, got a boolean"),
        ({"participant": {"id": "a"}, "data": {"root": 1}}, r"\[data\] root must be a string"),
        ({"participant": {"id": "a"}, "data": {"slice_index": 1}}, r"\[data\] .*go together"),
        ({"participant": {"id": "a"}, "tls": {"sni": "x"}}, r"\[tls\] unknown key\(s\) \['sni'\]"),
    ],
)  # fmt: skip
def test_participant_mistakes_are_one_line_errors(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_participant_config(document, source="p.toml")
    assert "\n" not in str(info.value)


def test_a_float_default_in_the_docs_reads_back_as_the_default() -> None:
    """A reader copies the documented default into a TOML file: it must be that value
    (``:g`` printed 2^-16 as ``1.52588e-05``, a different float)."""
    from spherecal.config_schema import _default_text

    floats = 0
    for tables in (COORDINATOR_TABLES, PARTICIPANT_TABLES):
        for schema in tables:
            for key in table_keys(schema):
                shown = _default_text(key)
                if isinstance(key.default, float) and key.key not in schema.default_text:
                    if key.path[-1] in schema.mebibytes:
                        continue
                    floats += 1
                    assert float(shown.strip("`")) == key.default, (schema.name, key.key, shown)
    assert floats > 10
