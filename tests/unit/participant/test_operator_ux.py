"""What a site and an operator see: reconnect logging, a short-handed start warned
about loudly, every site's copy of the final models, and the status view."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from spherecal.coordinator.settings import ModelSettings, TrainingSettings
from spherecal.coordinator.state.registry import Peer
from spherecal.inprocess_transport import InProcessFederation
from spherecal.participant.main import run_participant
from spherecal.participant.settings import DataSettings, ParticipantSettings
from spherecal.proto import spherecal_pb2 as pb
from spherecal.spherefed.saved import load_model
from spherecal.status import render_status
from tests.unit.coordinator.helpers import plaintext_federation


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_coordinator_is_said_at_once_then_retried_with_backoff(
    tmp_path: Path,
) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    lines: list[str] = []
    end = run_participant(
        ParticipantSettings(
            participant_id="p0",
            coordinator=address,
            insecure=True,
            state_dir=tmp_path / "state",
            reconnect_max_s=0.2,
            give_up_s=1.0,
            rpc_timeout_s=2.0,
        ),
        log=lines.append,
    )
    assert end.code == 3 and end.ending == ""
    first = [line for line in lines if line.startswith("cannot reach the coordinator")]
    assert len(first) == 1 and address in first[0] and "UNAVAILABLE" in first[0]
    attempts = [line for line in lines if line.startswith("reconnect attempt")]
    assert len(attempts) >= 2
    assert attempts[0].startswith("reconnect attempt 1 in ") and "UNAVAILABLE" in attempts[0]
    assert attempts[1].startswith("reconnect attempt 2 in ")
    assert lines.index(first[0]) < lines.index(attempts[0])
    assert lines[-1].startswith("giving up")


@pytest.fixture(scope="module")
def short_handed(tmp_path_factory: pytest.TempPathFactory) -> tuple[InProcessFederation, Path]:
    """Roster of 3, only p0 and p1 come; the join window is 1 s."""
    tmp = tmp_path_factory.mktemp("short")
    cs, ps = plaintext_federation(
        tmp,
        ModelSettings(extractor="mlp", feature_dim=16),
        TrainingSettings(rounds=2, local_epochs=1, min_participants=1),
    )
    cs = replace(cs, timeouts=replace(cs.timeouts, join_s=1.0))
    sites = [replace(p, out_dir=tmp / "sites" / p.participant_id) for p in ps[:2]]
    torch.set_num_threads(1)
    fed = InProcessFederation(cs, sites).start()
    fed.join(timeout=240)
    return fed, tmp


def test_a_start_without_every_site_is_warned_loudly(
    short_handed: tuple[InProcessFederation, Path],
) -> None:
    fed, _ = short_handed
    summary = fed.summary
    # p2 holds (almost) every sample of class 0: without it the calibration cannot
    # represent that class, and the status says so (issue #20 coverage).
    assert summary["status"] == "degraded"
    assert summary["status_reasons"] == [
        "ffc statistics have no samples of class(es) [0] (of 10): the calibrated heads "
        "cannot represent them"
    ]
    warnings = summary["warnings"]
    assert isinstance(warnings, list) and len(warnings) == 1
    assert "continuing with 2 of 3 participants" in warnings[0] and "p2" in warnings[0]
    assert any(m.startswith("WARNING: join window") for m in fed.messages)


def test_each_present_site_saved_the_final_model(
    short_handed: tuple[InProcessFederation, Path],
) -> None:
    fed, tmp = short_handed
    central = load_model(tmp / "out", "ffc")
    x = torch.randn(7, 1, 8, 8)
    for pid in ("p0", "p1"):
        site = load_model(tmp / "sites" / pid, "ffc")
        with torch.no_grad():
            assert torch.equal(site(x), central(x))
    assert not (tmp / "sites" / "p2").exists()


def test_status_view_of_the_finished_federation(
    short_handed: tuple[InProcessFederation, Path],
) -> None:
    fed, _ = short_handed
    st = fed.service.get_federation_status(pb.FederationStatusRequest(), Peer(address=""))
    assert st.status == "degraded" and st.completed_rounds == 2 and st.current_round == 0
    assert [(r.participant_id, r.joined) for r in st.roster] == [
        ("p0", True),
        ("p1", True),
        ("p2", False),
    ]
    assert [c.round for c in st.completed] == [1, 2]
    assert all(c.contributors == 2 and np.isfinite(c.train_loss) for c in st.completed)
    assert all(c.HasField("test_accuracy") for c in st.completed)  # central test data
    assert list(st.warnings) == fed.summary["warnings"]
    text = render_status(st)
    assert "WARNING: join window" in text and "p2" in text


def test_data_settings_validate_the_test_split() -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        DataSettings(test_fraction=1.0)
    with pytest.raises(ValueError, match="only for dataset 'npz'"):
        DataSettings(dataset="digits", test_root="t.npz")


def test_classifier_names_from_the_coordinator_cannot_pick_a_path(tmp_path: Path) -> None:
    from spherecal.participant.results import FinalModels, write_final_models

    final = FinalModels(
        vector=np.zeros(3), vector_sha256="", heads={"../../evil": np.zeros((2, 2))}
    )
    with pytest.raises(ValueError, match="refusing classifier names"):
        write_final_models(tmp_path / "out", None, final, federation_id="x")  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()
