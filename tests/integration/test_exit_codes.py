"""Every exit status documented in docs/cli.md is reachable (issue #26): each row of
the table has a real ``spherecal`` process here that ends with it, and every status
a scenario produces is in the table."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]


def documented_codes() -> set[int]:
    text = (REPO / "docs" / "cli.md").read_text()
    table = text.split("## Exit statuses", 1)[1].split("\n## ", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A process started from a shell's background job inherits SIGINT ignored, and Python
# then keeps ignoring it (no KeyboardInterrupt): the Ctrl-C row would hang on a harness
# launched that way. Each spherecal process here starts with Ctrl-C as in a terminal.
_AS_IN_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('spherecal.cli', run_name='__main__', alter_sys=True)"
)


def _spawn(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _AS_IN_A_TERMINAL, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _participant_config(directory: Path, give_up_s: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "p0.toml"
    config.write_text(
        "[participant]\n"
        'id = "p0"\n'
        f'coordinator = "127.0.0.1:{_closed_port()}"\n'
        "insecure = true\n"
        "reconnect_max_s = 0.2\n"
        f"give_up_s = {give_up_s}\n"
        "rpc_timeout_s = 2.0\n"
    )
    return config


def _signalled(proc: subprocess.Popen[str], signum: int) -> tuple[int, str]:
    """Wait until the participant is inside its reconnect loop, send ``signum``,
    return (status, remaining stderr). Every back-off wait logs "reconnect attempt";
    "cannot reach the coordinator" comes only when the first failure is a failed
    connect — a participant that joined before the coordinator ended (a quick box)
    logs the lost coordinator instead, and waiting for that line alone hung."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "reconnect attempt" in line:
            break
    else:
        raise AssertionError(f"participant ended early: {''.join(seen)}")
    proc.send_signal(signum)
    rest = proc.stderr.read()
    return proc.wait(timeout=120), rest


def test_every_documented_exit_status_is_reachable(tmp_path: Path) -> None:
    coordinator = tmp_path / "coordinator.toml"
    coordinator.write_text(
        '[federation]\nparticipants = ["p0", "p1", "p2"]\n[model]\nextractor = "mlp"\n'
        "[training]\nrounds = 1\nmin_participants = 2\n"
        '[server]\nlisten = "127.0.0.1:0"\ninsecure = true\n'
        "[timeouts]\njoin_s = 0.5\nlinger_s = 0\n"
    )
    closed = f"127.0.0.1:{_closed_port()}"
    # the slow ones start together (each imports torch)
    failing = _spawn(["coordinator", "--config", str(coordinator)], tmp_path)
    give_up = _spawn(
        ["participant", "--config", str(_participant_config(tmp_path / "a", 1.0))], tmp_path
    )
    terminated = _spawn(
        ["participant", "--config", str(_participant_config(tmp_path / "b", 600.0))], tmp_path
    )
    interrupted = _spawn(
        ["participant", "--config", str(_participant_config(tmp_path / "c", 600.0))], tmp_path
    )
    try:
        outcomes: dict[int, str] = {}

        def quick(args: list[str]) -> tuple[int, str]:
            proc = _spawn(args, tmp_path)
            _, err = proc.communicate(timeout=120)
            return proc.returncode, err

        def into_closed_pipe(args: list[str]) -> tuple[int, str]:
            """``args`` writing into a pipe whose reader is already gone (``| head``
            after it stopped reading)."""
            read, write = os.pipe()
            os.close(read)
            proc = subprocess.Popen(
                [sys.executable, "-c", _AS_IN_A_TERMINAL, *args],
                cwd=tmp_path,
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            os.close(write)
            _, err = proc.communicate(timeout=120)
            return proc.returncode, err

        scenarios: list[tuple[int, Callable[[], tuple[int, str]], str]] = [
            (0, lambda: quick(["certs", "init", str(tmp_path / "ca")]), ""),
            (141, lambda: into_closed_pipe(["certs", "init", str(tmp_path / "ca2")]), ""),
            (2, lambda: quick(["status"]), "give --config"),
            (4, lambda: quick(["status", "--address", closed, "--insecure"]), "UNAVAILABLE"),
            (143, lambda: _signalled(terminated, signal.SIGTERM), "terminated by SIGTERM"),
            (130, lambda: _signalled(interrupted, signal.SIGINT), "interrupted"),
            (3, lambda: (give_up.wait(timeout=300), give_up.communicate()[1]), "gave up"),
            (1, lambda: (failing.wait(timeout=300), failing.communicate()[1]), "FAILED"),
        ]
        for expected, run, needle in scenarios:
            code, err = run()
            assert code == expected, (expected, err[-2000:])
            assert needle in err, (expected, err[-2000:])
            outcomes[code] = err
        # the one-line contract: a signal or unreachable coordinator is one line
        assert (
            outcomes[143].strip().splitlines()[-1] == "spherecal participant: terminated by SIGTERM"
        )
        assert len(outcomes[4].strip().splitlines()) == 1
        assert outcomes[141] == ""  # silent, as a process SIGPIPE ended
        assert outcomes[4].startswith("spherecal status: error: coordinator at ")
        assert set(outcomes) == documented_codes()
    finally:
        for proc in (failing, give_up, terminated, interrupted):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_table_is_read() -> None:
    assert {0, 1, 2, 3, 4, 130, 141, 143} <= documented_codes()
