"""The ``spherecal`` CLI: argument validation and the reference command's JSON."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spherecal.cli.app import build_parser, main

REPO = Path(__file__).resolve().parents[3]


def test_reference_writes_json_with_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "out.json"
    code = main(
        [
            "reference",
            "--participants",
            "3",
            "--rounds",
            "1",
            "--local-epochs",
            "1",
            "--model",
            "mlp",
            "--alpha",
            "iid",
            "--calibration",
            "ffc,ccvr,qda",
            "--shrinkage-grid",
            "0.1",
            "0.5",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["accuracy"]) == {"none", "ffc", "ccvr", "qda", "oracle"}
    assert result["calibration"]["qda"]["chosen"] in (0.1, 0.5)
    assert result["settings"]["shrinkage_grid"] == [0.1, 0.5]
    assert result["settings"]["partition"] == "iid"
    assert result["settings"]["loss"] == "mse"  # sphere head defaults to MSE
    printed = json.loads(capsys.readouterr().out)
    assert printed["accuracy"] == result["accuracy"]


def test_learnable_head_defaults_to_ce_and_shards_select_partition() -> None:
    from spherecal.cli.reference import reference_config as _reference_config

    args = build_parser().parse_args(["reference", "--head", "learnable", "--shards", "2"])
    cfg = _reference_config(args)
    assert cfg.loss == "ce" and cfg.partition == "shards" and cfg.shards_per_client == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["reference", "--alpha", "-1"],
        ["reference", "--alpha", "lots"],
        ["reference", "--lr", "0"],
        ["reference", "--head", "nope"],
    ],
)
def test_bad_arguments_exit_2_with_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_runtime_errors_are_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["reference", "--dataset", "npz", "--data-root", "/nonexistent.npz", "--quiet"])
    assert code == 2
    assert "spherecal reference: error" in capsys.readouterr().err


def test_console_script_entry_point_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "spherecal.cli", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0 and "reference" in out.stdout


def test_python_dash_m_spherecal_is_the_command(tmp_path: Path) -> None:
    """``python -m spherecal ARGS`` runs the ``spherecal`` command (there was no
    ``spherecal/__main__.py``: "'spherecal' is a package and cannot be directly
    executed"): the same help, and a command's error and exit status."""
    python_m = [sys.executable, "-m", "spherecal"]
    done = subprocess.run(
        [*python_m, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: spherecal ")
    entry = subprocess.run(
        [sys.executable, "-m", "spherecal.cli", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout == entry.stdout
    refused = subprocess.run(
        [*python_m, "certs", "init", str(tmp_path / "ca"), "--days", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("spherecal certs: error: --days 0: "), refused.stderr


def test_sigusr1_writes_every_threads_stack_and_the_process_goes_on() -> None:
    """``spherecal coordinator`` / ``participant`` register SIGUSR1 with faulthandler
    (docs/deployment.md): a stuck run can be looked into without stopping it."""
    code = (
        "import os, signal, threading, time\n"
        "from spherecal.cli.coordinator import enable_faulthandler as _enable_faulthandler\n"
        "_enable_faulthandler()\n"
        "def parked_in_a_named_function():\n"
        "    time.sleep(30)\n"
        "threading.Thread(target=parked_in_a_named_function, daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "time.sleep(0.2)\n"
        "print('still running')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running"
    assert "parked_in_a_named_function" in done.stderr  # the other thread's stack too
    assert "most recent call first" in done.stderr


def test_help_lists_every_command_without_loading_torch_numpy_or_grpc() -> None:
    """``spherecal --help`` builds one-line stubs only (``spherecal.cli.app``): which
    modules it loads is checked here, never how long it takes."""
    code = (
        "import sys, json, contextlib, io\n"
        "from spherecal.cli.app import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "print(json.dumps({'help': out.getvalue(), 'modules': sorted(sys.modules)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    heavy = {"torch", "numpy", "grpc", "google.protobuf", "sklearn", "scipy"}
    assert not heavy & set(seen["modules"]), sorted(heavy & set(seen["modules"]))
    ours = {m for m in seen["modules"] if m.startswith("spherecal")}
    allowed = {"spherecal", "spherecal.argtypes", "spherecal.cli"}
    assert {m for m in ours if not m.startswith("spherecal.cli.")} <= allowed, sorted(ours)
    from spherecal.cli.app import COMMANDS

    for command in COMMANDS:
        assert command.NAME in seen["help"] and command.HELP.split()[0] in seen["help"]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_a_command_help_builds_only_that_command() -> None:
    from spherecal.cli.app import COMMANDS

    parser = build_parser(only="certs")
    choices = _commands(parser)
    assert set(choices) == {c.NAME for c in COMMANDS}
    assert any(a.dest == "certs_command" for a in choices["certs"]._actions)
    assert [a.dest for a in choices["simulate"]._actions] == ["help"]  # a stub


def test_exit_codes_match_the_table_in_docs_cli() -> None:
    """docs/cli.md's "Exit statuses" table and :class:`ExitCode` name the same codes."""
    import re

    from spherecal.cli.exit_codes import ExitCode

    text = (REPO / "docs" / "cli.md").read_text()
    section = text.split("## Exit statuses", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.MULTILINE)}
    assert documented == {int(code) for code in ExitCode}
    for code in ExitCode:  # every member says in its row what it is called
        row = next(r for r in section.splitlines() if r.startswith(f"| {int(code)} |"))
        assert f"`{code.name}`" in row, (code, row)


def test_simulate_defaults_come_from_the_settings_dataclasses() -> None:
    from spherecal.cli.simulate import _simulate_options, simulate_defaults
    from spherecal.simulate.settings import SimulationSettings
    from spherecal.spherefed.reference import ReferenceConfig

    parser = build_parser(only="simulate")
    args = parser.parse_args(["simulate", "--out", "x"])
    options = _simulate_options(args)
    s = SimulationSettings(reference=ReferenceConfig(), out=Path("x"))
    assert options == {**simulate_defaults(), "out": Path("x")}
    assert options["rounds"] == s.reference.rounds and options["delta"] == s.delta
    assert options["calibration"] == ",".join(s.calibration)
    shown = _commands(parser)["simulate"].format_help()
    assert f"(default {s.reference.rounds})" in " ".join(shown.split())


def test_the_daemon_runs_only_the_service_commands() -> None:
    from spherecal.daemon import build_parser as daemon_parser

    parser = daemon_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", "--out", "x"])
    args = parser.parse_args(["coordinator", "--config", "c.toml"])
    assert args.run.__module__ == "spherecal.cli.coordinator"


@pytest.mark.parametrize(
    ("written", "step"),
    [
        ("2^-16", 2.0**-16),
        ("2**-17", 2.0**-17),
        (" 2 ^ -10 ", 2.0**-10),
        ("1.52587890625e-05", 2.0**-16),
        ("0", 0.0),
        (0, 0.0),
        (3e-5, 3e-5),
    ],
)
def test_a_step_is_a_number_or_a_power_of_two(written: object, step: float) -> None:
    from spherecal.cli.simulate import parse_step

    assert parse_step(written) == step


@pytest.mark.parametrize(
    "written", ["3^-16", "2^x", "2^", "-1", "-2^-3", "nan", "inf", "2^5000", "2^-5000", True, "x"]
)
def test_a_step_that_is_not_one_is_refused_by_name(written: object) -> None:
    from spherecal.cli.simulate import parse_step

    with pytest.raises(ValueError, match="update_resolution"):
        parse_step(written, "update_resolution")


def test_update_resolution_written_as_a_power_of_two_reaches_the_settings(tmp_path: Path) -> None:
    """The docs write ``--update-resolution 2^-16``; it must mean 2^-16 from the
    command line and from a ``[simulate]`` table; a bad one is refused naming it."""
    from spherecal.cli.simulate import _simulate_options, simulation_settings_from

    parser = build_parser(only="simulate")
    args = parser.parse_args(["simulate", "--update-resolution", "2^-16", "--out", str(tmp_path)])
    settings = simulation_settings_from(_simulate_options(args))
    assert settings.update_resolution == 2.0**-16
    config = tmp_path / "sim.toml"
    config.write_text('[simulate]\nupdate_resolution = "2^-12"\nout = "o"\n')
    args = parser.parse_args(["simulate", "--config", str(config)])
    assert simulation_settings_from(_simulate_options(args)).update_resolution == 2.0**-12
    config.write_text('[simulate]\nupdate_resolution = "2^-x"\nout = "o"\n')
    with pytest.raises(ValueError, match="update_resolution"):
        simulation_settings_from(
            _simulate_options(parser.parse_args(["simulate", "--config", str(config)]))
        )


def test_the_example_count_noise_reaches_the_coordinator_and_every_site(tmp_path: Path) -> None:
    from spherecal.cli.simulate import _simulate_options, simulation_settings_from
    from spherecal.simulate.configs import coordinator_settings, participant_settings

    parser = build_parser(only="simulate")
    for argv, sd in (
        ([], 4),
        (["--example-count-noise-sd", "0"], 0),
        (["--example-count-noise-sd", "9"], 9),
    ):
        args = parser.parse_args(["simulate", *argv, "--participants", "3", "--out", str(tmp_path)])
        settings = simulation_settings_from(_simulate_options(args))
        assert settings.example_count_noise_sd == sd
        coordinator = coordinator_settings(settings, (10, 1, (8, 8)), tmp_path, "127.0.0.1:0")
        assert coordinator.example_count_noise_sd == sd
        for k in range(3):
            site = participant_settings(settings, k, 1, tmp_path)
            assert site.policy.example_count_noise_sd == sd
    with pytest.raises(ValueError, match="--example-count-noise-sd"):
        simulation_settings_from(
            _simulate_options(
                parser.parse_args(
                    ["simulate", "--example-count-noise-sd", "-1", "--out", str(tmp_path)]
                )
            )
        )


def test_a_bad_update_resolution_exits_2_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--update-resolution", "3^-16", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert "--update-resolution" in capsys.readouterr().err


def test_every_command_and_option_is_documented() -> None:
    """Every command has a row in docs/cli.md's command table, and every option of its
    ``--help`` is named in docs/cli.md or in a page that row links (``--listen``,
    ``--coordinator``, ``--days``, ``--server-name`` and the DP-SGD flags of
    ``simulate`` were in ``--help`` only)."""
    import re

    text = (REPO / "docs" / "cli.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    pages: dict[str, set[str]] = {}
    for row in table.splitlines():
        found = re.match(r"^\| `spherecal (\w+)", row)
        if found:
            links = re.findall(r"\]\(([\w.]+\.md)(?:#[^)]*)?\)", row)
            pages.setdefault(found.group(1), set()).update(links)
    commands = _commands(build_parser())
    assert set(pages) == set(commands), "a command without a row in docs/cli.md"
    missing = []

    def walk(name: str, parser: argparse.ArgumentParser, docs: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(f"{name} {sub}", child, docs)
            elif action.help != argparse.SUPPRESS:
                for option in action.option_strings:
                    pattern = re.escape(option) + r"(?![\w-])"
                    if option not in ("-h", "--help") and not re.search(pattern, docs):
                        missing.append(f"{name} {option}")

    for name, parser in commands.items():
        docs = text + "".join((REPO / "docs" / page).read_text() for page in pages[name])
        walk(name, parser, docs)
    assert not missing, f"options in --help but in no page: {missing}"
