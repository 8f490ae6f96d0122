"""The service subcommands of the ``spherecal`` CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from spherecal.cli.app import main
from spherecal.cli.simulate import _simulate_options, simulation_settings_from


def test_certs_init_and_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "init", str(tmp_path / "ca"), "--host", "coord.example.org"]) == 0
    assert main(["certs", "issue", "hospital-a", "--dir", str(tmp_path / "ca")]) == 0
    out = capsys.readouterr().out
    assert "hospital-a.identity.key" in out and "server.pem" in out
    assert main(["certs", "init", str(tmp_path / "ca")]) == 2  # never replace a CA
    assert "refusing to replace" in capsys.readouterr().err


def test_simulate_options_merge_config_file_and_command_line(tmp_path: Path) -> None:
    config = tmp_path / "sim.toml"
    config.write_text(
        '[simulate]\nparticipants = 4\nrounds = 3\nalpha = "iid"\nout = "run"\n'
        'drop = "p3:share@ffc"\ncalibration = "ffc"\n'
    )
    parser_args = [
        "simulate",
        "--config",
        str(config),
        "--rounds",
        "5",
        "--no-secure-updates",
        "--separate-ffc",
    ]
    from spherecal.cli.app import build_parser

    args = build_parser().parse_args(parser_args)
    options = _simulate_options(args)
    settings = simulation_settings_from(options)
    assert settings.reference.participants == 4
    assert settings.reference.rounds == 5  # the command line wins
    assert settings.reference.partition == "iid"
    assert settings.out == (tmp_path / "run").resolve()
    assert not settings.secure_updates and settings.secure_statistics
    assert [str(d) for d in settings.drops] == ["p3:share@ffc"]


def test_simulate_carries_the_server_optimizer_to_the_coordinator_config(
    tmp_path: Path,
) -> None:
    from spherecal.cli.app import build_parser

    args = build_parser().parse_args(
        ["simulate", "--out", str(tmp_path / "x"), "--algorithm", "fedyogi", "--fedopt-lr", "0.03"]
    )
    settings = simulation_settings_from(_simulate_options(args))
    assert settings.reference.algorithm == "fedyogi"
    assert settings.reference.fedopt_lr == 0.03
    from spherecal.config import load_coordinator_config
    from spherecal.simulate import Simulation

    written = Simulation(settings).coordinator_config("127.0.0.1:0")
    coordinator, _ = load_coordinator_config(written)
    assert coordinator.training.algorithm == "fedyogi"
    assert coordinator.training.fedopt_lr == 0.03


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--drop", "p9:share"], "not one of"),
        (["--drop", "p1:share@ccvr", "--calibration", "ffc"], "no ccvr statistics job"),
        (["--drop", "p1:share@ffc"], "FFC derives from CCVR"),
        (["--drop", "p1:masked", "--no-secure"], "secure aggregation is off"),
        (["--drop", "p1:train@r9"], "only 2 rounds"),
        (["--drop", "p1:nap"], "unknown halt stage"),
        (["--participants", "1"], "at least 2"),
        (["--calibration", "ffc,oracle"], "--calibration takes a comma list of ffc, ccvr"),
    ],
)
def test_simulate_refuses_impossible_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    base = ["simulate", "--out", str(tmp_path / "x"), "--participants", "3", "--rounds", "2"]
    try:
        code = main([*base, *extra])
    except SystemExit as exc:  # refused by the parser itself (usage error)
        code = int(exc.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_insecure_is_refused_off_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[federation]\nparticipants = ["a", "b", "c"]\n[model]\nextractor = "mlp"\n'
        '[server]\nlisten = "0.0.0.0:0"\ninsecure = true\n'
    )
    assert main(["coordinator", "--config", str(config)]) == 2
    assert "only allowed on loopback" in capsys.readouterr().err
    participant = tmp_path / "p.toml"
    participant.write_text(
        '[participant]\nid = "a"\ncoordinator = "10.1.2.3:50051"\ninsecure = true\n'
    )
    assert main(["participant", "--config", str(participant)]) == 2
    assert "only allowed for a loopback" in capsys.readouterr().err
