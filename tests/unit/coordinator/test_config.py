"""Coordinator TOML: strict, typed, paths relative to the file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from spherecal.config import (
    ConfigError,
    dump_toml,
    load_coordinator_config,
    parse_coordinator_config,
)

EXAMPLE = """
[federation]
name = "two-hospitals"
participants = ["hospital-a", "hospital-b"]
seed = 3
state_dir = "state"

[model]
dataset = "cifar10"
extractor = "convnet"

[training]
rounds = 5
lr = 0.05

[calibration]
methods = ["ffc", "ccvr"]

[secure_aggregation]
threshold = 2

[server]
listen = "0.0.0.0:50051"

[tls]
cert = "certs/server.pem"
key = "certs/server.key"
client_ca = "certs/ca.pem"
"""


def test_example_parses_with_defaults_and_relative_paths(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.toml"
    path.write_text(EXAMPLE)
    settings, threads = load_coordinator_config(path)
    assert settings.participants == ("hospital-a", "hospital-b")
    assert settings.model.num_classes == 10 and settings.model.in_channels == 3
    assert settings.model.image_size == (32, 32)
    assert settings.training.rounds == 5 and settings.training.loss == "mse"
    assert settings.secagg.threshold == 2 and settings.secagg.updates
    assert settings.tls.cert == tmp_path / "certs" / "server.pem"
    assert settings.state_dir == tmp_path / "state"
    assert threads == 1


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"training": {"lrr": 0.1}}, "unknown key"),
        ({"bogus": {}}, "unknown section"),
        ({"training": {"rounds": "5"}}, "must be an integer"),
        ({"secure_aggregation": {"updates": 1}}, "must be true/false"),
        ({"federation": {"participants": []}}, "roster"),
        ({"model": {"dataset": "npz"}}, "required for dataset"),
        ({"timeouts": {"heartbeat_interval_s": 5.0, "heartbeat_timeout_s": 1.0}}, "exceed"),
        ({"calibration": {"methods": ["fcc"]}}, "unknown calibration"),
        ({"training": {"algorithm": "fedsgd"}}, "algorithm must be one of"),
        ({"training": {"algorithm": "fedyogi", "fedopt_lr": -0.1}}, "fedopt_lr must be > 0"),
    ],
)
def test_mistakes_are_reported_with_their_place(patch: dict, message: str) -> None:
    document = tomllib.loads(EXAMPLE)
    for section, values in patch.items():
        document.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError, match=message):
        parse_coordinator_config(document, source="c.toml")


def test_dump_toml_round_trips() -> None:
    document = {"a": {"x": 1, "y": 0.5, "z": 's"q', "w": [1, 2], "b": True, "n": None}}
    assert tomllib.loads(dump_toml(document)) == {
        "a": {"x": 1, "y": 0.5, "z": 's"q', "w": [1, 2], "b": True}
    }


def test_server_optimizer_settings_are_read() -> None:
    document = tomllib.loads(EXAMPLE)
    document["training"].update({"algorithm": "fedyogi", "fedopt_lr": 0.03})
    settings, _ = parse_coordinator_config(document, source="c.toml")
    assert settings.training.algorithm == "fedyogi" and settings.training.fedopt_lr == 0.03
