from __future__ import annotations

from pathlib import Path

import pytest

from spherecal.config import ConfigError, load_participant_config, parse_participant_config
from spherecal.participant.faults import HaltPoint


def test_participant_config(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        """
[participant]
id = "hospital-a"
coordinator = "coord.example.org:50051"
state_dir = "state"
halt_before = ["share@ffc"]

[tls]
ca = "certs/ca.pem"
cert = "certs/hospital-a.pem"
key = "certs/hospital-a.key"

[data]
dataset = "npz"
root = "data/local.npz"
"""
    )
    s = load_participant_config(path)
    assert s.participant_id == "hospital-a" and not s.insecure and not s.allow_plaintext
    assert s.tls.ca == tmp_path / "certs" / "ca.pem"
    assert s.data.root == str(tmp_path / "data" / "local.npz")
    assert s.data.slice_index is None
    assert s.identity_path == tmp_path / "state" / "identity.key"
    assert s.halt_before == (HaltPoint("share", "ffc"),)


def test_participant_config_errors() -> None:
    with pytest.raises(ConfigError, match="id is required"):
        parse_participant_config({"participant": {}})
    with pytest.raises(ConfigError, match="halt_before"):
        parse_participant_config({"participant": {"id": "a", "halt_before": ["nap"]}})
    with pytest.raises(ConfigError, match="slice"):
        parse_participant_config({"participant": {"id": "a"}, "data": {"slice_index": 1}})
